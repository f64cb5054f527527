"""The upstream connection pool: a lean HTTP/1.1 client for relaying.

Why not httpx here: every relayed request pays its client's cost on the hot
path, and on the bench machine ``httpx.AsyncClient.send`` of a small chat
request took 1.27 ms of CPU (httpcore alone 0.76 ms) against 0.05 ms for a
plain asyncio protocol with the ``httptools`` parser (the C parser uvicorn
serves with; ``/tmp`` script in the issue 5 note). The proxy relays; it
needs keep-alive, TLS, timeouts, streaming and nothing else — no cookies,
redirects, auth flows, decoding or proxies-from-environment. httpx stays for
the proxy's own calls (the summarizer), where convenience beats microseconds.

Semantics, chosen to match what the httpx client did before:

* ``connect_timeout`` bounds opening a connection and waiting for a free one
  in the pool; ``read_timeout`` bounds each wait for upstream bytes (headers,
  then every body chunk) — a timeout raises :class:`UpstreamTimeout`.
* Failures to connect or a connection lost before the response headers raise
  :class:`UpstreamUnreachable`; lost mid-body, iteration raises
  :class:`BodyLost`. A request sent on a *reused* connection that the server
  closes without answering a single byte is sent once more on a new one: it
  is how an idle keep-alive connection closed by the server at that instant
  looks, and the server cannot have acted on it.
* The upstream is asked for ``accept-encoding: identity``: the relayed bytes
  are the bytes received, and error bodies can be read for overflow wordings.
* Connections go back to the pool only after a complete response with
  keep-alive; an abandoned response closes its connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from proxy.errors import UpstreamTimeout, UpstreamUnreachable

#: Stop reading from the upstream while this many body bytes wait for a slow
#: client; resume below a quarter of it.
HIGH_WATER = 1 << 20


class BodyLost(Exception):
    """The upstream connection broke after the response headers were relayed."""


@dataclass(frozen=True)
class _Origin:
    scheme: str
    host: str
    port: int

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@functools.lru_cache(maxsize=256)  # a handful of upstream URLs, parsed on every request
def _split(url: str) -> tuple[_Origin, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    return _Origin(parts.scheme, parts.hostname, port), target


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one response in flight."""

    def __init__(self, origin: _Origin) -> None:
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
        self, connection: _Connection, pool: Transport, read_timeout: float, *, bodyless: bool
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
        self._pool = pool
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
        self._pool.release(self._connection, reusable=reusable)

    def _consumed(self, size: int) -> None:
        self._buffered -= size
        transport = self._connection.transport
        if self._paused and self._buffered * 4 <= HIGH_WATER and transport is not None:
            self._paused = False
            transport.resume_reading()


class Transport:
    """Keep-alive connections to the upstream(s), opened on demand."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_connections: int,
        max_keepalive: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_keepalive = max_keepalive
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._ssl = ssl_context
        self._closed = False

    async def request(
        self,
        method: str,
        url: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | AsyncIterator[bytes] | None,
    ) -> UpstreamResponse:
        """Send a request and return once the response headers are in.

        ``body`` is bytes (sent with a length) or an async iterator (sent
        chunked, as it is read; such a request is never sent twice).
        """
        origin, target = _split(url)
        length = len(body) if isinstance(body, bytes) else (0 if body is None else None)
        head = _request_head(method, target, origin, headers, length)
        await self._take_slot()
        retry = length is not None
        while True:
            connection = self._idle_connection(origin)
            reused = connection is not None
            if connection is None:
                try:
                    connection = await self._connect(origin)
                except BaseException:
                    self._slots.release()
                    raise
            response = UpstreamResponse(
                connection, self, self._read_timeout, bodyless=method == "HEAD"
            )
            connection.start(response)
            try:
                await _write_request(connection, head, body, self._read_timeout)
                await response.wait_headers()
            except UpstreamUnreachable:
                response.release()
                if retry and reused and not response.received:
                    retry = False
                    await self._take_slot()  # the second try takes a slot again
                    continue
                raise
            except BaseException:
                response.abort()  # a timeout or cancellation leaves the connection unusable
                raise
            return response

    async def _take_slot(self) -> None:
        if not self._slots.locked():
            await self._slots.acquire()  # free: no suspension, no timer
            return
        try:
            await asyncio.wait_for(self._slots.acquire(), self._connect_timeout)
        except TimeoutError as exc:
            raise UpstreamTimeout("No upstream connection became free in time.") from exc

    def release(self, connection: _Connection, *, reusable: bool) -> None:
        connection.response = None
        idle = self._idle.setdefault(connection.origin, [])
        if (
            reusable
            and not connection.closed
            and not self._closed
            and len(idle) < self._max_keepalive
        ):
            idle.append(connection)
        else:
            connection.close()
        self._slots.release()

    async def aclose(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    # --- connections ---------------------------------------------------------

    def _idle_connection(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
        return None

    async def _connect(self, origin: _Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        context = None
        if origin.scheme == "https":
            if self._ssl is None:
                self._ssl = _default_ssl_context()
            context = self._ssl
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(origin),
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if context else None,
                ),
                self._connect_timeout,
            )
        except TimeoutError as exc:
            raise UpstreamTimeout("Connecting to the upstream timed out.") from exc
        except OSError as exc:
            raise UpstreamUnreachable("The upstream could not be reached.") from exc
        return connection


#: Bodies at least this large are written apart from the head, not copied onto it.
_JOIN_BELOW = 64 * 1024


async def _write_request(
    connection: _Connection,
    head: bytes,
    body: bytes | AsyncIterator[bytes] | None,
    timeout: float,
) -> None:
    if body is None:
        await connection.write(head, timeout)
    elif isinstance(body, bytes):
        if len(body) < _JOIN_BELOW:
            await connection.write(head + body, timeout)
        else:
            await connection.write(head, timeout)
            await connection.write(body, timeout)
    else:
        await connection.write(head, timeout)
        async for chunk in body:
            if chunk:
                await connection.write(b"%x\r\n%b\r\n" % (len(chunk), chunk), timeout)
        await connection.write(b"0\r\n\r\n", timeout)


def _expire(future: asyncio.Future[None], message: str) -> None:
    if not future.done():
        future.set_exception(UpstreamTimeout(message))


def _request_head(
    method: str,
    target: str,
    origin: _Origin,
    headers: Iterable[tuple[str, str]],
    length: int | None,
) -> bytes:
    """Request line and headers; ``length`` None means a chunked body."""
    lines = [f"{method} {target} HTTP/1.1", f"host: {origin.authority}"]
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    lines.append("accept-encoding: identity")
    if length is None:
        lines.append("transfer-encoding: chunked")
    elif length or method not in ("GET", "HEAD", "OPTIONS", "DELETE"):
        lines.append(f"content-length: {length}")
    try:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ValueError("a header value is not latin-1") from exc


def _default_ssl_context() -> ssl.SSLContext:
    """The system's trust store, or certifi's bundle (as httpx uses) when installed."""
    try:
        import certifi
    except ImportError:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())
