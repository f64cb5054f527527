"""A chat request's bookkeeping — its log line, metrics and figures — is
written once the client has its answer, and before the app serves anything
else. The app is driven through raw ASGI here, so what the client was sent
at each moment is seen message by message (a test client would gather the
whole answer first)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.types import ASGIApp, Message

from proxy.app import create_app
from proxy.state.logs import REQUESTS
from proxy.upstream.transport import BodyLost
from tests.proxy.inprocess import (
    RecordingTransport,
    Reply,
    cut_stream,
    http_scope,
    json_reply,
    settings_for,
    sse_reply,
)

HI = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
STREAMED = b'{"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
COUNTED = b'compaction_proxy_requests_total{model="gpt-4o",stage="none"} 1.0'


@asynccontextmanager
async def _running(app: ASGIApp) -> AsyncIterator[None]:
    """The app's lifespan, entered and left as a server does."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}

    async def serve() -> None:
        await app(scope, inbox.get, outbox.put)

    task = asyncio.create_task(serve())
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task


async def _call(
    app: ASGIApp,
    method: str,
    path: str,
    body: bytes = b"",
    on_send: Callable[[Message], Awaitable[None]] | None = None,
) -> list[Message]:
    """One request through the app; every message it sent, in order."""
    headers = [(b"host", b"127.0.0.1"), (b"content-length", b"%d" % len(body))]
    if body:
        headers.append((b"content-type", b"application/json"))
    scope = http_scope(method, path, headers, server=("127.0.0.1", 8080))
    delivered = False
    never = asyncio.Event()

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays until its answer is complete
        return {"type": "http.disconnect"}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)
        if on_send is not None:
            await on_send(message)

    await app(scope, receive, send)
    return sent


def _metrics_body(sent: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _chat_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == REQUESTS and r.getMessage() == "chat"]


def _logged_at_answer_then_metrics(
    app: ASGIApp, method: str, path: str, body: bytes, lines: Callable[[], int]
) -> tuple[list[int], bytes]:
    """One request through ``app``: how many log lines (``lines()``) there were
    when its first answer bytes went out, and ``/metrics`` asked right after it
    — the very next request, nothing run between the two."""
    logged_when_answered: list[int] = []

    async def on_send(message: Message) -> None:
        if message["type"] == "http.response.body" and not logged_when_answered:
            logged_when_answered.append(lines())

    async def run() -> bytes:
        async with _running(app):
            await _call(app, method, path, body, on_send)
            return _metrics_body(await _call(app, "GET", "/metrics"))

    return logged_when_answered, asyncio.run(run())


@pytest.mark.parametrize(
    ("body", "reply"),
    [
        (HI, json_reply(ANSWER)),
        (STREAMED, sse_reply({"choices": [{"index": 0, "delta": {"content": "ok"}}]})),
    ],
    ids=["whole", "streamed"],
)
def test_a_requests_log_line_and_metrics_come_after_its_answer_went_out_and_before_the_app_returns(
    caplog: pytest.LogCaptureFixture, body: bytes, reply: Any
) -> None:
    caplog.set_level(logging.INFO, logger=REQUESTS)
    transport = RecordingTransport()
    transport.script(reply)
    app = create_app(settings_for(), transport=transport)
    logged_when_answered, exposition = _logged_at_answer_then_metrics(
        app, "POST", "/v1/chat/completions", body, lambda: len(_chat_lines(caplog))
    )
    # The client held its first answer bytes with nothing logged yet; the
    # very next request sees it counted.
    assert logged_when_answered == [0]
    assert len(_chat_lines(caplog)) == 1
    assert COUNTED in exposition


UNTOUCHED = b'{"model": "gpt-4o", "previous_response_id": "resp_1", "input": "and then?"}'
RESPONSE = {"id": "resp_2", "object": "response", "status": "completed", "output": []}


