"""Talking to the upstream: request headers, sending, and relaying the answer.

One :class:`~proxy.upstream.transport.Transport` (opened in the app's lifespan) sends
every request. This module is where the transport's errors become the proxy's
OpenAI-shaped ones (:func:`upstream_error`). Responses are relayed as they
arrive — no buffering beyond a small answer, no re-chunking — and a body that
breaks upstream breaks the client's response too: it never ends cleanly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.edge.errors import BadRequest, ProxyError, UpstreamTimeout, UpstreamUnreachable
from proxy.edge.headers import AUTH_HEADERS, PROXY_HEADERS
from proxy.flow.stream_end import StreamEnd
from proxy.flow.usage import UsageTap
from proxy.upstream.transport import (
    BodyLost,
    ConnectFailed,
    InvalidResponse,
    NoResponse,
    Transport,
    TransportError,
    TransportTimeout,
    UpstreamResponse,
)

logger = logging.getLogger(__name__)


def shown_url(url: str) -> str:
    """``url`` as a log line may name it: no user, password, query or fragment
    (a base URL may carry a key in any of them)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(unparsable URL)"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def dropped_event(dialect: Dialect, *, lost: bool) -> bytes:
    """The error event that ends a client's stream the upstream's stopped short:
    its connection ``lost``, or closed cleanly before its API's end."""
    message = (
        "The upstream connection was lost mid-stream."
        if lost
        else "The upstream ended the stream before its end."
    )
    return dialect.error_event(message, "upstream_dropped")


def log_broken(exc: BodyLost, url: str) -> None:
    logger.warning("upstream stream broke: %s", exc, extra={"fields": {"upstream": shown_url(url)}})


def log_cut(url: str, api: str, then: str | None = None) -> None:
    """A stream that closed before its API's end, logged (``then``: what was done)."""
    fields = {"upstream": shown_url(url), "api": api}
    if then is not None:
        fields["then"] = then
    logger.warning("upstream stream ended before its end", extra={"fields": fields})


def _log_failure(error: ProxyError, upstream: str, what: str) -> None:
    fields = {"status": error.status, "upstream": upstream, "code": error.code}
    logger.warning("%s", what, extra={"fields": fields})


#: Never forwarded in either direction: they describe one connection, or a
#: body the proxy re-encodes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        # The transport asks the upstream for identity encoding itself.
        "accept-encoding",
        # uvicorn answers a client's 100-continue; the transport sends bodies at once.
        "expect",
    }
)


def upstream_headers(
    client_headers: Iterable[tuple[str, str]],
    *,
    fallback_key: str | None,
    fallback_header: str = "authorization",
) -> dict[str, str]:
    """Headers for the upstream: the client's, less hop-by-hop ones and the proxy's own.

    ``client_headers`` are the request's as the edge passed them on: every
    header holding the proxy key or the admin key is gone already
    (:class:`proxy.edge.guards.Edge`), whatever its name, so what is left of
    ``Authorization``, ``api-key`` and ``x-api-key`` is the client's own and
    forwarded unchanged. The configured key is added only when the client
    sent none, as ``Authorization: Bearer`` or (Anthropic) ``x-api-key``.
    """
    headers: dict[str, str] = {}
    for name, value in client_headers:
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in PROXY_HEADERS:
            continue
        headers[lower] = value
    if fallback_key and not any(h in headers for h in AUTH_HEADERS):
        if fallback_header == "authorization":
            headers["authorization"] = f"Bearer {fallback_key}"
        else:
            headers[fallback_header] = fallback_key
    return headers


def _relayed_headers(
    upstream: UpstreamResponse, extra: Mapping[str, str]
) -> list[tuple[bytes, bytes]]:
    headers = [
        (k, v)
        for k, v in upstream.raw_headers
        if k != b"date" and k.decode("latin-1") not in HOP_BY_HOP  # uvicorn sends its own date
    ]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
    return headers


def upstream_error(exc: TransportError) -> ProxyError:
    """The proxy's answer to a request the transport could not complete.

    The one place transport errors become OpenAI-shaped ones; the bodies say
    what kind of failure it was, never an address or the upstream's bytes.
    """
    if isinstance(exc, TransportTimeout):
        if exc.phase == "connect":
            return UpstreamTimeout("No upstream connection could be opened in time.")
        return UpstreamTimeout("The upstream did not answer in time.")
    if isinstance(exc, ConnectFailed):
        return UpstreamUnreachable(f"The upstream could not be reached: {exc}.")
    if isinstance(exc, InvalidResponse):
        return UpstreamUnreachable(f"The upstream sent an invalid response: {exc}.")
    if isinstance(exc, BodyLost):
        return UpstreamUnreachable(f"The upstream's answer broke off: {exc}.")
    if isinstance(exc, NoResponse):
        return UpstreamUnreachable("The upstream closed the connection without an answer.")
    return UpstreamUnreachable("The upstream could not be reached.")


