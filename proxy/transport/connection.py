"""One upstream connection and the response it carries.

:class:`Connection` is an asyncio protocol that feeds the ``httptools``
response parser; :class:`UpstreamResponse` is what the relay reads: status
and headers once they are in, the body chunk by chunk as it arrives, with
a read timeout on every wait and reading paused while a slow client lets
more than :data:`HIGH_WATER` bytes pile up. The pool (``pool.py``) decides
what happens to the connection afterwards.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

from proxy.errors import UpstreamTimeout, UpstreamUnreachable

#: Stop reading from the upstream while this many body bytes wait for a slow
#: client; resume below a quarter of it.
HIGH_WATER = 1 << 20


class BodyLost(Exception):
    """The upstream connection broke after the response headers were relayed."""


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


class Connection(asyncio.Protocol):
    """One keep-alive connection; at most one response in flight."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.response: UpstreamResponse | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._writable: asyncio.Future[None] | None = None

    # --- asyncio.Protocol --------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they behave as one.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete:
            self.close()  # bytes nobody asked for: the connection is not in a known state
            return
        response.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response.fail(f"unparseable upstream response: {exc}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        response = self.response
        if response is not None and not response.complete:
            if response.until_close and response.status and exc is None:
                response.finish()  # no length, no chunking: the body ends with the connection
            else:
                response.fail("upstream connection closed")

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # --- httptools callbacks -----------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.raw_headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        response.status = self._parser.get_status_code()
        if 100 <= response.status < 200:  # an interim answer: the real one follows
            response.status = 0
            response.raw_headers.clear()
            return
        names = {name for name, _ in response.raw_headers}
        response.until_close = b"content-length" not in names and b"transfer-encoding" not in names
        if b"content-length" in names and b"transfer-encoding" not in names:
            with contextlib.suppress(ValueError):  # the parser has refused a bad one already
                response.length = int(response.header("content-length") or "")
        response.headers_done()
        if response.bodyless:
            # A HEAD answer states a length it does not send, which the parser
            # cannot know; the connection is closed rather than left ambiguous.
            response.keep_alive = False
            response.finish()
            self.close()

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response.push(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is not None and response.status:
            response.keep_alive = self._parser.should_keep_alive()
            response.finish()

    # --- used by the pool ----------------------------------------------------

    def start(self, response: UpstreamResponse) -> None:
        self.response = response
        self._parser = httptools.HttpResponseParser(self)

    async def write(self, data: bytes, timeout: float) -> None:
        """Write, then wait (at most ``timeout``) while the upstream is not reading."""
        assert self.transport is not None
        self.transport.write(data)
        if self._writable is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._writable), timeout)
            except TimeoutError as exc:
                raise UpstreamTimeout("The upstream did not read the request in time.") from exc

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping whatever is still unsent."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class UpstreamResponse:
    """An upstream answer: status and headers now, the body as it arrives."""

    def __init__(
        self,
        connection: Connection,
        release: Callable[[Connection, bool], None],
        read_timeout: float,
        *,
        bodyless: bool,
    ) -> None:
        self.status = 0
        self.bodyless = bodyless  #: the answer to a HEAD request
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.keep_alive = False
        self.until_close = False
        self.length: int | None = None  #: the body's declared content-length
        self.received = False  #: any byte arrived
        self._connection = connection
        self._release = release
        self._read_timeout = read_timeout
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._error: str | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._headers = asyncio.get_running_loop().create_future()
        self._released = False

    # --- fed by the connection ---------------------------------------------

    def headers_done(self) -> None:
        if not self._headers.done():
            self._headers.set_result(None)

    def push(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        transport = self._connection.transport
        if self._buffered > HIGH_WATER and not self._paused and transport is not None:
            self._paused = True
            transport.pause_reading()
        self._wake()

    def finish(self) -> None:
        self.complete = True
        self.headers_done()
        self._wake()

    def fail(self, reason: str) -> None:
        self._error = reason
        self.headers_done()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # --- read by the relay ---------------------------------------------------

    async def wait_headers(self) -> None:
        if not self._headers.done():
            await self._within_read_timeout(self._headers, "The upstream did not answer in time.")
        if not self.status:
            raise UpstreamUnreachable("The upstream closed the connection without an answer.")

    def header(self, name: str) -> str | None:
        wanted = name.encode("latin-1")
        for key, value in self.raw_headers:
            if key == wanted:
                return value.decode("latin-1")
        return None

    @property
    def headers(self) -> list[tuple[str, str]]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw_headers]

    def take_buffered(self) -> bytes:
        """Every body byte received so far, removed from the buffer."""
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._consumed(len(data))
        return data

    async def wait_complete(self) -> None:
        """Wait until the whole body is in (or broke), without taking any of it.

        For bodies below :data:`HIGH_WATER` only: a larger one would pause
        reading and never complete.
        """
        while not self.complete and self._error is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._within_read_timeout(self._waiter, "the upstream stopped sending")
            except UpstreamTimeout:
                self._connection.abort()
                self.fail("the upstream stopped sending")

    async def wait_body(self) -> bool:
        """Wait for the first body bytes without taking them: whether any came
        before the body ended (``False`` for an empty or broken body)."""
        while not self._chunks and not self.complete and self._error is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._within_read_timeout(self._waiter, "the upstream stopped sending")
            except UpstreamTimeout:
                self.abort()
                return False
        return bool(self._chunks)

    async def next_chunk(self) -> bytes | None:
        """The next body chunk as received, None at the end; :class:`BodyLost` if it broke.

        The connection is released when the body ends or breaks.
        """
        while not self._chunks:
            if self.complete or self._error is not None:
                self.release()
                if self.complete:
                    return None
                raise BodyLost(self._error)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._within_read_timeout(self._waiter, "the upstream stopped sending")
            except UpstreamTimeout as exc:
                self.abort()
                raise BodyLost("the upstream stopped sending") from exc
        chunk = self._chunks.popleft()
        self._consumed(len(chunk))
        return chunk

    async def read(self, limit: int = 1 << 20) -> bytes:
        """The body, at most ``limit`` bytes (a broken body ends early), then release."""
        parts: list[bytes] = []
        size = 0
        try:
            while size < limit:
                chunk = await self.next_chunk()
                if chunk is None:
                    break
                parts.append(chunk)
                size += len(chunk)
        except BodyLost:
            pass
        self.release()
        return b"".join(parts)

    async def _within_read_timeout(self, future: asyncio.Future[None], message: str) -> None:
        timer = asyncio.get_running_loop().call_later(self._read_timeout, _expire, future, message)
        try:
            await future
        finally:
            timer.cancel()

    def abort(self) -> None:
        """Stop now (the client went away): the connection is closed, readers end."""
        if not self.complete:
            self._connection.abort()
            self.fail("aborted")
        self.release()

    def release(self) -> None:
        """Hand the connection back (complete) or close it (not); idempotent."""
        if self._released:
            return
        self._released = True
        reusable = self.complete and self.keep_alive
        transport = self._connection.transport
        if reusable and self._paused and not self._connection.closed and transport is not None:
            # Completed with reading paused (body unread): pooled paused, the
            # connection would never hear its next answer.
            self._paused = False
            transport.resume_reading()
        self._release(self._connection, reusable)

    def _consumed(self, size: int) -> None:
        self._buffered -= size
        transport = self._connection.transport
        if self._paused and self._buffered * 4 <= HIGH_WATER and transport is not None:
            self._paused = False
            transport.resume_reading()


def _expire(future: asyncio.Future[None], message: str) -> None:
    if not future.done():
        future.set_exception(UpstreamTimeout(message))
