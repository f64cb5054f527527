"""The pool: keep-alive connections per upstream, and writing requests onto them."""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Iterable
from urllib.parse import urlsplit

from proxy.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.transport.connection import Connection, Origin, UpstreamResponse


@functools.lru_cache(maxsize=256)  # a handful of upstream URLs, parsed on every request
def split_url(url: str) -> tuple[Origin, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    return Origin(parts.scheme, parts.hostname, port), target


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
        self._idle: dict[Origin, list[Connection]] = {}
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
        origin, target = split_url(url)
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
                connection, self.release, self._read_timeout, bodyless=method == "HEAD"
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

    def release(self, connection: Connection, reusable: bool) -> None:
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

    def _idle_connection(self, origin: Origin) -> Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
        return None

    async def _connect(self, origin: Origin) -> Connection:
        loop = asyncio.get_running_loop()
        context = None
        if origin.scheme == "https":
            if self._ssl is None:
                self._ssl = _default_ssl_context()
            context = self._ssl
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Connection(origin),
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
    connection: Connection,
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


def _request_head(
    method: str,
    target: str,
    origin: Origin,
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
