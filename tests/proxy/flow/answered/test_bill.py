"""proxy.flow.answered.bill through the app: a scripted session's usage, priced, reaches
/metrics, the log line, the response headers and the dashboard's figures.

The expected figures are worked out here from the usage the scripted
upstream reported and the prices the settings name, never by asking the code
under test.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from compaction import Prices, Profile
from config import ModelConfig
from proxy.flow.answered.bill import untouched_bill
from proxy.flow.read import Call
from proxy.state.logs import REQUESTS
from proxy.upstream.usage import Usage
from tests.proxy.dialects.anthropic.upstream import is_summary_request
from tests.proxy.inprocess import (
    Asked,
    InProcessProxy,
    RecordingTransport,
    json_reply,
    running,
    settings_for,
    sse_reply,
)

MODEL = "claude-test"
#: Anthropic's prices (multiples of the input price) and a dollar price.
READ, WRITE, OUTPUT, PER_MTOK = 0.1, 1.25, 5.0, 3.0
SETTINGS = {
    "models": {
        MODEL: {
            "context_window": 6_000,
            "pricing": "anthropic",
            "input_price_per_mtok": PER_MTOK,
            "precompute_share": 0,  # no summary prepared in the background
            "recall": False,
            # Summaries by another model: their usage teaches nothing of how this
            # one counts, so the estimates below are the requests' own.
            "summary_model": "summary-model",
        }
    }
}


def _usage(input: int, read: int, write: int, output: int) -> dict[str, int]:
    return {
        "input_tokens": input,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write,
        "output_tokens": output,
    }


def _message(usage: dict[str, int], text: str = "ok") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"


def _stream(start: dict[str, int], output: int) -> Any:
    """An Anthropic stream: the prompt's counts in message_start, the output's in message_delta."""
    message = {**_message(start), "content": [], "stop_reason": None}
    return sse_reply(
        _event("message_start", {"message": message}),
        _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "ok"}}),
        _event("content_block_stop", {"index": 0}),
        _event(
            "message_delta",
            {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output}},
        ),
        _event("message_stop", {}),
        done=False,
    )


def _summary_asked(asked: Asked) -> bool:
    return is_summary_request(asked.json())


def _not_summary(asked: Asked) -> bool:
    return not _summary_asked(asked)


def _cost(input: int, read: int, write: int, output: int) -> float:
    return input + READ * read + WRITE * write + OUTPUT * output


def _without(client: int, previous: int, output: int) -> float:
    """The client's request sent as it came: the previous one's size read from
    the cache, the rest written, the same output."""
    cached = min(previous, client)
    return READ * cached + WRITE * (client - cached) + OUTPUT * output


def _turns(pairs: int, seed: int = 5) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "omega", "sigma", "theta"]
    messages: list[dict[str, Any]] = []
    for i in range(pairs):
        text = " ".join(rng.choice(words) for _ in range(120))
        messages.append({"role": "user", "content": f"Step {i}: {text}"})
        messages.append({"role": "assistant", "content": f"Noted step {i}: {text}"})
    return messages


def _post(proxy: InProcessProxy, messages: list[dict[str, Any]], *, stream: bool = False) -> Any:
    body = {"model": MODEL, "max_tokens": 256, "messages": messages, "stream": stream}
    response = proxy.http.post(
        "/v1/messages",
        json=body,
        headers={"anthropic-version": "2023-06-01"},
    )
    assert response.status_code == 200, response.text
    return response


def _samples(exposition: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _session_figures(proxy: InProcessProxy, requests: int) -> dict[str, Any]:
    """The dashboard's JSON for the one session, once its figures are written
    (the recorder writes them in batches, about a second apart)."""
    deadline = time.monotonic() + 15
    while True:
        listed = proxy.http.get("/v1/compaction/sessions").json()["data"]
        if (listed and listed[0]["requests"] >= requests) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    (session,) = listed
    found: dict[str, Any] = proxy.http.get(f"/v1/compaction/sessions/{session['session']}").json()
    return found


def test_a_scripted_sessions_usage_and_prices_add_up_in_metrics_logs_and_the_dashboard(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=REQUESTS)
    transport = RecordingTransport()
    # Each request's answer, in order; every summary call gets the same answer.
    answers = [
        _usage(20, 0, 400, 30),  # 1: forwarded as sent, a whole answer
        _usage(10, 400, 50, 1),  # 2: forwarded as sent, streamed (output 25 at the end)
        _usage(5, 0, 300, 40),  # 3: compacted, with a summary
        _usage(5, 300, 20, 10),  # 4: forwarded over that compaction
    ]
    summary = _usage(900, 0, 0, 120)
    transport.script(json_reply(_message(answers[0])), when=_not_summary)
    transport.script(_stream(answers[1], output=25), when=_not_summary)
    transport.script(json_reply(_message(answers[2])), when=_not_summary)
    transport.script(json_reply(_message(answers[3])), when=_not_summary)
    summary_text = "## Goal\nKeep going.\n\n## Progress\nSteps noted."
    for _ in range(8):
        transport.script(json_reply(_message(summary, summary_text)), when=_summary_asked)
    answers[1] = _usage(10, 400, 50, 25)  # as the stream ends up reporting it

    history = _turns(2)
    long = _turns(40)
    with running(settings_for(**SETTINGS), transport) as proxy:
        first = _post(proxy, history[:1])
        second = _post(proxy, history[:3], stream=True)
        third = _post(proxy, [*long, {"role": "user", "content": "And now?"}])
        fourth = _post(
            proxy,
            [
                *long,
                {"role": "user", "content": "And now?"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "Next."},
            ],
        )
        figures = _session_figures(proxy, requests=4)
        metrics = _samples(proxy.http.get("/metrics").text)
        page = proxy.http.get(f"/ui/sessions/{figures['session']}").text

    assert [r.headers["x-compaction-stage"] for r in (first, second, third, fourth)] == [
        "none",
        "none",
        "condensed",
        "reused",
    ]
    summaries = sum(1 for asked in transport.requests if _summary_asked(asked))
    assert summaries >= 1
    assert "x-compaction-summarizer-tokens" not in first.headers
    assert third.headers["x-compaction-summarizer-tokens"] == str(summaries * 1020)
    summarizer_cost = summaries * _cost(*summary.values())
    assert float(third.headers["x-compaction-summarizer-cost"]) == pytest.approx(
        summarizer_cost, abs=0.05
    )

    costs = [_cost(*usage.values()) for usage in answers]
    before = [int(r.headers["x-compaction-tokens-before"]) for r in (first, second, third, fourth)]
    # Forwarded as sent: what it cost. Compacted: the client's request priced
    # as a read of the previous one's size and a write of the rest.
    withouts = [
        costs[0],
        costs[1],
        _without(before[2], before[1], answers[2]["output_tokens"]),
        _without(before[3], before[2], answers[3]["output_tokens"]),
    ]
    total_cost = sum(costs) + summarizer_cost
    total_without = sum(withouts)

    def metric(name: str, **labels: str) -> float:
        return metrics[(name, tuple(sorted(labels.items())))]

    model = {"model": MODEL}
    assert metric("compaction_proxy_prompt_tokens_total", part="uncached", **model) == 40
    assert metric("compaction_proxy_prompt_tokens_total", part="cache_read", **model) == 700
    assert metric("compaction_proxy_prompt_tokens_total", part="cache_write", **model) == 770
    assert metric("compaction_proxy_output_tokens_total", **model) == 105
    assert metric("compaction_proxy_summarizer_tokens_total", part="prompt") == summaries * 900
    assert metric("compaction_proxy_summarizer_tokens_total", part="output") == summaries * 120
    assert metric("compaction_proxy_cost_total", **model) == pytest.approx(total_cost)
    assert metric("compaction_proxy_cost_without_compaction_total", **model) == pytest.approx(
        total_without
    )
    assert metric("compaction_proxy_cost_dollars_total", **model) == pytest.approx(
        total_cost * PER_MTOK / 1e6
    )

    summary_figures = figures["summary"]
    assert {
        key: summary_figures[key]
        for key in (
            "priced_requests",
            "prompt_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "output_tokens",
            "summarizer_prompt_tokens",
            "summarizer_output_tokens",
        )
    } == {
        "priced_requests": 4,
        "prompt_tokens": 420 + 460 + 305 + 325,
        "cache_read_tokens": 700,
        "cache_write_tokens": 770,
        "output_tokens": 105,
        "summarizer_prompt_tokens": summaries * 900,
        "summarizer_output_tokens": summaries * 120,
    }
    assert summary_figures["cost"] == pytest.approx(total_cost)
    assert summary_figures["cost_without"] == pytest.approx(total_without)
    assert summary_figures["cost_dollars"] == pytest.approx(total_cost * PER_MTOK / 1e6)
    requests = figures["requests"]
    assert [r["cost"] for r in requests] == pytest.approx(
        [costs[0], costs[1], costs[2] + summarizer_cost, costs[3]]
    )
    assert [r["cost_without"] for r in requests] == pytest.approx(withouts)
    # The page shows the same sums (rounded, as it rounds them).
    assert f"{total_cost:,.1f} input tokens" in page
    assert f"{total_without:,.1f} input tokens" in page

    lines = [r for r in caplog.records if r.name == REQUESTS and r.getMessage() == "chat"]
    streamed: dict[str, Any] = lines[1].fields  # type: ignore[attr-defined]
    assert {k: streamed[k] for k in ("prompt_tokens", "cache_read_tokens", "output_tokens")} == {
        "prompt_tokens": 460,
        "cache_read_tokens": 400,
        "output_tokens": 25,
    }
    assert streamed["cost"] == streamed["cost_without_compaction"] == round(costs[1], 1)


def test_a_request_forwarded_as_sent_costs_what_it_would_have_without_compaction() -> None:
    """Chat Completions, streamed with its usage in the last event, and whole."""
    transport = RecordingTransport()
    usage = {
        "prompt_tokens": 1_200,
        "completion_tokens": 80,
        "prompt_tokens_details": {"cached_tokens": 1_024},
    }
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-4o"}
    transport.script(
        sse_reply(
            {**chunk, "choices": [{"index": 0, "delta": {"content": "ok"}}], "usage": None},
            {**chunk, "choices": [], "usage": usage},
        ),
        json_reply({"id": "c", "object": "chat.completion", "choices": [], "usage": usage}),
    )
    messages = [{"role": "user", "content": "hi"}]
    with running(settings_for(models={"gpt-4o": {"pricing": "openai"}}), transport) as proxy:
        for stream in (True, False):
            body: dict[str, Any] = {"model": "gpt-4o", "messages": messages, "stream": stream}
            if stream:
                body["stream_options"] = {"include_usage": True}
            response = proxy.http.post("/v1/chat/completions", json=body)
            assert response.headers["x-compaction-stage"] == "none"
        metrics = _samples(proxy.http.get("/metrics").text)
        figures = _session_figures(proxy, requests=2)

    # OpenAI's preset: the part not read from the cache is written at 1.0.
    cost = 1_024 * 0.1 + (1_200 - 1_024) * 1.0 + 80 * 8.0
    labels = (("model", "gpt-4o"),)
    assert metrics[("compaction_proxy_cost_total", labels)] == pytest.approx(2 * cost)
    assert metrics[("compaction_proxy_cost_without_compaction_total", labels)] == pytest.approx(
        2 * cost
    )
    requests = figures["requests"]
    assert [r["cost"] for r in requests] == pytest.approx([cost, cost])
    assert all(r["cost"] == r["cost_without"] for r in requests)


@pytest.mark.parametrize("per_mtok", [None, PER_MTOK])
def test_a_bill_is_worked_out_in_dollars_only_where_a_dollar_price_is(
    monkeypatch: pytest.MonkeyPatch, per_mtok: float | None
) -> None:
    asked: list[float] = []
    dollars = Prices.dollars

    def counted(prices: Prices, cost: float) -> float | None:
        asked.append(cost)
        return dollars(prices, cost)

    monkeypatch.setattr(Prices, "dollars", counted)
    profile = Profile(pricing="openai", input_price_per_mtok=per_mtok)
    config = ModelConfig("gpt-4o", profile, "http://upstream.test/v1", "gpt-4o", None)
    call = Call(raw=b"", body={}, messages=[], config=config, headers={})
    bill = untouched_bill(call, Usage(prompt=1_000, cache_write=1_000, output=10))

    assert bill.cost == bill.without == 1_000 * 1.0 + 10 * 8.0  # the openai preset
    if per_mtok is None:
        # No preset has a dollar price: most bills have none to work out.
        assert asked == []
        assert bill.cost_dollars is bill.own_dollars is bill.without_dollars is None
        assert "cost_usd" not in bill.fields()
    else:
        in_dollars = bill.cost * per_mtok / 1e6
        assert bill.cost_dollars == bill.own_dollars == bill.without_dollars
        assert bill.cost_dollars == pytest.approx(in_dollars)
        assert bill.fields()["cost_usd"] == round(in_dollars, 6)
