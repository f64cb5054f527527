"""The answer relayed to the client: one :class:`Relay` for every answer.

A small answer of a known length is read whole and sent in one message; any
other is relayed chunk by chunk as it arrives, never re-chunked or held back
beyond a stream's opening events. An answer may come in rounds — the recall
loop's (:class:`RoundSource`, :mod:`proxy.recall.loop`) — which the client
reads as one answer. One watcher of the client's disconnect and one *after*
hook (the request's bookkeeping, once the client has the answer) serve every
path (docs/architecture.md, "One relay, in rounds").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.edge.errors import ProxyError
from proxy.flow.relay.stream_end import Cut, StreamEnd, dropped_event, log_broken, log_cut
from proxy.flow.send import error_response, log_failure, relayed_headers, shown_url, upstream_error
from proxy.flow.usage import UsageTap
from proxy.upstream.transport import BodyLost, UpstreamResponse

#: An answer of a declared length below this is read whole before it is
#: relayed (a JSON completion): a body that breaks is then a clean 502.
WHOLE_BELOW = 1 << 20

#: The request's bookkeeping, told the error the client was answered with in
#: the upstream's place (``None``: the upstream's answer went out as it came);
#: what it returns, if anything (a store write), is awaited after the relay.
After = Callable[[ProxyError | None], Awaitable[None] | None]


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

    def feed(self, chunk: bytes) -> bytes:
        """A streamed round's next chunk in; the bytes to relay now."""
        ...

    def end(self) -> bytes:
        """The round's stream ended; what is still held, to relay."""
        ...

    async def next_round(self) -> UpstreamResponse | None:
        """After a round streamed to its end: the next, or ``None`` when the answer is whole."""
        ...

    async def next_answer(self, body: bytes) -> UpstreamResponse | bytes:
        """After a whole round, ``body``: the next round, or the client's answer."""
        ...

    def restart(self) -> None:
        """The first round is asked again (its stream said nothing): read it afresh."""
        ...


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
    figures), told how the answer ended (:data:`After`): called once, as
    soon as the client has its answer — a whole body, or a stream's last
    chunk, when ``tap`` has read the answer's usage — or, if the answer did
    not go out whole, once the relay ends. It runs in
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
        after: After | None = None,
        cut: Cut | None = None,
        rounds: RoundSource | None = None,
    ) -> None:
        self.upstream = upstream
        self._after = after
        #: The error the client was answered with instead of an answer, if one was.
        self._failed: ProxyError | None = None
        self._pending: Awaitable[None] | None = None
        self._extra = extra_headers
        #: What to do with a stream of ``dialect`` that ends before its end
        #: (``None``: relayed as it came, for a route whose API is not known).
        self.cut = cut
        #: Whose error event a broken stream ends with.
        self.dialect = dialect
        self.rounds = rounds
        self.status_code = upstream.status
        self.raw_headers = relayed_headers(upstream, extra_headers)
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
                if rounds is not None:
                    rounds.restart()
                answer = await again()
                relay = Relay(answer, self._extra, self.tap, self.dialect, after, cut, rounds)
                await relay(scope, receive, send)
        finally:
            if not self.upstream.over:  # not read to its end: its connection closes now
                self.upstream.abort()
            self._run_after()
            if self._pending is not None:
                await self._pending

    def _run_after(self) -> None:
        """The client has its answer (or the relay ended): ``after``, once."""
        after, self._after = self._after, None
        if after is not None:
            self._pending = after(self._failed)

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
                self.raw_headers = relayed_headers(upstream, self._extra)
                body = await upstream.read()
        except BodyLost as exc:
            if watcher is not None and watcher.done():
                return  # the client left, and the read was stopped for it
            error = upstream_error(exc)
            log_failure(error, shown_url(upstream.url), f"upstream answer broke: {exc}")
            self._failed = error
            await error_response(error, path=scope.get("path", ""))(scope, receive, send)
            return
        except ProxyError as error:
            self._failed = error
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
        self._run_after()

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
                    await self._end_broken(exc, send)
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
                        await flush()  # a later round is never asked again unseen
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
        self._run_after()
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
            self._failed = exc
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

    async def _end_broken(self, exc: BodyLost, send: Send) -> None:
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
            # Its request closed (and counted out) before the relay goes on.
            await asyncio.wait((task,))
    if task.cancelled():
        return None
    return task.result()


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


__all__ = ["HELD_AT_MOST", "WHOLE_BELOW", "After", "Relay", "RoundSource"]
