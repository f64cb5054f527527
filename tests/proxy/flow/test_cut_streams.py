"""A stream that closes before its API's end — a ``role`` chunk, say, and then
nothing, no ``[DONE]`` and no error — is an upstream error: counted, logged,
asked again once while nothing of it reached the client, and otherwise ended
with the API's error event, never passed on as a whole answer.

The upstream is a raw script on loopback (:mod:`tests.proxy.raw_servers`):
it writes exactly the events each test wants and ends the chunked body cleanly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import orjson
import pytest

from config import load_settings
from proxy.app import create_app
from tests.proxy.raw_servers import read_request, serve_script
from tests.proxy.servers import serve_in_thread


def _event(payload: dict[str, object], name: str | None = None) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


def _chat(delta: dict[str, object], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return _event({**chunk, "choices": [choice]})


def _typed(kind: str, **fields: object) -> bytes:
    return _event({"type": kind, **fields}, kind)


_MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "m"}
_RESPONSE = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}


@dataclass(frozen=True)
class Api:
    name: str
    path: str
    body: dict[str, object]
    opening: list[bytes]  #: events that say nothing yet
    said: bytes  #: an event that says something ("Hello")
    closing: list[bytes]  #: the events that end a stream


APIS = [
    Api(
        "chat",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        [_chat({"role": "assistant", "content": ""})],
        _chat({"content": "Hello"}),
        [_chat({}, "stop"), b"data: [DONE]\n\n"],
    ),
    Api(
        "anthropic",
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
        [_typed("message_start", message=_MESSAGE), _typed("ping")],
        _typed("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hello"}),
        [_typed("message_stop")],
    ),
    Api(
        "responses",
        "/v1/responses",
        {"model": "m", "input": "hi", "stream": True},
        [_typed("response.created", response=_RESPONSE)],
        _typed("response.output_text.delta", output_index=0, content_index=0, delta="Hello"),
        [_typed("response.completed", response={**_RESPONSE, "status": "completed"})],
    ),
]


@dataclass
class Upstream:
    """Answers the n-th request with the n-th script (the last one thereafter)."""

    answers: list[list[bytes]]
    asked: list[str] = field(default_factory=list)

    async def serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int
    ) -> None:
        while (request := await read_request(reader)) is not None:
            self.asked.append(request[0])
            events = self.answers[min(len(self.asked), len(self.answers)) - 1]
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
            for event in events:
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
            writer.write(b"0\r\n\r\n")  # the body ends cleanly, whatever it held
            await writer.drain()
        writer.close()


@contextmanager
def proxy_for(upstream: Upstream) -> Iterator[str]:
    with serve_script(upstream.serve) as base:
        settings = load_settings(
            None,
            store={"url": "memory://"},
            upstream={"base_url": base + "/v1", "anthropic_base_url": base + "/v1"},
        )
        with serve_in_thread(create_app(settings)) as url:
            yield url


def _ask(url: str, api: Api) -> tuple[int, str, str]:
    """The status, the body as the client read it, and the proxy's metrics."""
    headers = {"authorization": "Bearer sk-a", "x-api-key": "sk-a"}
    with httpx.Client(timeout=30) as client:
        answer = client.post(url + api.path, json=api.body, headers=headers)
        metrics = client.get(url + "/metrics").text
    return answer.status_code, answer.text, metrics


_COUNTED = 'compaction_proxy_upstream_errors_total{kind="cut"} 1.0'


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_a_stream_that_ends_after_its_opening_events_is_asked_again_unseen(api: Api) -> None:
    whole = [*api.opening, api.said, *api.closing]
    upstream = Upstream([api.opening, whole])
    with proxy_for(upstream) as url:
        status, text, metrics = _ask(url, api)
    assert len(upstream.asked) == 2
    assert status == 200
    assert text == b"".join(whole).decode()  # the second answer alone, byte for byte
    assert _COUNTED in metrics


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_a_stream_cut_after_it_said_something_ends_with_the_apis_error_event(api: Api) -> None:
    upstream = Upstream([[*api.opening, api.said]])
    with proxy_for(upstream) as url:
        status, text, metrics = _ask(url, api)
    assert len(upstream.asked) == 1  # the client has read part of it: never asked again
    assert status == 200
    assert text.startswith(b"".join([*api.opening, api.said]).decode())
    assert "upstream_dropped" in text or '"type":"error"' in text
    assert _COUNTED in metrics


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_a_stream_cut_twice_is_asked_again_once_and_then_ends_with_the_error_event(
    api: Api,
) -> None:
    upstream = Upstream([api.opening])
    with proxy_for(upstream) as url:
        status, text, metrics = _ask(url, api)
    assert len(upstream.asked) == 2 and status == 200
    assert text.startswith(b"".join(api.opening).decode())
    assert "upstream_dropped" in text or '"type":"error"' in text
    assert 'compaction_proxy_upstream_errors_total{kind="cut"} 2.0' in metrics


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_a_stream_that_ends_as_its_api_ends_one_is_relayed_untouched(api: Api) -> None:
    whole = [*api.opening, api.said, *api.closing]
    upstream = Upstream([whole])
    with proxy_for(upstream) as url:
        _, text, metrics = _ask(url, api)
    assert len(upstream.asked) == 1
    assert text == b"".join(whole).decode()
    assert 'kind="cut"' not in metrics