@pytest.mark.parametrize(
    ("method", "path", "body", "reply", "line", "counted"),
    [
        (
            "POST",
            "/v1/responses",
            UNTOUCHED,
            json_reply(RESPONSE),
            "chat",
            b'compaction_proxy_upstream_seconds_count{route="chat"} 1.0',
        ),
        (
            "GET",
            "/v1/models",
            b"",
            json_reply({"object": "list", "data": []}),
            "forward",
            b'compaction_proxy_upstream_seconds_count{route="other"} 1.0',
        ),
    ],
    ids=["responses-untouched", "pass-through"],
)
def test_a_forwarded_answers_log_line_comes_after_the_answer_and_before_the_app_returns(
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    body: bytes,
    reply: Any,
    line: str,
    counted: bytes,
) -> None:
    caplog.set_level(logging.INFO, logger=REQUESTS)
    transport = RecordingTransport()
    transport.script(reply)
    app = create_app(settings_for(), transport=transport)

    def lines() -> int:
        return sum(1 for r in caplog.records if r.name == REQUESTS and r.getMessage() == line)

    logged_when_answered, exposition = _logged_at_answer_then_metrics(
        app, method, path, body, lines
    )
    assert len(transport.requests) == 1
    assert (logged_when_answered, lines()) == ([0], 1)
    assert counted in exposition


@pytest.mark.parametrize(
    ("body", "reply", "status"),
    [
        (
            HI,
            Reply(
                200,
                (("content-type", "application/json"),),
                (b'{"id": "c1", "choi',),
                broken=BodyLost("cut"),
            ),
            502,
        ),
        (STREAMED, cut_stream(), 200),
    ],
    ids=["whole-body-broken", "stream-broken-before-its-first-event"],
)
def test_an_answer_that_breaks_before_the_client_had_any_of_it_is_still_logged_and_counted_once(
    caplog: pytest.LogCaptureFixture, body: bytes, reply: Reply, status: int
) -> None:
    caplog.set_level(logging.INFO, logger=REQUESTS)
    transport = RecordingTransport()
    transport.script(reply)
    app = create_app(settings_for(), transport=transport)

    async def run() -> tuple[list[Message], bytes]:
        async with _running(app):
            sent = await _call(app, "POST", "/v1/chat/completions", body)
            return sent, _metrics_body(await _call(app, "GET", "/metrics"))

    sent, exposition = asyncio.run(run())
    assert sent[0]["status"] == status
    assert len(_chat_lines(caplog)) == 1
    assert COUNTED in exposition


def test_the_log_lines_milliseconds_run_to_the_upstreams_head_not_to_the_end_of_the_relay(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger=REQUESTS)
    now = [1000.0]  # the handler's clock: it moves only when the client reads
    monkeypatch.setattr("proxy.flow.handler.time", SimpleNamespace(perf_counter=lambda: now[0]))
    transport = RecordingTransport()
    transport.script(json_reply(ANSWER))
    app = create_app(settings_for(), transport=transport)

    async def slow_client(message: Message) -> None:
        if message["type"] == "http.response.body":
            now[0] += 10.0  # the client takes ten seconds to read its answer

    async def run() -> None:
        async with _running(app):
            await _call(app, "POST", "/v1/chat/completions", HI, slow_client)

    asyncio.run(run())
    (line,) = _chat_lines(caplog)
    fields: dict[str, Any] = line.fields  # type: ignore[attr-defined]
    assert (fields["upstream_status"], fields["ms"]) == (200, 0.0)


def test_a_whole_answer_that_breaks_is_logged_with_the_error_the_client_got(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client got the proxy's 502, not the upstream's 200: the line says so."""
    caplog.set_level(logging.INFO, logger=REQUESTS)
    transport = RecordingTransport()
    transport.script(
        Reply(
            200,
            (("content-type", "application/json"),),
            (b'{"id": "c1", "choi',),
            broken=BodyLost("cut"),
        )
    )
    app = create_app(settings_for(), transport=transport)

    async def run() -> list[Message]:
        async with _running(app):
            return await _call(app, "POST", "/v1/chat/completions", HI)

    sent = asyncio.run(run())
    assert sent[0]["status"] == 502
    (line,) = _chat_lines(caplog)
    fields: dict[str, Any] = line.fields  # type: ignore[attr-defined]
    assert (fields["upstream_status"], fields["error"]) == (502, "upstream_unreachable")
