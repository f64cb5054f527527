"""Agent sessions through the proxy in the other two APIs, with the real SDKs.

A client loop (the `openai` SDK's ``responses.create``, the `anthropic` SDK's
``messages.create``) runs a long tool-using session through the proxy against a
scripted upstream of that API which enforces the API's pairing rules and a
context window. The session must compact more than once, with the summary asked
in the request's own API, reused on the next turn, and never an error.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anthropic
import openai
import orjson
import pytest
from openai import OpenAI

from config import load_settings
from tests.proxy.dialects.anthropic.upstream import AnthropicUpstream
from tests.proxy.dialects.responses.upstream import ResponsesUpstream
from tests.proxy.inprocess import UPSTREAM_URL, InProcessProxy, RecordingTransport, running

COMPACTED = ("pruned", "condensed", "truncated")
#: Small windows, so that a session of a few dozen turns compacts several times.
MODEL = "gpt-4o-e2e"
CLAUDE = "claude-e2e"
PROFILE = {
    "context_window": 16_384,
    "reserve_tokens": 2_048,
    "keep_recent_tokens": 3_000,
    "summarizer": "llm",
    "summary_must_pay": False,  # a model asked for every summary
    # Tool outputs are never briefed: the middle must be condensed, by a summary.
    "tool_result_chars": 1_000_000,
}
TOOL_OUTPUT = "\n".join(
    f"line {i}: value={i * 7919 % 10007} status=ok path=src/m{i}.py" for i in range(120)
)


#: Where the proxy is told the Anthropic upstream is (in-process, nothing listens).
CLAUDE_URL = "http://anthropic.test/v1"


@contextmanager
def _proxy(
    openai_upstream: Any = None, claude: Any = None, store: Any = None
) -> Iterator[InProcessProxy]:
    """The proxy in-process in front of the fake upstreams of either API."""
    transport = RecordingTransport(
        app=openai_upstream.app() if openai_upstream is not None else None,
        routes={CLAUDE_URL: claude.app()} if claude is not None else {},
    )
    settings = load_settings(
        None,
        upstream={"base_url": UPSTREAM_URL, "trust_env": False, "anthropic_base_url": CLAUDE_URL},
        store={"url": "memory://"},
        models={MODEL: PROFILE, CLAUDE: PROFILE},
    )
    with running(settings, transport, store=store) as proxy:
        yield proxy


def _openai(proxy: InProcessProxy) -> OpenAI:
    return OpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0, http_client=proxy.http)


def _anthropic(proxy: InProcessProxy) -> anthropic.Anthropic:
    root = proxy.url.removesuffix("/v1")
    return anthropic.Anthropic(
        base_url=root, api_key="sk-ant-test", max_retries=0, http_client=proxy.http
    )


# --- OpenAI Responses ----------------------------------------------------------


def _responses_session(
    stream: bool, window: int = PROFILE["context_window"]
) -> tuple[ResponsesUpstream, list[str], list[str]]:
    upstream = ResponsesUpstream(window=window, tool_turns=40)
    stages: list[str] = []
    reasons: list[str] = []
    with _proxy(upstream) as proxy:
        client = _openai(proxy)
        tools = [
            {
                "type": "function",
                "name": "shell",
                "description": "Run a shell command.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            }
        ]
        items: list[Any] = [{"role": "user", "content": "Find the failing test and fix it."}]
        for _ in range(40):
            request = {
                "model": MODEL,
                "instructions": "You are a coding agent. Use the shell tool.",
                "input": items,
                "tools": tools,
                "store": False,
                "include": ["reasoning.encrypted_content"],
            }
            if stream:
                raw = client.responses.with_raw_response.create(**request, stream=True)
                events = list(raw.parse())
                output = [e.item for e in events if e.type == "response.output_item.done"]
            else:
                raw = client.responses.with_raw_response.create(**request)
                output = list(raw.parse().output)
            stages.append(raw.headers.get("x-compaction-stage", "?"))
            reasons.append(raw.headers.get("x-compaction-reason", "?"))
            calls = [item for item in output if item.type == "function_call"]
            items += [item.model_dump(exclude_none=True) for item in output]
            if not calls:
                break
            items += [
                {"type": "function_call_output", "call_id": call.call_id, "output": TOOL_OUTPUT}
                for call in calls
            ]
    return upstream, stages, reasons


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_long_responses_session_compacts_reuses_and_never_breaks_pairing(stream: bool) -> None:
    upstream, stages, _ = _responses_session(stream)
    assert all(r.status == 200 for r in upstream.received), [
        (r.status, r.body[:200]) for r in upstream.received if r.status != 200
    ]
    compactions = [i for i, stage in enumerate(stages) if stage in COMPACTED]
    assert len(compactions) >= 2, stages
    # The summary was asked in the Responses API, on its path, with no tools.
    assert upstream.summary_requests
    assert all(r.path == "/v1/responses" for r in upstream.summary_requests)
    assert all("tools" not in r.json() for r in upstream.summary_requests)
    # Once compacted, the next turn goes over the stored compaction: no new summary.
    assert "reused" in stages[compactions[0] + 1 :], stages
    assert len(upstream.summary_requests) <= len(compactions) + 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_responses_overflow_is_compacted_and_retried_once(stream: bool) -> None:
    # The upstream's window is a third smaller than the proxy believes: its
    # context_length_exceeded error is what tells the proxy.
    upstream, stages, reasons = _responses_session(stream, window=11_000)
    refused = [r for r in upstream.turn_requests if r.status == 400]
    assert refused, "the upstream never overflowed: the test proves nothing"
    assert "overflow" in reasons, reasons
    # Every refusal was followed by a retry that succeeded: the client saw no error.
    assert len(stages) == len([r for r in upstream.turn_requests if r.status == 200])


# --- Anthropic Messages ----------------------------------------------------------


def _anthropic_session(stream: bool, window: int) -> tuple[AnthropicUpstream, list[str], list[str]]:
    upstream = AnthropicUpstream(window=window, tool_turns=40)
    stages: list[str] = []
    reasons: list[str] = []
    with _proxy(claude=upstream) as proxy:
        client = _anthropic(proxy)
        system = [
            {
                "type": "text",
                "text": "You are a coding agent. Use the Bash tool.",
                "cache_control": {"type": "ephemeral"},
            }
        ]
        tools = [
            {
                "name": "Bash",
                "description": "Run a shell command.",
                "input_schema": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                },
            }
        ]
        messages: list[Any] = [
            {"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]}
        ]
        for _ in range(40):
            request = {
                "model": CLAUDE,
                "max_tokens": 2048,
                "system": system,
                "tools": tools,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "messages": messages,
            }
            if stream:
                with client.messages.stream(**request) as events:
                    message = events.get_final_message()
                    headers = events.response.headers
            else:
                raw = client.messages.with_raw_response.create(**request)
                message, headers = raw.parse(), raw.headers
            stages.append(headers.get("x-compaction-stage", "?"))
            reasons.append(headers.get("x-compaction-reason", "?"))
            content = [block.model_dump(exclude_none=True) for block in message.content]
            messages.append({"role": "assistant", "content": content})
            uses = [block for block in message.content if block.type == "tool_use"]
            if not uses:
                break
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": use.id, "content": TOOL_OUTPUT}
                        for use in uses
                    ],
                }
            )
    return upstream, stages, reasons


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_long_claude_session_compacts_reuses_and_keeps_thinking_and_pairing(
    stream: bool,
) -> None:
    # The upstream refuses a request whose thinking signatures were altered or
    # whose tool_result is not answered right after its tool_use.
    upstream, stages, _ = _anthropic_session(stream, PROFILE["context_window"])
    refused = [(r.status, r.body[:300]) for r in upstream.received if r.status != 200]
    assert not refused, refused
    compactions = [i for i, stage in enumerate(stages) if stage in COMPACTED]
    assert len(compactions) >= 2, stages
    # Asked in the Messages API, at its path, with the client's own key and no tools.
    assert upstream.summary_requests
    assert all(r.path == "/v1/messages" for r in upstream.summary_requests)
    credentials = {
        r.headers.get("x-api-key") or r.headers.get("authorization")
        for r in upstream.summary_requests
    }
    assert credentials <= {"sk-ant-test", "Bearer sk-ant-test"}, credentials
    assert all("anthropic-version" in r.headers for r in upstream.received)
    assert "reused" in stages[compactions[0] + 1 :], stages
    assert len(upstream.summary_requests) <= len(compactions) + 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_claude_overflow_is_compacted_and_retried_once(stream: bool) -> None:
    upstream, stages, reasons = _anthropic_session(stream, window=11_000)
    assert upstream.overflows, "the upstream never overflowed: the test proves nothing"
    assert "overflow" in reasons, reasons
    ok = [r for r in upstream.message_requests if r.status == 200]
    assert len(stages) == len(ok)  # every refusal was retried, and the retry was taken


# --- /compact ---------------------------------------------------------------------


def _history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"Step {i}: read src/m{i}.py. " + TOOL_OUTPUT})
        messages.append({"role": "assistant", "content": f"Read src/m{i}.py; value {i * 31}."})
    return messages


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_compact_is_answered_in_each_api_without_calling_the_model(stream: bool) -> None:
    claude = AnthropicUpstream()
    responses = ResponsesUpstream()
    with _proxy(responses, claude) as proxy:
        a, o = _anthropic(proxy), _openai(proxy)
        command = {"role": "user", "content": "/compact keep the file names"}
        request = {"model": CLAUDE, "max_tokens": 1024, "messages": [*_history(8), command]}
        if stream:
            with a.messages.stream(**request) as events:
                message = events.get_final_message()
        else:
            message = a.messages.create(**request)
        assert message.content[0].type == "text"
        assert message.content[0].text.startswith("Context compacted:")
        items = [*_history(8), command]
        if stream:
            with o.responses.stream(model=MODEL, input=items) as events:
                answer = events.get_final_response()
        else:
            answer = o.responses.create(model=MODEL, input=items)
        assert answer.output_text.startswith("Context compacted:")
    # Neither model was asked to answer: only summaries went upstream.
    assert not claude.message_requests and not responses.turn_requests
    assert claude.summary_requests and responses.summary_requests


def test_anthropic_count_tokens_is_forwarded_and_calibrates_the_proxy() -> None:
    from proxy.state.stores import MemoryStore

    upstream = AnthropicUpstream()
    store = MemoryStore()
    with _proxy(claude=upstream, store=store) as proxy:
        counted = _anthropic(proxy).messages.count_tokens(model=CLAUDE, messages=_history(6))
        learned = _stored_ratio(store, CLAUDE)
    assert counted.input_tokens > 1000  # the upstream's own figure, relayed
    assert [r.path for r in upstream.received] == ["/v1/messages/count_tokens"]
    assert learned is not None and 0.8 <= learned <= 2.0  # learned from that one count


def _stored_ratio(store: Any, model: str) -> float | None:
    """The calibration ratio stored for ``model`` (written in the background)."""
    for _ in range(100):
        calibrations = asyncio.run(store.calibrations())
        found = [ratio for key, ratio in calibrations.items() if key.endswith("\x1f" + model)]
        if found:
            return float(found[0])
        time.sleep(0.02)
    return None


@pytest.mark.parametrize(
    "extra",
    [{"previous_response_id": "resp_earlier"}, {"conversation": "conv_1"}],
    ids=["previous_response_id", "conversation"],
)
def test_a_responses_request_on_server_side_state_goes_upstream_byte_for_byte(
    extra: dict[str, Any],
) -> None:
    upstream = ResponsesUpstream(window=100)  # far too small: a compacting proxy would act
    rest = {**extra, "input": [*_history(6), {"role": "user", "content": "go"}]}
    # Spelled as no serializer would: a rewrite could not give these bytes back.
    raw = b'{"model" :  "' + MODEL.encode() + b'",' + orjson.dumps(rest)[1:]
    with _proxy(upstream) as proxy:
        answer = proxy.http.post(
            proxy.url + "/responses", content=raw, headers={"content-type": "application/json"}
        )
    assert [r.body for r in upstream.received] == [raw]  # the client's own bytes
    assert "x-compaction-stage" not in answer.headers


# --- an output limit that leaves no room ---------------------------------------


def test_an_output_limit_as_large_as_the_window_is_refused_in_the_clients_own_field() -> None:
    """A short request asking for the whole window as output cannot fit however
    small it is: each API's client is told so in its own error shape, naming
    the field it set (not a head above a negative input limit), and nothing
    goes upstream."""
    claude = AnthropicUpstream()
    responses = ResponsesUpstream()
    window = PROFILE["context_window"]
    with _proxy(responses, claude) as proxy:
        hi = [{"role": "user", "content": "hi"}]
        with pytest.raises(anthropic.BadRequestError) as refused:
            _anthropic(proxy).messages.create(model=CLAUDE, max_tokens=window, messages=hi)
        said = refused.value.body["error"]["message"]  # type: ignore[index]
        assert f"{window:,} output tokens (max_tokens) of a {window:,}-token window" in said
        assert re.search(r"-\d", said) is None  # no negative figure
        with pytest.raises(openai.BadRequestError) as answered:
            _openai(proxy).responses.create(model=MODEL, input="hi", max_output_tokens=window)
        assert answered.value.code == "context_length_exceeded"
        assert answered.value.param == "max_output_tokens"
        assert "Lower max_output_tokens." in str(answered.value)
        with pytest.raises(openai.BadRequestError) as chat:
            _openai(proxy).chat.completions.create(
                model=MODEL, messages=hi, max_completion_tokens=window + 1
            )
        assert chat.value.param == "max_completion_tokens"
        assert f"{window + 1:,} output tokens" in str(chat.value)
    assert not claude.message_requests and not responses.turn_requests
