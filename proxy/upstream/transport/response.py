"""A response whose head is in: status and headers now, the body as it arrives."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from proxy.upstream.transport.errors import BodyLost


class UpstreamResponse:
    """The upstream's answer, read once: whole (:meth:`read`) or chunk by chunk.

    Body errors — cut short, reset, malformed framing, a read timeout — raise
    :class:`BodyLost`; the connection then closes. A body read to its end
    gives the connection back to the pool.

    ``on_end``, when set, is told once, when the answer is over — read to its
    end, released or aborted (:meth:`proxy.upstream.traffic.Sending.answered`
    counts the request in flight until then). ``over`` says it has been: an
    answer over needs no :meth:`abort`.
    """

    __slots__ = (
        "__weakref__",
        "_ahead",
        "_closing",
        "_response",
        "head_bytes",
        "length",
        "on_end",
        "over",
        "raw_headers",
        "status",
    )

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        #: As received, names lower-cased (ASGI's form); repeated headers kept.
        self.raw_headers: list[tuple[bytes, bytes]] = []
        #: The head's size, its names and values (what the transport limits),
        #: counted in the same pass as the names are lower-cased.
        self.head_bytes = 0
        for name, value in response.raw_headers:
            self.raw_headers.append((name.lower(), value))
            self.head_bytes += len(name) + len(value)
        #: The declared ``Content-Length``; ``None`` for chunked or read-until-close.
        self.length = response.content_length
        self._ahead: bytes | None = None
        self.on_end: Callable[[], None] | None = None
        #: True once read to its end, released or aborted.
        self.over = False
        #: For a body that ends when the connection closes: how it closed. A
        #: reset is a broken body, which aiohttp would end as cleanly as a FIN.
        self._closing: asyncio.Future[None] | None = None
        connection = response.connection
        protocol = connection.protocol if connection is not None else None
        if (
            self.length is None
            and "transfer-encoding" not in response.headers
            and protocol is not None
        ):
            closing = protocol.closed
            if closing is not None:
                closing.add_done_callback(_retrieve)
                self._closing = closing

    @property
    def url(self) -> str:
        """Where it came from, for the log line of a failure (may hold a query,
        never printed raw); made into text only then."""
        return str(self._response.url)

    def header(self, name: str) -> str | None:
        return self._response.headers.get(name)

    async def next_chunk(self) -> bytes | None:
        """The next body bytes as received, ``None`` at the end."""
        if self._ahead is not None:
            chunk, self._ahead = self._ahead, None
            return chunk or None
        try:
            chunk = await self._response.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.abort()
            raise BodyLost(_body_failure(exc)) from exc
        if not chunk:
            closing = self._closing
            if closing is not None and closing.done() and closing.exception() is not None:
                self.abort()
                raise BodyLost("the upstream connection was reset mid-body")
            self.release()
            return None
        return chunk

    async def read(self, limit: int = 1 << 20) -> bytes:
        """The whole body, or :class:`BodyLost`; a body above ``limit`` bytes is
        cut there (and the connection closed)."""
        if self._ahead is None and self.length is not None and self.length <= limit:
            try:  # a declared length within the limit: aiohttp reads it in one go
                body = await self._response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.abort()
                raise BodyLost(_body_failure(exc)) from exc
            self.release()
            return body
        return await self._gathered(limit)

    async def _gathered(self, limit: int) -> bytes:
        """The body chunk by chunk, cut at ``limit`` bytes."""
        parts: list[bytes] = []
        size = 0
        while size < limit:
            chunk = await self.next_chunk()
            if chunk is None:
                break
            parts.append(chunk)
            size += len(chunk)
        self.release()
        return b"".join(parts)[:limit]

    async def wait_body(self) -> bool:
        """Whether any body bytes come before the body ends; they stay to be read."""
        try:
            chunk = await self.next_chunk()
        except BodyLost:
            return False
        self._ahead = chunk or b""
        return chunk is not None

    def release(self) -> None:
        """Done with it: a body read to its end returns the connection to the
        pool, any other closes it. Idempotent."""
        self._response.release()
        if not self.over:
            self.over = True
            if self.on_end is not None:
                self.on_end()

    def abort(self) -> None:
        """Stop now (the client left, the body broke): the connection is closed."""
        self._response.close()
        if not self.over:
            self.over = True
            if self.on_end is not None:
                self.on_end()


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a closing error as seen: nobody else may ever look at it."""
    if not future.cancelled():
        future.exception()


def _body_failure(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "the upstream stopped sending"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the upstream's body was cut short or malformed"
    return "the upstream connection broke mid-body"
