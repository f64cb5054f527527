"""The proxy against scripted upstream answers, in-process: what it asks the
transport, and what it makes of each kind of answer (see tests.proxy.inprocess)."""

from __future__ import annotations

from typing import Any

import pytest

from compaction import TokenCounter
from proxy.upstream.transport import ConnectFailed, TransportTimeout
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import (
    UPSTREAM_URL,
    RecordingTransport,
    context_length_error,
    cut_stream,
    empty_stream,
    failure,
    json_reply,
    sse_reply,
)
from tests.synthetic import agent_session

HI = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
COUNTER = TokenCounter("gpt-4o")


def _completion(text: str = "ok") -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def _chunk(content: str) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }


def test_the_transport_is_asked_once_with_the_clients_bytes_and_credentials(
    start_app: AppFactory,
) -> None:
    transport = RecordingTransport()
    transport.script(json_reply(_completion("hello")))
    proxy = start_app(transport=transport)
    raw = b'{"model": "gpt-4o",  "messages": [{"role": "user", "content": "hi"}]}'
    response = proxy.http.post(
        f"{proxy.url}/chat/completions",
        content=raw,
        headers={"content-type": "application/json", "authorization": "Bearer sk-mine"},
    )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "hello"
    [asked] = transport.requests
    assert (asked.method, asked.url, asked.body) == (
        "POST",
        f"{UPSTREAM_URL}/chat/completions",
        raw,
    )
    assert asked.headers["authorization"] == "Bearer sk-mine"
    assert transport.responses[0].aborted is False  # read to its end, not cut short


def test_a_scripted_stream_reaches_the_client_event_by_event(start_app: AppFactory) -> None:
    transport = RecordingTransport()
    events = [_chunk(word) for word in ("one ", "two ", "three")]
    transport.script(sse_reply(*events))
    proxy = start_app(transport=transport)
    with proxy.http.stream(
        "POST", f"{proxy.url}/chat/completions", json={**HI, "stream": True}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        received = b"".join(response.iter_raw())
    assert received == b"".join(sse_reply(*events).chunks)


def test_a_stream_that_breaks_upstream_ends_with_an_error_event_and_no_done(
    start_app: AppFactory,
) -> None:
    transport = RecordingTransport()
    transport.script(cut_stream(_chunk("one "), _chunk("two ")))
    proxy = start_app(transport=transport)
    text = proxy.http.post(f"{proxy.url}/chat/completions", json={**HI, "stream": True}).text
    events = [event for event in text.split("\n\n") if event]
    assert len(events) == 3 and "upstream_dropped" in events[-1]
    assert "[DONE]" not in text


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (
            TransportTimeout("the upstream did not answer in time", phase="read"),
            504,
            "upstream_timeout",
        ),
        (ConnectFailed("no connection could be opened"), 502, "upstream_unreachable"),
    ],
    ids=["timeout", "refused"],
)
def test_a_transport_error_is_an_openai_shaped_gateway_error(
    start_app: AppFactory, error: Exception, status: int, code: str
) -> None:
    transport = RecordingTransport()
    transport.script(failure(error))  # type: ignore[arg-type]
    proxy = start_app(transport=transport)
    response = proxy.http.post(f"{proxy.url}/chat/completions", json=HI)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


def test_a_stated_overflow_is_compacted_and_retried_once_below_the_stated_window(
    start_app: AppFactory,
) -> None:
    transport = RecordingTransport()
    messages = agent_session(seed=2, steps=60)
    tokens = COUNTER.count_request({"messages": messages})
    transport.script(context_length_error(6000, tokens), json_reply(_completion()))
    proxy = start_app(transport=transport, compaction={"summarizer": "extractive"})
    response = proxy.http.post(
        f"{proxy.url}/chat/completions", json={"model": "gpt-4o", "messages": messages}
    )
    assert response.status_code == 200
    assert response.headers["x-compaction-reason"] == "overflow"
    first, retry = transport.asked("/chat/completions")
    assert first.json()["messages"] == messages
    assert COUNTER.count_request(retry.json()) <= 6000


def test_an_empty_stream_for_a_small_request_reaches_the_client_as_an_error_event(
    start_app: AppFactory,
) -> None:
    transport = RecordingTransport()
    transport.script(empty_stream())
    proxy = start_app(transport=transport)
    answer = proxy.http.post(f"{proxy.url}/chat/completions", json={**HI, "stream": True})
    assert "upstream_empty" in answer.text
    assert len(transport.requests) == 1  # nothing to compact: not retried