async def send(
    transport: Transport,
    method: str,
    url: str,
    headers: Mapping[str, str],
    content: bytes | AsyncIterator[bytes] | None,
    *,
    upstream: str | None = None,
) -> UpstreamResponse:
    """Send and return the response once its head is in, its body unread.

    ``upstream`` is the base URL ``url`` was built on: what the log line of a
    failure names (by default ``url`` itself, shown without secrets).
    """
    try:
        return await transport.request(method, url, headers, content)
    except TransportError as exc:
        error = upstream_error(exc)
        _log_failure(error, shown_url(upstream or url), "upstream not reached")
        raise error from exc
    except ValueError as exc:
        raise BadRequest(f"The request cannot be forwarded: {exc}.") from exc


async def read_whole(upstream: UpstreamResponse) -> bytes:
    """The whole body of an answer not yet relayed; a broken one is a 502."""
    try:
        return await upstream.read()
    except BodyLost as exc:
        error = upstream_error(exc)
        _log_failure(error, shown_url(upstream.url), "upstream answer broke")
        raise error from exc


#: An answer of a declared length below this is read whole before it is
#: relayed (a JSON completion): a body that breaks is then a clean 502.
WHOLE_BELOW = 1 << 20


class RoundSource(Protocol):
    """Where an answer's rounds after the first come from (:class:`proxy.recall.RecallLoop`):
    the proxy answers what a round asked of it and asks the upstream again;
    the client reads every round as one answer.

    A round's chunks pass through :meth:`feed`, the dialect's event filter; a
    plain answer has no source, and its chunks go out as they came. A
    :class:`~proxy.edge.errors.ProxyError` raised for a next round is
    answered in the API's shape: a whole answer's error, a stream's error event.
    """

    #: Whether the client reads the rounds as one stream, or one whole answer.
    streamed: bool

    def feed(self, chunk: bytes) -> bytes: ...

    def end(self) -> bytes: ...

    async def next_round(self) -> UpstreamResponse | None: ...

    async def next_answer(self, body: bytes) -> UpstreamResponse | bytes: ...


