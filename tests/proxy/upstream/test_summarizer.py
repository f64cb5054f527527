"""proxy.upstream.summarizer against a scripted upstream on loopback."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from compaction import Prices, SummarizationError
from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.dialects.responses import RESPONSES
from proxy.upstream.summarizer import UpstreamSummarizer
from proxy.upstream.transport import Transport
from proxy.upstream.usage import Usage
from tests.proxy.raw_servers import read_request, serve_script

#: (status, body) the scripted upstream answers.
Reply = tuple[int, bytes]


def _json(status: int, payload: Any) -> Reply:
    return status, json.dumps(payload).encode()


def _reply(content: Any = "## Goal\nx", **message: Any) -> Reply:
    return _json(
        200, {"choices": [{"message": {"role": "assistant", "content": content, **message}}]}
    )


def _summarize(
    handler: Any, dialect: Dialect = CHAT, **options: Any
) -> tuple[str, list[dict[str, Any]]]:
    """Summarize once, in ``dialect``'s API, against an upstream answering
    ``handler(body, n)``; ``options`` go to the summarizer (``keep``, a list,
    is given the summarizer itself)."""
    kept: list[UpstreamSummarizer] = options.pop("keep", [])
    seen: list[dict[str, Any]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(await request.json())
        status, body = handler(seen[-1], len(seen))
        return web.Response(status=status, body=body, content_type="application/json")

    async def run() -> str:
        app = web.Application()
        app.router.add_post("/v1" + dialect.path, answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        transport = Transport(
            connect_timeout=5, read_timeout=30, max_connections=4, keepalive_expiry=4
        )
        try:
            summarizer = UpstreamSummarizer(
                transport,
                f"http://127.0.0.1:{port}/v1",
                "m",
                {"authorization": "k"},
                dialect=dialect,
                **options,
            )
            kept.append(summarizer)
            return await summarizer([{"role": "user", "content": "x"}], 600)
        finally:
            await transport.aclose()
            await runner.cleanup()

    return asyncio.run(run()), seen


def test_request_shape_and_reply() -> None:
    text, seen = _summarize(lambda request, n: _reply())
    assert text == "## Goal\nx"
    assert seen == [
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "temperature": 0,
            "max_tokens": 600,
            "stream": False,
        }
    ]


def test_reasoning_models_are_asked_again_with_max_completion_tokens() -> None:
    refusal = _json(
        400,
        {
            "error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                "type": "invalid_request_error",
            }
        },
    )
    text, seen = _summarize(lambda request, n: refusal if n == 1 else _reply())
    assert text == "## Goal\nx"
    assert "max_tokens" not in seen[1] and "temperature" not in seen[1]
    assert seen[1]["max_completion_tokens"] == 600


_REFUSAL = _json(
    400,
    {
        "error": {
            "message": "Unsupported parameter: 'max_tokens'. Use 'max_completion_tokens' instead.",
            "type": "invalid_request_error",
        }
    },
)


def test_a_reasoning_model_is_asked_again_once_and_its_second_refusal_is_the_answer() -> None:
    seen: list[dict[str, Any]] = []

    def refuse(request: dict[str, Any], n: int) -> Reply:
        seen.append(request)
        return _REFUSAL

    with pytest.raises(SummarizationError, match="400"):
        _summarize(refuse)
    assert [("max_tokens" in r, "max_completion_tokens" in r) for r in seen] == [
        (True, False),
        (False, True),
    ]


@pytest.mark.parametrize("dialect", [ANTHROPIC, RESPONSES], ids=["anthropic", "responses"])
def test_the_other_apis_are_asked_once_whatever_the_refusal_says(dialect: Dialect) -> None:
    seen: list[dict[str, Any]] = []

    def refuse(request: dict[str, Any], n: int) -> Reply:
        seen.append(request)
        return _REFUSAL

    with pytest.raises(SummarizationError, match="400"):
        _summarize(refuse, dialect)
    assert seen == [dialect.summary_request("m", [{"role": "user", "content": "x"}], 600)]


@pytest.mark.parametrize(
    "response",
    [
        (500, b"boom"),
        (200, b"not json"),
        _json(200, {"choices": []}),
        _reply(content=""),
        _reply(content=None, tool_calls=[{"id": "c", "type": "function"}]),
    ],
)
def test_unusable_answers_are_summarization_errors(response: Reply) -> None:
    with pytest.raises(SummarizationError):
        _summarize(lambda request, n: response)


@pytest.mark.parametrize(
    ("dialect", "usage", "spent"),
    [
        pytest.param(
            CHAT,
            {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500},
            Usage(prompt=1200, cache_write=1200, output=300),
            id="chat",
        ),
        pytest.param(
            CHAT,
            {
                "prompt_tokens": 1200,
                "completion_tokens": 300,
                "prompt_tokens_details": {"cached_tokens": 1000},
            },
            Usage(prompt=1200, cache_read=1000, cache_write=200, output=300),
            id="chat-cached",
        ),
        pytest.param(
            RESPONSES,
            {
                "input_tokens": 900,
                "output_tokens": 250,
                "input_tokens_details": {"cached_tokens": 0},
            },
            Usage(prompt=900, cache_write=900, output=250),
            id="responses",
        ),
        pytest.param(
            ANTHROPIC,
            {
                "input_tokens": 40,
                "cache_read_input_tokens": 800,
                "cache_creation_input_tokens": 60,
                "output_tokens": 250,
            },
            Usage(prompt=900, cache_read=800, cache_write=60, output=250),
            id="anthropic",
        ),
    ],
)
def test_what_a_summary_used_is_read_from_its_usage_and_priced(
    dialect: Dialect, usage: dict[str, Any], spent: Usage
) -> None:
    kept: list[UpstreamSummarizer] = []
    told: list[tuple[Usage, float]] = []
    prices = Prices(cache_read=0.1, cache_write=1.25, output=5.0, input_per_mtok=2.0)
    _summarize(
        lambda request, n: _json(200, {**_ANSWERS[dialect.name], "usage": usage}),
        dialect,
        keep=kept,
        prices=prices,
        on_spent=lambda used, cost: told.append((used, cost)),
    )
    (summarizer,) = kept
    cost = spent.uncached + 0.1 * spent.cache_read + 1.25 * spent.cache_write + 5.0 * spent.output
    assert summarizer.spent == spent
    assert summarizer.tokens == spent.prompt + spent.output
    assert told == [(spent, pytest.approx(cost))]
    assert summarizer.paid.dollars == pytest.approx(cost * 2.0 / 1_000_000)


def test_a_summary_whose_answer_reports_no_usage_is_counted_by_the_estimate() -> None:
    kept: list[UpstreamSummarizer] = []
    asked: list[tuple[list[dict[str, Any]], str]] = []

    async def estimate(messages: list[dict[str, Any]], text: str) -> Usage:
        asked.append((messages, text))
        return Usage(prompt=70, output=9)

    _summarize(lambda request, n: _reply(), keep=kept, estimate=estimate)
    assert asked == [([{"role": "user", "content": "x"}], "## Goal\nx")]
    assert kept[0].spent == Usage(prompt=70, output=9)


def test_a_reply_that_is_no_summary_was_paid_for_all_the_same() -> None:
    kept: list[UpstreamSummarizer] = []
    answer = {"choices": [{"message": {"role": "assistant", "content": ""}}]}
    usage = {"prompt_tokens": 500, "completion_tokens": 1}
    with pytest.raises(SummarizationError):
        _summarize(lambda request, n: _json(200, {**answer, "usage": usage}), keep=kept)
    assert kept[0].spent == Usage(prompt=500, cache_write=500, output=1)


_ANSWERS: dict[str, dict[str, Any]] = {
    "chat": {"choices": [{"message": {"role": "assistant", "content": "## Goal\nx"}}]},
    "anthropic": {"type": "message", "content": [{"type": "text", "text": "## Goal\nx"}]},
    "responses": {
        "status": "completed",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "## Goal\nx"}],
            }
        ],
    },
}


_CHAT_CUT = {"choices": [{"message": {"role": "assistant", "content": "## Goal\nx"}}]}
_MESSAGE = {"type": "message", "content": [{"type": "text", "text": "## Goal\nx"}]}
_RESPONSE_TEXT = [
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "## Goal\nx"}],
    }
]


def _finished(choice: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{**_CHAT_CUT["choices"][0], **choice}]}


@pytest.mark.parametrize(
    ("dialect", "payload"),
    [
        pytest.param(CHAT, _finished({"finish_reason": "length"}), id="chat"),
        pytest.param(ANTHROPIC, {**_MESSAGE, "stop_reason": "max_tokens"}, id="anthropic"),
        pytest.param(
            RESPONSES,
            {
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "output": _RESPONSE_TEXT,
            },
            id="responses",
        ),
        pytest.param(
            RESPONSES, {"status": "incomplete", "output": _RESPONSE_TEXT}, id="responses-no-details"
        ),
    ],
)
def test_a_summary_cut_off_at_the_output_limit_is_refused(
    dialect: Dialect, payload: dict[str, Any]
) -> None:
    with pytest.raises(SummarizationError, match="summary cut off at the output limit"):
        _summarize(lambda request, n: _json(200, payload), dialect)


@pytest.mark.parametrize(
    ("dialect", "payload"),
    [
        pytest.param(CHAT, _finished({"finish_reason": "stop"}), id="chat"),
        pytest.param(CHAT, _finished({}), id="chat-no-reason"),
        pytest.param(ANTHROPIC, {**_MESSAGE, "stop_reason": "end_turn"}, id="anthropic"),
        pytest.param(RESPONSES, {"status": "completed", "output": _RESPONSE_TEXT}, id="responses"),
        pytest.param(
            RESPONSES,
            {
                "status": "incomplete",
                "incomplete_details": {"reason": "content_filter"},
                "output": _RESPONSE_TEXT,
            },
            id="responses-filtered",
        ),
    ],
)
def test_a_summary_that_ended_on_its_own_is_used(dialect: Dialect, payload: dict[str, Any]) -> None:
    text, _ = _summarize(lambda request, n: _json(200, payload), dialect)
    assert text == "## Goal\nx"


def test_a_summary_trickled_a_byte_at_a_time_ends_at_the_deadline() -> None:
    """Each byte arrives well within the read timeout; the whole call still ends."""

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n")
        while True:
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    async def run(url: str) -> str:
        transport = Transport(
            connect_timeout=5, read_timeout=30, max_connections=1, keepalive_expiry=4
        )
        try:
            summarizer = UpstreamSummarizer(transport, url + "/v1", "m", deadline=0.3)
            return await summarizer([{"role": "user", "content": "x"}], 600)
        finally:
            await transport.aclose()

    timed_out = r"timed out: no whole reply within 0.3 s"
    with serve_script(trickle) as url, pytest.raises(SummarizationError, match=timed_out):
        asyncio.run(run(url))
