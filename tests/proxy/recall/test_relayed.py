"""An answer sent with the recall tool goes through the one relay a plain
answer takes: its bookkeeping — the request's log line, the metrics, the
recall's own line — is written once the client has the whole answer, and a
client that leaves mid-answer is logged as on the plain path.

The app runs in-process in front of the scripted recalling model
(:class:`~tests.proxy.recall_upstream.RecallUpstream`) and is driven through
raw ASGI, so what the client was sent at each moment is seen message by
message."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from starlette.types import ASGIApp, Message

from proxy.app import create_app
from proxy.state.logs import REQUESTS
from proxy.state.stores import RequestRecord
from tests.proxy.flow.test_after_answer import _chat_lines, _metrics_body, _running
from tests.proxy.inprocess import (
    RecordingTransport,
    http_scope,
    services_of_app,
    settings_for,
    sse_reply,
)
from tests.proxy.recall.test_rounds import chat_request
from tests.proxy.recall_upstream import RecallUpstream

ANSWERED = b'compaction_proxy_recalls_total{api="chat",outcome="answered"} 1.0'


def _app(upstream: RecallUpstream) -> tuple[ASGIApp, RecordingTransport]:
    transport = RecordingTransport(app=upstream.app())
    settings = settings_for(
        compaction={"threshold": 2000, "keep_recent_tokens": 300, "summarizer": "extractive"}
    )
    return create_app(settings, transport=transport), transport


async def _ask(
    app: ASGIApp,
    body: bytes,
    *,
    leave_after: int | None = None,
    leave_when: asyncio.Event | None = None,
    on_send: Any = None,
) -> list[Message]:
    """One chat request through ``app``; every message it sent. The client
    stays to the end, or disconnects once it has ``leave_after`` body
    messages, or once ``leave_when`` is set."""
    path = "/v1/chat/completions"
    headers = [
        (b"host", b"127.0.0.1"),
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        (b"authorization", b"Bearer sk-alice"),
    ]
    scope = http_scope("POST", path, headers, server=("127.0.0.1", 8080))
    delivered = False
    left = asyncio.Event()
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        if leave_when is not None:
            await leave_when.wait()
            left.set()
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if left.is_set():
            return  # what uvicorn does with what is sent to a client that left
        sent.append(message)
        if on_send is not None:
            on_send(message)
        bodies = sum(1 for m in sent if m["type"] == "http.response.body")
        if leave_after is not None and bodies >= leave_after:
            left.set()
            await asyncio.sleep(0.01)  # the server notices as a real one would

    await app(scope, receive, send)
    return sent


def _recall_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == REQUESTS and r.getMessage() == "recall"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_recalling_answers_bookkeeping_comes_once_the_client_has_it_before_anything_else(
    caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    caplog.set_level(logging.INFO, logger=REQUESTS)
    upstream = RecallUpstream()
    app, _ = _app(upstream)
    body = orjson.dumps({**chat_request(), "stream": stream})
    logged_when_answered: list[int] = []

    def on_send(message: Message) -> None:
        if message["type"] == "http.response.body" and not logged_when_answered:
            logged_when_answered.append(len(_chat_lines(caplog)) + len(_recall_lines(caplog)))

    async def run() -> tuple[list[Message], bytes]:
        async with _running(app):
            sent = await _ask(app, body, on_send=on_send)
            metrics = await _ask_metrics(app)
            return sent, metrics

    sent, exposition = asyncio.run(run())
    assert b"# the needle" in b"".join(m.get("body", b"") for m in sent)  # the recalled line
    assert len(upstream.turns()) == 2  # the model recalled, and was asked again
    # Nothing was logged when the client's first answer bytes went out; the
    # very next request finds the request and its recall counted.
    assert logged_when_answered == [0]
    assert (len(_chat_lines(caplog)), len(_recall_lines(caplog))) == (1, 1)
    assert ANSWERED in exposition


async def _ask_metrics(app: ASGIApp) -> bytes:
    from tests.proxy.flow.test_after_answer import _call

    return _metrics_body(await _call(app, "GET", "/metrics"))


def _plain(body: dict[str, Any]) -> dict[str, Any]:
    """The same request, with no tools: it goes upstream without the recall tool."""
    return {k: v for k, v in body.items() if k != "tools"}


@pytest.mark.parametrize("recalling", [False, True], ids=["plain", "recall"])
def test_a_client_that_leaves_mid_stream_is_logged_alike_with_or_without_recall(
    caplog: pytest.LogCaptureFixture, recalling: bool
) -> None:
    caplog.set_level(logging.INFO)
    upstream = RecallUpstream()
    app, transport = _app(upstream)
    request = chat_request() if recalling else _plain(chat_request())
    body = orjson.dumps({**request, "stream": True})

    async def run() -> list[Message]:
        async with _running(app):
            return await _ask(app, body, leave_after=1)

    sent = asyncio.run(run())
    assert sent[0]["status"] == 200
    assert sent[-1].get("more_body") is not False  # never a clean end
    # One line for the request, as it was answered; nothing says the upstream
    # broke: it was the client that left.
    (line,) = _chat_lines(caplog)
    assert line.fields["upstream_status"] == 200  # type: ignore[attr-defined]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []
    assert all(response.aborted or response._ended for response in transport.responses)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_client_that_leaves_while_the_next_round_is_asked_cancels_it_and_is_logged_once(
    caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    caplog.set_level(logging.INFO, logger=REQUESTS)
    model = RecallUpstream().app()
    asked_again = asyncio.Event()
    cancelled: list[bool] = []
    calls: list[Any] = []

    async def upstream(scope: Any, receive: Any, send: Any) -> None:
        """The model recalls; the follow-up it is asked never gets an answer."""
        if scope["type"] != "http" or not calls:
            calls.append(scope)
            await model(scope, receive, send)
            return
        asked_again.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    transport = RecordingTransport(app=upstream)
    settings = settings_for(
        compaction={"threshold": 2000, "keep_recent_tokens": 300, "summarizer": "extractive"}
    )
    app = create_app(settings, transport=transport)
    body = orjson.dumps({**chat_request(), "stream": stream})

    async def run() -> list[Message]:
        async with _running(app):
            return await _ask(app, body, leave_when=asked_again)

    sent = asyncio.run(run())
    assert len(transport.requests) == 2 and cancelled == [True]
    # Nothing of a whole answer went out; a stream got what came before.
    assert [m for m in sent if m["type"] == "http.response.body" and not m.get("more_body")] == []
    (line,) = _chat_lines(caplog)
    assert line.fields["upstream_status"] == 200  # type: ignore[attr-defined]


def test_a_recalling_stream_that_closes_before_saying_anything_is_asked_again_as_a_plain_one_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    upstream = RecallUpstream()
    app, transport = _app(upstream)
    opening = {"id": "c0", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    transport.script(sse_reply(opening, done=False))  # the first answer: a role, then nothing
    body = orjson.dumps({**chat_request(), "stream": True})

    async def run() -> tuple[list[Message], bytes]:
        async with _running(app):
            sent = await _ask(app, body)
            return sent, await _ask_metrics(app)

    sent, exposition = asyncio.run(run())
    relayed = b"".join(m.get("body", b"") for m in sent)
    # Asked again unseen, then recalled and asked once more: one whole answer.
    assert len(transport.requests) == 3
    assert transport.requests[0].body == transport.requests[1].body
    assert b"# the needle" in relayed and relayed.endswith(b"data: [DONE]\n\n")
    assert b'"c0"' not in relayed and b"upstream_dropped" not in relayed
    assert b'compaction_proxy_upstream_errors_total{kind="cut"} 1.0' in exposition
    assert ANSWERED in exposition
    cuts = [r for r in caplog.records if r.getMessage() == "upstream stream ended before its end"]
    assert [r.fields["then"] for r in cuts] == ["asked again"]  # type: ignore[attr-defined]


def _app_with(upstream: RecallUpstream, **compaction: Any) -> ASGIApp:
    settings = settings_for(
        compaction={
            "threshold": 2000,
            "keep_recent_tokens": 300,
            "summarizer": "extractive",
            **compaction,
        }
    )
    return create_app(settings, transport=RecordingTransport(app=upstream.app()))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("upstream", "rounds", "code"),
    [
        (RecallUpstream(refuses_followups=True), 3, "recall_failed"),
        (RecallUpstream(always=True, stubborn=True), 1, "recall_limit"),
    ],
    ids=["refused", "limit"],
)
def test_a_recalling_answer_that_ends_in_an_error_is_logged_and_recorded_as_that_error(
    caplog: pytest.LogCaptureFixture,
    upstream: RecallUpstream,
    rounds: int,
    code: str,
    stream: bool,
) -> None:
    """The client got the proxy's error (a whole answer's 502, a stream's error
    event): the request's line and its figures say so, not the first round's 200."""
    caplog.set_level(logging.INFO, logger=REQUESTS)
    app = _app_with(upstream, recall_rounds=rounds)
    body = orjson.dumps({**chat_request(), "stream": stream})

    async def run() -> tuple[list[Message], list[RequestRecord]]:
        async with _running(app):
            sent = await _ask(app, body)
            services = services_of_app(app)
            assert services.observed.recorder is not None
            await services.observed.recorder.flush()
            store = services.conversations.store
            (session,) = await store.sessions()
            return sent, await store.requests(session.session)

    sent, records = asyncio.run(run())
    answered = b"".join(m.get("body", b"") for m in sent)
    assert code.encode() in answered
    assert sent[0]["status"] == (200 if stream else 502)
    (line,) = _chat_lines(caplog)
    fields = line.fields  # type: ignore[attr-defined]
    assert fields["error"] == code
    assert fields["upstream_status"] == 502
    (record,) = records
    assert (record.status, record.error) == (502, code)


def test_a_next_round_goes_the_way_its_request_went_a_refused_one_counted_as_the_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The loop asks its next rounds of the request's own sending, not of a bare
    transport: the refused round is one of the request's upstream errors, in
    its figures and in the upstream error metric, beside its first round's 200."""
    caplog.set_level(logging.INFO, logger=REQUESTS)
    app = _app_with(RecallUpstream(refuses_followups=True))
    body = orjson.dumps(chat_request())

    async def run() -> tuple[list[RequestRecord], bytes]:
        async with _running(app):
            await _ask(app, body)
            services = services_of_app(app)
            assert services.observed.recorder is not None
            await services.observed.recorder.flush()
            store = services.conversations.store
            (session,) = await store.sessions()
            return await store.requests(session.session), await _ask_metrics(app)

    records, exposition = asyncio.run(run())
    (record,) = records
    assert (record.error, record.upstream_errors) == ("recall_failed", 1)
    assert b'compaction_proxy_upstream_errors_total{kind="5xx"} 1.0' in exposition
