"""The chat path end to end: the real openai SDK → the proxy → a fake upstream.

In-process (``start_app``) unless a test is about the wire: the bytes and
headers a server writes, or the async SDK on its own event loop."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from compaction import SUMMARY_MARKER, TokenCounter, validate_tool_pairing
from tests.proxy.conftest import AppFactory, ProxyFactory
from tests.proxy.inprocess import UPSTREAM_URL
from tests.proxy.servers import FakeUpstream
from tests.synthetic import agent_session

COUNTER = TokenCounter("gpt-4o")
SMALL = {"gpt-4o": {"context_window": 8192}}


def test_small_request_is_forwarded_byte_for_byte(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, _ = fake
    url = start_proxy()
    raw = b'{"model": "gpt-4o",   "messages": [{"role": "user", "content": "hi"}], "x_custom": [1]}'
    response = httpx.post(
        f"{url}/chat/completions",
        content=raw,
        headers={"content-type": "application/json", "authorization": "Bearer k"},
    )
    assert response.status_code == 200
    assert upstream.chat_requests[-1].body == raw
    assert response.headers["x-compaction-stage"] == "none"
    assert upstream.chat_requests[-1].headers["authorization"] == "Bearer k"
    assert len(response.headers.get_list("date")) == 1  # the upstream's is not added to ours
    # A body complete with its headers goes out with its length, not chunked.
    assert response.headers["content-length"] == str(len(response.content))
    assert "transfer-encoding" not in response.headers


def test_sdk_round_trip_with_compaction_over_threshold(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    proxy = start_app(models=SMALL, compaction={"summarizer": "extractive"})
    messages = agent_session(seed=1, steps=120)
    raw = proxy.openai().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, temperature=0.3, extra_body={"x_vendor": {"a": 1}}
    )
    completion = raw.parse()
    assert completion.choices[0].message.content.startswith("I saw")
    assert raw.headers["x-compaction-stage"] in ("condensed", "truncated")
    assert raw.headers["x-compaction-reason"] == "threshold"
    before = int(raw.headers["x-compaction-tokens-before"])
    after = int(raw.headers["x-compaction-tokens-after"])
    assert after < before
    sent = upstream.chat_requests[-1].json()
    assert sent["temperature"] == 0.3 and sent["x_vendor"] == {"a": 1}
    assert validate_tool_pairing(sent["messages"]) == []
    assert sent["messages"][:2] == messages[:2]
    assert sent["messages"][-1] == messages[-1]
    assert COUNTER.count_request(sent) <= 8192 - 2048
    assert raw.headers.get("x-compaction-id")


@pytest.mark.parametrize("style", ["openai", "vllm", "llama.cpp", "anthropic", "no-number"])
def test_overflow_error_is_caught_compacted_and_retried_once(
    fake_upstream: FakeUpstream, start_app: AppFactory, style: str
) -> None:
    upstream = fake_upstream
    upstream.window = 6000
    upstream.error_style = style
    proxy = start_app(compaction={"summarizer": "extractive"})  # proxy believes 128k
    # Without a stated window the retry aims at half of what failed.
    messages = agent_session(seed=2, steps=25 if style == "no-number" else 60)
    assert COUNTER.count_request({"messages": messages}) > 6000
    raw = proxy.openai().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages
    )
    assert raw.parse().choices[0].message.content.startswith("I saw")
    assert raw.headers["x-compaction-reason"] == "overflow"
    assert len(upstream.chat_requests) == 2  # the original, then exactly one retry
    retried = upstream.chat_requests[-1].json()
    assert COUNTER.count_request(retried) <= 6000
    assert validate_tool_pairing(retried["messages"]) == []


def test_second_overflow_is_relayed_as_the_upstream_sent_it(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    upstream.window = 6000
    upstream.count_factor = 3.0  # its tokenizer counts far more than ours…
    upstream.error_style = "no-number"  # …and its error says by how much nowhere
    proxy = start_app(compaction={"summarizer": "extractive"})
    with pytest.raises(openai.BadRequestError) as info:
        proxy.openai().chat.completions.create(model="gpt-4o", messages=agent_session(steps=60))
    assert len(upstream.chat_requests) == 2
    assert info.value.code == "context_length_exceeded"
    assert "exceeds the context window" in str(info.value)
    first, retry = (r.body for r in upstream.chat_requests)
    assert len(retry) < len(first)


def test_an_overflow_that_states_its_count_is_retried_to_fit_that_count(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    """The retry aims below failed × limit ÷ the count the error states: a
    tokenizer that counts three times ours still gets a request that fits."""
    upstream = fake_upstream
    upstream.window = 6000
    upstream.count_factor = 3.0
    proxy = start_app(compaction={"summarizer": "extractive"})
    reply = proxy.openai().chat.completions.create(model="gpt-4o", messages=agent_session(steps=60))
    assert reply.choices[0].message.content.startswith("I saw")
    assert [r.status for r in upstream.chat_requests] == [400, 200]


def test_a_head_that_cannot_fit_gets_a_clear_400_from_the_proxy(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    proxy = start_app(models={"gpt-4o": {"context_window": 4096}})
    with pytest.raises(openai.BadRequestError) as info:
        proxy.openai().chat.completions.create(
            model="gpt-4o",
            messages=[
                {"role": "system", "content": "rule " * 5000},
                {"role": "user", "content": "hi"},
            ],
        )
    assert info.value.code == "context_length_exceeded"
    assert "head" in str(info.value)
    assert upstream.chat_requests == []


def test_learned_window_is_used_for_the_next_request(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    upstream.window = 6000
    proxy = start_app(compaction={"summarizer": "extractive"})
    sdk = proxy.openai()
    sdk.chat.completions.create(model="gpt-4o", messages=agent_session(seed=4, steps=60))
    assert len(upstream.chat_requests) == 2
    raw = sdk.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=agent_session(seed=5, steps=60)
    )
    assert len(upstream.chat_requests) == 3  # compacted before sending: no overflow
    assert raw.headers["x-compaction-reason"] == "threshold"


def test_streaming_chunks_arrive_unmodified_and_in_order(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    upstream.chunks = 20
    proxy = start_app()
    body = {
        "model": "gpt-4o",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
    }
    with TestClient(upstream.app()) as straight:  # the same upstream, asked directly
        direct = straight.post(f"{UPSTREAM_URL}/chat/completions", json=body).content
    proxied = proxy.http.post(f"{proxy.url}/chat/completions", json=body).content
    assert proxied == direct
    stream = proxy.openai().chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(f"w{i} " for i in range(20))
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0


def test_async_sdk_streams_through_compaction(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, _ = fake
    url = start_proxy(models=SMALL, compaction={"summarizer": "extractive"})

    async def stream_text() -> str:
        async with openai.AsyncOpenAI(base_url=url, api_key="sk-client", max_retries=0) as sdk:
            stream = await sdk.chat.completions.create(
                model="gpt-4o", messages=agent_session(seed=6, steps=100), stream=True
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert asyncio.run(stream_text()).startswith("w0 ")
    assert COUNTER.count_request(upstream.chat_requests[-1].json()) <= 6144


def test_llm_summarizer_uses_client_credentials_and_is_not_repeated(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    proxy = start_app(models=SMALL)  # summarizer "llm" by default
    sdk = proxy.openai()
    messages = agent_session(seed=7, steps=120)
    sdk.chat.completions.create(model="gpt-4o", messages=messages)
    assert len(upstream.summary_requests) >= 1
    calls = len(upstream.summary_requests)
    summary_request = upstream.summary_requests[0]
    assert summary_request.headers["authorization"] == "Bearer sk-client"
    body = summary_request.json()
    assert body["temperature"] == 0 and body["stream"] is False and "tools" not in body
    first = upstream.chat_requests[-1].json()
    summary = [m for m in first["messages"] if str(m.get("content", "")).startswith(SUMMARY_MARKER)]
    assert summary and "parse_window_header" in summary[0]["content"]  # the fake's SUMMARY_TEXT

    # The next turn of the same conversation reuses the stored summary.
    follow_up = [*messages, {"role": "user", "content": "Thanks. Anything else?"}]
    raw = sdk.chat.completions.with_raw_response.create(model="gpt-4o", messages=follow_up)
    assert len(upstream.summary_requests) == calls
    second = upstream.chat_requests[-1].json()
    assert second["messages"][: len(first["messages"])] == first["messages"]
    assert second["messages"][-1]["content"] == "Thanks. Anything else?"
    assert raw.headers.get("x-compaction-id")


def test_llm_summarizer_failure_falls_back_to_extractive(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    upstream.summary_text = ""  # an empty reply is a failure
    proxy = start_app(models=SMALL)
    raw = proxy.openai().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=agent_session(seed=8, steps=120)
    )
    assert raw.headers["x-compaction-stage"] in ("condensed", "truncated")
    sent = upstream.chat_requests[-1].json()
    assert any(str(m.get("content", "")).startswith(SUMMARY_MARKER) for m in sent["messages"])


def test_upstream_errors_are_relayed_with_body_and_retry_after(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    proxy = start_app()
    upstream.behaviours = ["429", "500"]
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    limited = proxy.http.post(f"{proxy.url}/chat/completions", json=body)
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "7"
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    broken = proxy.http.post(f"{proxy.url}/chat/completions", json=body)
    assert broken.status_code == 500 and broken.json()["error"]["message"] == "boom"
    assert len(upstream.chat_requests) == 2  # neither was retried by the proxy


def test_manual_compact_answers_without_calling_the_model(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    proxy = start_app(compaction={"summarizer": "extractive"})
    sdk = proxy.openai()
    history = agent_session(seed=9, steps=30)
    command = {"role": "user", "content": "/compact focus on the failing test"}
    completion = sdk.chat.completions.create(model="gpt-4o", messages=[*history, command])
    text = completion.choices[0].message.content or ""
    assert text.startswith("Context compacted:") and "→" in text
    assert upstream.chat_requests == []

    streamed = sdk.chat.completions.create(
        model="gpt-4o", messages=[*history, command], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices).startswith(
        "Context compacted:"
    )
    assert upstream.chat_requests == []

    # Later turns: the command and its reply are not forwarded; the summary is.
    later = [
        *history,
        command,
        {"role": "assistant", "content": text},
        {"role": "user", "content": "continue"},
    ]
    sdk.chat.completions.create(model="gpt-4o", messages=later)
    sent = upstream.chat_requests[-1].json()["messages"]
    assert not any("/compact" in str(m.get("content")) for m in sent)
    assert not any(str(m.get("content", "")).startswith("Context compacted:") for m in sent)
    assert any(str(m.get("content", "")).startswith(SUMMARY_MARKER) for m in sent)
    assert sent[-1]["content"] == "continue"


def test_manual_compact_stream_is_openai_chunk_format(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    proxy = start_app(compaction={"summarizer": "extractive"})
    body = {
        "model": "gpt-4o",
        "stream": True,
        "messages": [{"role": "user", "content": "hello"}, {"role": "user", "content": "/compact"}],
    }
    response = proxy.http.post(f"{proxy.url}/chat/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e for e in response.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)
    assert payloads[0]["choices"][0]["delta"]["role"] == "assistant"
    assert payloads[-1]["choices"][0]["finish_reason"] == "stop"
