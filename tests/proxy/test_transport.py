"""proxy.transport (connection and pool) against a scripted raw HTTP server on loopback.

Each test gives ``_Upstream`` a handler coroutine that reads requests and
writes exact bytes, so every behaviour (a stall, a drop mid-body, an idle
connection closed at the wrong moment) is provoked on a real socket. The
server counts the connections it accepts and records the requests it read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
import trustme
import uvloop

from proxy.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.transport import HIGH_WATER, BodyLost, Transport, UpstreamResponse


@dataclass(frozen=True)
class _Received:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


class _Peer:
    """One accepted connection, as a handler sees it."""

    def __init__(self, upstream: _Upstream, index: int, reader: Any, writer: Any) -> None:
        self.upstream = upstream
        self.index = index  #: 1 for the first connection the server accepted
        self.reader: asyncio.StreamReader = reader
        self.writer: asyncio.StreamWriter = writer

    async def request(self) -> _Received | None:
        """The next request (chunked bodies decoded), None when the client closed."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        line, *fields = head.decode("latin-1").split("\r\n")
        method, target, _ = line.split(" ")
        headers = {}
        for field in filter(None, fields):
            name, _, value = field.partition(":")
            headers[name.lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int((await self.reader.readuntil(b"\r\n"))[:-2], 16):
                body += (await self.reader.readexactly(size + 2))[:-2]
            await self.reader.readexactly(2)
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", 0)))
        received = _Received(method, target, headers, body)
        self.upstream.requests.append(received)
        return received

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def wait_eof(self) -> float:
        """Read until the client closes; the loop time it did."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(65536):
                pass
        return asyncio.get_running_loop().time()


Handler = Callable[[_Peer], Awaitable[None]]


class _Upstream:
    """A raw HTTP/1.1 server on 127.0.0.1 whose every connection runs ``handler``."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.requests: list[_Received] = []
        self.url = ""
        self._peers: dict[asyncio.Task[Any], _Peer] = {}

    async def __aenter__(self) -> _Upstream:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for task, peer in list(self._peers.items()):
            peer.writer.close()
            task.cancel()
        await asyncio.gather(*self._peers, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._peers[task] = _Peer(self, self.connections, reader, writer)
        try:
            await self.handler(self._peers[task])
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def _ok(body: bytes = b"hello", *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in (*headers, f"content-length: {len(body)}"))
    return f"HTTP/1.1 200 OK\r\n{head}\r\n".encode() + body


def _answering(response: bytes) -> Handler:
    """Answer every request with ``response`` until the client closes."""

    async def handler(peer: _Peer) -> None:
        while await peer.request() is not None:
            await peer.send(response)

    return handler


def _in_a_loop(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """The project's test shape: a sync test that runs its body under asyncio.run."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


@contextlib.asynccontextmanager
async def _pool(**overrides: Any) -> AsyncIterator[Transport]:
    options: dict[str, Any] = {
        "connect_timeout": 1.0,
        "read_timeout": 1.0,
        "max_connections": 4,
        "max_keepalive": 4,
    }
    transport = Transport(**(options | overrides))
    try:
        yield transport
    finally:
        await transport.aclose()
        await asyncio.sleep(0)  # let closed sockets finish closing before the loop ends


async def _get(transport: Transport, url: str, body: Any = None) -> UpstreamResponse:
    return await transport.request("GET" if body is None else "POST", url, [], body)


async def _chunks(response: UpstreamResponse) -> list[bytes]:
    chunks = []
    while (chunk := await response.next_chunk()) is not None:
        chunks.append(chunk)
    return chunks


# --- response framing ---------------------------------------------------------


@_in_a_loop
async def test_content_length_response_on_a_kept_alive_connection() -> None:
    async with _Upstream(_answering(_ok(b"hello", "x-id: 7"))) as up, _pool() as transport:
        response = await _get(transport, up.url)
        assert (response.status, response.header("x-id")) == (200, "7")
        assert ("content-length", "5") in response.headers
        assert await response.read() == b"hello"
        for _ in range(2):
            assert await (await _get(transport, up.url)).read() == b"hello"
        assert up.connections == 1  # kept alive


@_in_a_loop
async def test_chunked_response_arrives_chunk_by_chunk_then_whole() -> None:
    go_on: asyncio.Queue[None] = asyncio.Queue()

    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for word in (b"alpha", b"beta"):
            await peer.send(b"%x\r\n%b\r\n" % (len(word), word))
            await go_on.get()  # the next chunk only once the client holds this one
        await peer.send(b"0\r\n\r\n")
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await peer.send(b"3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n")
        await peer.wait_eof()

    async with _Upstream(handler) as up, _pool() as transport:
        response = await _get(transport, up.url)
        assert await response.next_chunk() == b"alpha"
        go_on.put_nowait(None)
        assert await response.next_chunk() == b"beta"
        go_on.put_nowait(None)
        assert await response.next_chunk() is None
        assert await (await _get(transport, up.url)).read() == b"onetwo"
        assert up.connections == 1


@_in_a_loop
async def test_body_without_length_ends_at_connection_close() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\n\r\npart one, ")
        await peer.send(b"part two")

    async with _Upstream(handler) as up, _pool() as transport:
        response = await _get(transport, up.url)
        assert b"".join(await _chunks(response)) == b"part one, part two"


@_in_a_loop
async def test_interim_100_continue_is_skipped() -> None:
    interim = b"HTTP/1.1 100 Continue\r\nx-interim: yes\r\n\r\n"
    async with _Upstream(_answering(interim + _ok(b"final"))) as up, _pool() as transport:
        response = await _get(transport, up.url, b"{}")
        assert response.status == 200
        assert response.header("x-interim") is None
        assert await response.read() == b"final"


@_in_a_loop
async def test_head_answer_with_a_length_and_no_body_does_not_hang() -> None:
    async def handler(peer: _Peer) -> None:
        while (request := await peer.request()) is not None:
            head = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n"
            await peer.send(head if request.method == "HEAD" else _ok())

    async with _Upstream(handler) as up, _pool(max_connections=1) as transport:
        response = await transport.request("HEAD", up.url, [], None)
        assert (response.status, response.header("content-length")) == (200, "10")
        assert await asyncio.wait_for(response.read(), 0.5) == b""
        assert await (await _get(transport, up.url)).read() == b"hello"  # the slot came back
        assert up.connections == 2  # a HEAD answer's connection is not reused


# --- keep-alive and the retry -------------------------------------------------


@_in_a_loop
async def test_connection_close_response_is_not_reused() -> None:
    async with _Upstream(_answering(_ok(b"x", "connection: close"))) as up, _pool() as t:
        assert await (await _get(t, up.url)).read() == b"x"
        assert await (await _get(t, up.url)).read() == b"x"
        assert up.connections == 2


@_in_a_loop
async def test_idle_connection_closed_by_the_server_is_replaced() -> None:
    closed = asyncio.Event()

    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(_ok())
        if peer.index == 1:
            closed.set()  # the handler returns: the connection closes while idle
            return
        await peer.wait_eof()

    async with _Upstream(handler) as up, _pool() as transport:
        await (await _get(transport, up.url)).read()
        await closed.wait()
        await asyncio.sleep(0.05)
        assert await (await _get(transport, up.url)).read() == b"hello"
        assert up.connections == 2


@_in_a_loop
async def test_reused_connection_closed_without_an_answer_is_retried_once() -> None:
    async def handler(peer: _Peer) -> None:
        if peer.index == 1:
            await peer.request()
            await peer.send(_ok(b"first"))
            await peer.request()  # read and never answered: the close the retry is for
            return
        await _answering(_ok(b"second"))(peer)

    async with _Upstream(handler) as up, _pool() as transport:
        assert await (await _get(transport, up.url)).read() == b"first"
        assert await (await _get(transport, up.url, b"{}")).read() == b"second"
        assert up.connections == 2
        assert [r.body for r in up.requests] == [b"", b"{}", b"{}"]


@_in_a_loop
async def test_streamed_body_on_a_reused_connection_is_not_sent_twice() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(_ok(b"first"))
        await peer.request()

    async def body() -> AsyncIterator[bytes]:
        yield b"once"

    async with _Upstream(handler) as up, _pool() as transport:
        await (await _get(transport, up.url)).read()
        with pytest.raises(UpstreamUnreachable):
            await _get(transport, up.url, body())
        assert up.connections == 1


@_in_a_loop
async def test_fresh_connection_closed_without_an_answer_is_not_retried() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()

    async with _Upstream(handler) as up, _pool() as transport:
        with pytest.raises(UpstreamUnreachable):
            await _get(transport, up.url, b"{}")
        assert up.connections == 1


# --- failures and timeouts ------------------------------------------------------


@_in_a_loop
async def test_connection_refused_is_unreachable() -> None:
    async with _Upstream(_answering(_ok())) as up:
        url = up.url  # a port that was just free, now closed
    async with _pool() as transport:
        with pytest.raises(UpstreamUnreachable):
            await _get(transport, url)


@_in_a_loop
async def test_silent_server_times_out_after_read_timeout() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.wait_eof()

    async with _Upstream(handler) as up, _pool(read_timeout=0.2) as transport:
        started = time.perf_counter()
        with pytest.raises(UpstreamTimeout):
            await _get(transport, up.url)
        assert 0.15 < time.perf_counter() - started < 1.0


@_in_a_loop
async def test_stall_after_headers_loses_the_body_after_read_timeout() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nsome")
        await peer.wait_eof()

    async with _Upstream(handler) as up, _pool(read_timeout=0.2) as transport:
        response = await _get(transport, up.url)
        assert await response.next_chunk() == b"some"
        started = time.perf_counter()
        with pytest.raises(BodyLost):
            await response.next_chunk()
        assert 0.15 < time.perf_counter() - started < 1.0


@_in_a_loop
async def test_waiting_for_a_whole_body_that_arrives_late_takes_none_of_it() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello")
        await asyncio.sleep(0.05)  # the rest comes in a later segment
        await peer.send(b"world")
        await peer.wait_eof()

    async with _Upstream(handler) as up, _pool() as transport:
        response = await _get(transport, up.url)
        assert response.length == 10 and not response.complete
        await response.wait_complete()
        assert response.complete and response.take_buffered() == b"helloworld"


@_in_a_loop
async def test_waiting_for_a_whole_body_that_stalls_ends_in_a_lost_body() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nsome")
        await peer.wait_eof()

    async with _Upstream(handler) as up, _pool(read_timeout=0.2) as transport:
        response = await _get(transport, up.url)
        started = time.perf_counter()
        await response.wait_complete()
        assert 0.15 < time.perf_counter() - started < 1.0 and not response.complete
        assert await response.next_chunk() == b"some"  # what did arrive is still there
        with pytest.raises(BodyLost):
            await response.next_chunk()


@_in_a_loop
async def test_drop_mid_body_loses_the_body_and_the_connection() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        if peer.index == 1:
            await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nsome")
            return
        await peer.send(_ok())
        await peer.wait_eof()

    async with _Upstream(handler) as up, _pool() as transport:
        response = await _get(transport, up.url)
        with pytest.raises(BodyLost):
            await _chunks(response)
        assert await (await _get(transport, up.url)).read() == b"hello"
        assert up.connections == 2


@_in_a_loop
async def test_reset_during_a_body_without_length_loses_the_body() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\n\r\npartial")
        await asyncio.sleep(0.05)
        linger = struct.pack("ii", 1, 0)  # closing now sends RST, not FIN
        peer.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)

    async with _Upstream(handler) as up, _pool() as transport:
        with pytest.raises(BodyLost):
            await _chunks(await _get(transport, up.url))


@_in_a_loop
async def test_upstream_that_never_reads_the_body_times_out() -> None:
    async with _Upstream(lambda peer: asyncio.sleep(5)) as up, _pool(read_timeout=0.2) as t:
        with pytest.raises(UpstreamTimeout):
            await asyncio.wait_for(_get(t, up.url, b"x" * (32 << 20)), 1.0)


# --- the pool -------------------------------------------------------------------


@_in_a_loop
async def test_a_held_response_makes_the_next_request_wait_for_its_slot() -> None:
    async with (
        _Upstream(_answering(_ok())) as up,
        _pool(max_connections=1, connect_timeout=0.2) as transport,
    ):
        held = await _get(transport, up.url)
        with pytest.raises(UpstreamTimeout):
            await _get(transport, up.url)
        waiting = asyncio.ensure_future(_get(transport, up.url))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        held.release()
        assert await (await waiting).read() == b"hello"
        assert up.connections == 1


@_in_a_loop
async def test_abort_mid_stream_closes_at_once_and_frees_the_slot() -> None:
    eof_at: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def handler(peer: _Peer) -> None:
        if peer.index > 1:
            return await _answering(_ok())(peer)
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        eof_at.set_result(await peer.wait_eof())

    async with _Upstream(handler) as up, _pool(max_connections=1) as transport:
        response = await _get(transport, up.url)
        assert await response.next_chunk() == b"first"
        aborted = asyncio.get_running_loop().time()
        response.abort()
        assert await asyncio.wait_for(eof_at, 1.0) - aborted < 1.0
        with pytest.raises(BodyLost):
            await response.next_chunk()
        assert await (await _get(transport, up.url)).read() == b"hello"


# --- the request ----------------------------------------------------------------


@_in_a_loop
async def test_header_with_a_line_break_is_refused_before_sending() -> None:
    async with _Upstream(_answering(_ok())) as up, _pool(max_connections=1) as transport:
        with pytest.raises(ValueError, match="line break"):
            await transport.request("GET", up.url, [("x-a", "1\r\nx-b: 2")], None)
        assert up.connections == 0
        assert await (await _get(transport, up.url)).read() == b"hello"  # no slot was taken


@_in_a_loop
async def test_request_head_carries_target_host_identity_encoding_and_length() -> None:
    async with _Upstream(_answering(_ok())) as up, _pool() as transport:
        headers = [("authorization", "Bearer k"), ("content-type", "application/json")]
        target = "/openai/v1/chat?api-version=2024-06"
        await (await transport.request("POST", up.url + target, headers, b'{"a":1}')).read()
        await (await _get(transport, up.url)).read()
        seen, bare = up.requests
        assert (seen.method, seen.target, seen.body) == ("POST", target, b'{"a":1}')
        assert (bare.target, "content-length" in bare.headers) == ("/", False)
        assert seen.headers == {
            "host": f"127.0.0.1:{up.port}",
            "authorization": "Bearer k",
            "content-type": "application/json",
            "accept-encoding": "identity",
            "content-length": "7",
        }


@_in_a_loop
async def test_async_iterator_body_is_sent_chunked_and_arrives_intact() -> None:
    parts = [b"x" * 70_000, b"", b"y", bytes(range(256)) * 50]

    async def body() -> AsyncIterator[bytes]:
        for part in parts:
            await asyncio.sleep(0)
            yield part

    async with _Upstream(_answering(_ok())) as up, _pool() as transport:
        await (await _get(transport, up.url, body())).read()
        (seen,) = up.requests
        assert seen.headers["transfer-encoding"] == "chunked"
        assert "content-length" not in seen.headers
        assert seen.body == b"".join(parts)


# --- backpressure and event loops ---------------------------------------------


@_in_a_loop
async def test_slow_reader_gets_a_large_body_intact_with_bounded_buffering() -> None:
    body = bytes(range(256)) * (5 * 1024 * 4)  # 5 MiB
    started = time.perf_counter()
    async with _Upstream(_answering(_ok(body))) as up, _pool() as transport:
        response = await _get(transport, up.url)
        received, peak = [], 0
        while (chunk := await response.next_chunk()) is not None:
            received.append(chunk)
            peak = max(peak, response._buffered + len(chunk))
            await asyncio.sleep(0.001)  # a slow client
        assert b"".join(received) == body
        # paused above HIGH_WATER, so at most one socket read (256 KiB) beyond it
        assert HIGH_WATER // 2 < peak <= HIGH_WATER + 256 * 1024
    assert time.perf_counter() - started < 5


@_in_a_loop
async def test_a_response_finished_while_reading_was_paused_leaves_a_usable_connection() -> None:
    # HIGH_WATER + 1 bytes: the read that crosses the mark holds the last byte,
    # so the response completes with reading paused.
    big = _ok(b"z" * (HIGH_WATER + 1))
    async with _Upstream(_answering(big)) as up, _pool(read_timeout=0.5) as transport:
        response = await _get(transport, up.url)
        while not response.complete:
            await asyncio.sleep(0.005)
        response.abort()  # the client left; the pool keeps the complete connection
        assert len(await (await _get(transport, up.url)).read(limit=2 * HIGH_WATER)) > HIGH_WATER
        assert up.connections == 1


def test_works_under_uvloop() -> None:
    async def scenario() -> None:
        async with _Upstream(_answering(_ok(b"uv"))) as up, _pool() as transport:
            for _ in range(2):
                assert await (await _get(transport, up.url)).read() == b"uv"
            assert up.connections == 1

    uvloop.run(scenario())


# --- TLS ------------------------------------------------------------------------


@_in_a_loop
async def test_https_upstreams_are_verified_and_kept_alive() -> None:
    authority = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    async with _Upstream(_answering(_ok()), tls=server) as up:
        assert up.url.startswith("https://")
        async with _pool(ssl_context=trusting) as transport:
            for _ in range(2):
                assert await (await _get(transport, up.url)).read() == b"hello"
        assert up.connections == 1
        async with _pool() as transport:  # certifi's bundle does not know this authority
            with pytest.raises(UpstreamUnreachable):
                await _get(transport, up.url)