class Relay(Response):
    """The upstream's answer relayed: a small one whole, any other as it arrives.

    A body of a known, small length (a JSON answer) is read first and goes
    out in one message with its length. Any other (a stream, a download) is
    relayed chunk by chunk, never re-chunked or held back, with the
    upstream's length when it declared one; meanwhile the client's
    disconnect is watched, and aborts the upstream request at once — a
    generation nobody reads is not left running (and billed) to its end.

    An answer may come in rounds (``rounds``, the recall loop): each round's
    chunks go through the source's event filter, and when a round ends the
    source gives the next one — a stream goes on from the same client
    stream, a whole answer is the last round's. The same watcher stands
    while a next round is asked: a client that leaves cancels it.

    A body that breaks after the head went out leaves the client's response
    unfinished: the connection is closed without the last chunk, so no client
    takes a cut-off answer for a whole one (an SSE client gets an error event
    first).

    ``after`` is the request's bookkeeping (its log line, metrics and
    figures): called once, as soon as the client has its answer — a whole
    body, or a stream's last chunk, when ``tap`` has read the answer's usage
    — or, if the answer did not go out whole, once the relay ends. It runs in
    this task with no await between that send and it, so it is done before
    the event loop serves anything else: a client that reads ``/metrics``
    once it has its answer finds the request counted there. The client does
    not wait for it. What it returns, if anything (a store write), is
    awaited once the relay is over.
    """

    def __init__(
        self,
        upstream: UpstreamResponse,
        extra_headers: Mapping[str, str],
        tap: UsageTap | None = None,
        dialect: Dialect = CHAT,
        after: Callable[[], Awaitable[None] | None] | None = None,
        cut: Cut | None = None,
        rounds: RoundSource | None = None,
    ) -> None:
        self.upstream = upstream
        self._after = after
        self._pending: Awaitable[None] | None = None
        self._extra = extra_headers
        #: What to do with a stream of ``dialect`` that ends before its end
        #: (``None``: relayed as it came, for a route whose API is not known).
        self.cut = cut
        #: Whose error event a broken stream ends with.
        self.dialect = dialect
        self.rounds = rounds
        self.status_code = upstream.status
        self.raw_headers = _relayed_headers(upstream, extra_headers)
        self.background = None
        #: Sees every chunk of a successful answer, to read its ``usage``.
        self.tap = tap if upstream.status == 200 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = self.upstream
        rounds = self.rounds
        try:
            if rounds is None and upstream.length is not None and upstream.length < WHOLE_BELOW:
                await self._whole(scope, receive, send, None)
                return
            headers = self.raw_headers
            if upstream.length is not None and rounds is None:
                headers = [*headers, (b"content-length", b"%d" % upstream.length)]
            gone = asyncio.Event()
            watcher = asyncio.ensure_future(_abort_on_disconnect(receive, self, gone))
            try:
                if rounds is not None and not rounds.streamed:
                    await self._whole(scope, receive, send, watcher)
                    return
                again = await self._stream(send, headers, gone, watcher)
            finally:
                watcher.cancel()
            if again is not None:
                # The first stream said nothing and no byte of it reached the
                # client: the second answer is relayed in its place, from its head.
                upstream.abort()
                after, self._after = self._after, None
                cut = Cut(self.cut.count) if self.cut is not None else None
                relay = Relay(await again(), self._extra, self.tap, self.dialect, after, cut)
                await relay(scope, receive, send)
        finally:
            self.upstream.abort()  # nothing when the body was read to its end
            self._answered()
            if self._pending is not None:
                await self._pending

    def _answered(self) -> None:
        """The client has its answer (or the relay ended): ``after``, once."""
        after, self._after = self._after, None
        if after is not None:
            self._pending = after()

    async def _whole(
        self, scope: Scope, receive: Receive, send: Send, watcher: asyncio.Future[None] | None
    ) -> None:
        """The answer read whole and sent in one message; with rounds, the last
        round's (``watcher`` gives up a next round the client left)."""
        upstream = self.upstream
        try:
            body = await upstream.read()
            while self.rounds is not None and watcher is not None:
                following = await _unless_gone(self.rounds.next_answer(body), watcher)
                if following is None:
                    return
                if isinstance(following, bytes):
                    body = following
                    break
                upstream = self.upstream = following
                self.raw_headers = _relayed_headers(upstream, self._extra)
                body = await upstream.read()
        except BodyLost as exc:
            if watcher is not None and watcher.done():
                return  # the client left, and the read was stopped for it
            error = upstream_error(exc)
            _log_failure(error, shown_url(upstream.url), f"upstream answer broke: {exc}")
            await error_response(error, path=scope.get("path", ""))(scope, receive, send)
            return
        except ProxyError as error:
            await error_response(error, path=scope.get("path", ""))(scope, receive, send)
            return
        headers = self.raw_headers
        if scope["method"] == "HEAD":
            # No body came; the length is the one a GET would have had.
            length = upstream.length
            if length is not None:
                headers = [*headers, (b"content-length", b"%d" % length)]
        elif self.status_code not in (204, 304):
            headers = [*headers, (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        if self.tap is not None:
            self.tap.feed(body)
            self.tap.close()
        self._answered()

    async def _stream(
        self,
        send: Send,
        headers: list[tuple[bytes, bytes]],
        gone: asyncio.Event,
        watcher: asyncio.Future[None],
    ) -> Callable[[], Awaitable[UpstreamResponse]] | None:
        """Relay the body as it comes; the request to send again instead when
        the stream ended before its end having said nothing (see :class:`Cut`).

        Watched (a known API's event stream), the API's opening events are
        held, head included, until an event says something: a stream cut
        before that can be asked again unseen. Held past :data:`HELD_AT_MOST`
        bytes, they go out all the same.
        """
        upstream = self.upstream
        rounds = self.rounds
        watch = self._watch()
        held: list[bytes] | None = [] if watch is not None else None
        held_bytes = 0
        started = False

        async def flush() -> None:
            """The head, once, and what is held."""
            nonlocal held, started
            if not started:
                started = True
                head = {"type": "http.response.start", "status": self.status_code}
                await send({**head, "headers": headers})
            chunks, held = held or [], None
            for chunk in chunks:
                await self._out(chunk, send)

        if held is None:
            await flush()
        while True:
            try:
                chunk = await upstream.next_chunk()
            except BodyLost as exc:
                if not gone.is_set():
                    await flush()
                    await self._broken(exc, send)
                return None  # never the final empty chunk: the response stays unfinished
            if chunk is None:
                if rounds is not None:
                    rest = rounds.end()
                    if rest:
                        await flush()
                        await self._out(rest, send)
                if watch is not None and not watch.ended:
                    return await self._ended_early(held is not None, gone, send, flush)
                if rounds is not None and not gone.is_set():
                    following = await self._next_round(rounds, send, watcher, flush)
                    if following is not None:
                        upstream = self.upstream = following
                        watch = StreamEnd.of(self.dialect.name)
                        continue
                break
            if watch is not None:
                watch.feed(chunk)
            if rounds is not None:
                chunk = rounds.feed(chunk)
                if not chunk:
                    continue
            if held is None:
                await self._out(chunk, send)
                continue
            held.append(chunk)
            held_bytes += len(chunk)
            if watch is None or watch.said or held_bytes > HELD_AT_MOST:
                await flush()
        await flush()
        if self.tap is not None:
            self.tap.close()
        # The usage sits in the last events: the bookkeeping waits for them.
        self._answered()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return None

    async def _next_round(
        self,
        rounds: RoundSource,
        send: Send,
        watcher: asyncio.Future[None],
        flush: Callable[[], Awaitable[None]],
    ) -> UpstreamResponse | None:
        """The stream's next round; ``None`` when the answer is whole, the
        client left, or the round could not be had (the stream then ends with
        the API's error event)."""
        try:
            return await _unless_gone(rounds.next_round(), watcher)
        except ProxyError as exc:
            await flush()
            event = self.dialect.error_event(exc.message, exc.code or exc.type)
            await send({"type": "http.response.body", "body": event, "more_body": True})
            return None

    async def _out(self, chunk: bytes, send: Send) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if self.tap is not None:
            self.tap.feed(chunk)

    def _watch(self) -> StreamEnd | None:
        """A watcher of the stream's events, when its end is known (see :class:`Cut`)."""
        if self.cut is None or self.status_code != 200 or self.upstream.length is not None:
            return None
        if not (self.upstream.header("content-type") or "").startswith("text/event-stream"):
            return None
        return StreamEnd.of(self.dialect.name)

    async def _ended_early(
        self,
        unseen: bool,
        gone: asyncio.Event,
        send: Send,
        flush: Callable[[], Awaitable[None]],
    ) -> Callable[[], Awaitable[UpstreamResponse]] | None:
        """A stream that closed before its API's end, counted and logged; the
        request to send again when nothing of it reached the client, else the
        client's stream ends with the error event. A client that left was the
        cause: nothing is counted."""
        if gone.is_set():
            return None
        assert self.cut is not None
        again = self.cut.again if unseen else None
        self.cut.count()
        then = "asked again" if again is not None else "error event"
        log_cut(self.upstream.url, self.dialect.name, then)
        if again is None:
            await flush()
            event = dropped_event(self.dialect, lost=False)
            await send({"type": "http.response.body", "body": event, "more_body": False})
        return again

    async def _broken(self, exc: BodyLost, send: Send) -> None:
        log_broken(exc, self.upstream.url)
        if self.upstream.length is None and (self.upstream.header("content-type") or "").startswith(
            "text/event-stream"
        ):
            # The status went out already; an SSE client is told why its
            # stream stops before the connection is cut.
            event = dropped_event(self.dialect, lost=True)
            await send({"type": "http.response.body", "body": event, "more_body": True})


_T = TypeVar("_T")


async def _unless_gone(asking: Awaitable[_T], watcher: asyncio.Future[None]) -> _T | None:
    """``asking``'s result, or ``None`` once ``watcher`` saw the client leave
    first (``asking`` is then cancelled: its upstream request is closed)."""
    task = asyncio.ensure_future(asking)
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        return None
    return task.result()


@dataclass(frozen=True)
class Cut:
    """What a :class:`Relay` does with an event stream that closes before its
    API's end (:mod:`proxy.flow.stream_end`): an upstream error, whatever the
    connection said. It is counted, logged, and — when not one byte of it
    reached the client (it said nothing past its opening events) — asked
    once more; otherwise the client's stream ends with the API's error event,
    code ``upstream_dropped`` (an SDK raises it as the error it is)."""

    #: Counts it as the upstream error it is.
    count: Callable[[], None]
    #: Sends the same request once more; ``None``: no second try.
    again: Callable[[], Awaitable[UpstreamResponse]] | None = None


#: The most of a stream's opening events held back while it has said nothing.
HELD_AT_MOST = 64 << 10


async def _abort_on_disconnect(receive: Receive, relay: Relay, gone: asyncio.Event) -> None:
    """Wait for the client to leave; then abort what ``relay`` relays now."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            relay.upstream.abort()
            return


def relay_bytes(
    upstream: UpstreamResponse, body: bytes, extra_headers: Mapping[str, str]
) -> Response:
    """An already-read upstream response (an error), relayed as it was."""
    response = Response(body, status_code=upstream.status)
    response.raw_headers = [
        *_relayed_headers(upstream, extra_headers),
        (b"content-length", b"%d" % len(body)),
    ]
    return response


def error_response(
    error: ProxyError, extra_headers: Mapping[str, str] | None = None, *, path: str = ""
) -> Response:
    """``error`` answered to a request for ``path``, in that API's error shape."""
    return Response(
        error.json_bytes(path),
        status_code=error.status,
        media_type="application/json",
        headers=dict(extra_headers or {}),
    )
