"""proxy.upstream.transport against a scripted raw HTTP server on loopback — a hostile one too.

Each test gives ``_Upstream`` a handler coroutine that reads requests and
writes exact bytes, so every behaviour (a stall, a drop mid-body, an extra
response, an idle connection closed at the wrong moment, a flood of headers)
is provoked on a real socket. The server counts the connections it accepts
and records the requests it read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import gzip
import socket
import ssl
import struct
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
import trustme
import uvloop

from proxy.upstream import traffic as traffic_module
from proxy.upstream.traffic import Traffic
from proxy.upstream.transport import (
    BodyLost,
    ConnectFailed,
    InvalidResponse,
    NoResponse,
    Transport,
    TransportTimeout,
    UpstreamResponse,
)


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
        "keepalive_expiry": 30.0,
        "trust_env": False,
    }
    transport = Transport(**(options | overrides))
    try:
        yield transport
    finally:
        await transport.aclose()
        await asyncio.sleep(0)  # let closed sockets finish closing before the loop ends


async def _get(transport: Transport, url: str, body: Any = None) -> UpstreamResponse:
    return await transport.request("GET" if body is None else "POST", url, {}, body)


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
        assert (response.status, response.header("x-id"), response.length) == (200, "7", 5)
        assert (b"content-length", b"5") in response.raw_headers
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
        assert response.length is None
        assert await response.next_chunk() == b"alpha"
        go_on.put_nowait(None)
        assert await response.next_chunk() == b"beta"
        go_on.put_nowait(None)
        assert await response.next_chunk() is None
        assert await (await _get(transport, up.url)).read() == b"onetwo"
        assert up.connections == 1


@_in_a_loop
async def test_http_1_0_body_without_length_ends_at_close_and_is_not_reused() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.0 200 OK\r\n\r\npart one, ")
        await peer.send(b"part two")

    async with _Upstream(handler) as up, _pool() as transport:
        for _ in range(2):
            response = await _get(transport, up.url)
            assert b"".join(await _chunks(response)) == b"part one, part two"
        assert up.connections == 2


@pytest.mark.parametrize("interim", [b"100 Continue", b"103 Early Hints"])
def test_interim_1xx_answers_are_skipped(interim: bytes) -> None:
    head = b"HTTP/1.1 " + interim + b"\r\nx-interim: yes\r\n\r\n"

    async def scenario() -> None:
        async with _Upstream(_answering(head + _ok(b"final"))) as up, _pool() as transport:
            response = await _get(transport, up.url, b"{}")
            assert response.status == 200
            assert response.header("x-interim") is None
            assert await response.read() == b"final"

    asyncio.run(scenario())


@_in_a_loop
async def test_head_answer_with_a_length_and_no_body_does_not_hang() -> None:
    async def handler(peer: _Peer) -> None:
        while (request := await peer.request()) is not None:
            head = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n"
            await peer.send(head if request.method == "HEAD" else _ok())

    async with _Upstream(handler) as up, _pool(max_connections=1) as transport:
        response = await transport.request("HEAD", up.url, {}, None)
        assert (response.status, response.header("content-length")) == (200, "10")
        assert await asyncio.wait_for(response.read(), 0.5) == b""
        assert await (await _get(transport, up.url)).read() == b"hello"  # the slot came back


@_in_a_loop
async def test_bodies_arrive_as_sent_never_decompressed() -> None:
    squeezed = gzip.compress(b'{"ok": true}')
    answer = _ok(squeezed, "content-encoding: gzip", "content-type: application/json")
    async with _Upstream(_answering(answer)) as up, _pool() as transport:
        response = await _get(transport, up.url)
        assert response.header("content-encoding") == "gzip"
        assert await response.read() == squeezed
        assert up.requests[0].headers["accept-encoding"] == "identity"


# --- keep-alive, expiry, and never sending twice -----------------------------------


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
        assert await (await _get(transport, up.url, b"{}")).read() == b"hello"
        assert up.connections == 2


@_in_a_loop
async def test_idle_connections_expire_after_keepalive_expiry() -> None:
    async with _Upstream(_answering(_ok())) as up, _pool(keepalive_expiry=0.1) as transport:
        await (await _get(transport, up.url)).read()
        await (await _get(transport, up.url)).read()
        assert up.connections == 1  # reused while fresh
        await asyncio.sleep(0.3)
        await (await _get(transport, up.url)).read()
        assert up.connections == 2  # expired, replaced


def _closing_after_one_answer(second: bytes) -> Handler:
    """The first connection answers once, then reads the next request and
    closes without a byte (an idle keep-alive connection timed out by the
    server as the request arrived); later connections answer ``second``."""

    async def handler(peer: _Peer) -> None:
        if peer.index == 1:
            await peer.request()
            await peer.send(_ok(b"first"))
            await peer.request()
            return
        await _answering(_ok(second))(peer)

    return handler


@_in_a_loop
async def test_post_on_a_kept_alive_connection_closed_without_an_answer_is_sent_once() -> None:
    async with _Upstream(_closing_after_one_answer(b"second")) as up, _pool() as transport:
        assert await (await _get(transport, up.url)).read() == b"first"
        with pytest.raises(NoResponse):
            await _get(transport, up.url, b'{"generate": "a long answer"}')
        # The upstream may have started the generation: it is not asked twice.
        assert [r.method for r in up.requests] == ["GET", "POST"]
        assert up.connections == 1


@_in_a_loop
async def test_streamed_body_on_a_reused_connection_is_not_sent_twice() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"once"

    async with _Upstream(_closing_after_one_answer(b"second")) as up, _pool() as transport:
        await (await _get(transport, up.url)).read()
        with pytest.raises(NoResponse):
            await _get(transport, up.url, body())
        assert up.connections == 1


@_in_a_loop
async def test_idempotent_get_on_such_a_connection_is_retried_once() -> None:
    async with _Upstream(_closing_after_one_answer(b"second")) as up, _pool() as transport:
        assert await (await _get(transport, up.url)).read() == b"first"
        assert await (await _get(transport, up.url)).read() == b"second"
        assert up.connections == 2


@_in_a_loop
async def test_fresh_connection_closed_without_an_answer_is_not_retried() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()

    async with _Upstream(handler) as up, _pool() as transport:
        with pytest.raises(NoResponse):
            await _get(transport, up.url, b"{}")
        assert up.connections == 1


# --- a hostile upstream -----------------------------------------------------------

_LEAK = _ok(b'{"LEAKED": "another caller\'s answer"}')


@pytest.mark.parametrize("when", ["with the answer", "while idle"])
def test_an_extra_response_never_becomes_the_next_requests_answer(when: str) -> None:
    async def handler(peer: _Peer) -> None:
        n = 0
        while await peer.request() is not None:
            n += 1
            answer = _ok(b"answer %d" % n)
            if n == 1 and peer.index == 1 and when == "with the answer":
                await peer.send(answer + _LEAK)
            elif n == 1 and peer.index == 1:
                await peer.send(answer)
                await asyncio.sleep(0.05)
                await peer.send(_LEAK)  # nobody asked
            else:
                await peer.send(answer)

    async def scenario() -> None:
        async with _Upstream(handler) as up, _pool() as transport:
            assert await (await _get(transport, up.url)).read() == b"answer 1"
            await asyncio.sleep(0.1)
            second = await _get(transport, up.url, b'{"from": "caller two"}')
            assert await second.read() == b"answer 1"  # a fresh connection's first answer
            assert up.connections == 2
            assert len(up.requests) == 2  # the second request went out once

    asyncio.run(scenario())


@_in_a_loop
async def test_content_length_and_chunked_together_are_refused() -> None:
    smuggled = (
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n"
    )
    async with _Upstream(_answering(smuggled)) as up, _pool() as transport:
        with pytest.raises(InvalidResponse):
            await _get(transport, up.url)


@pytest.mark.parametrize(
    "headers",
    [
        [b"x-big: " + b"a" * (2 << 20)],  # one 2 MiB line
        [b"x-h%d: v" % i for i in range(5000)],  # a flood of small ones
        [b"x-h%d: %b" % (i, b"b" * 15_000) for i in range(8)],  # 120 KiB under every per-line limit
    ],
    ids=["huge-line", "many-headers", "large-total"],
)
def test_oversized_response_heads_are_refused(headers: list[bytes]) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in headers)

    async def handler(peer: _Peer) -> None:
        await peer.request()
        with contextlib.suppress(ConnectionError):
            await peer.send(head + b"content-length: 2\r\n\r\nok")
        await peer.wait_eof()

    async def scenario() -> None:
        async with _Upstream(handler) as up, _pool() as transport:
            with pytest.raises(InvalidResponse):
                await _get(transport, up.url)

    asyncio.run(scenario())


@_in_a_loop
async def test_reset_before_any_answer_is_no_response() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        _reset_on_close(peer)

    async with _Upstream(handler) as up, _pool() as transport:
        with pytest.raises(NoResponse):
            await _get(transport, up.url, b"{}")


# --- failures and timeouts ------------------------------------------------------


@_in_a_loop
async def test_connection_refused_fails_to_connect() -> None:
    async with _Upstream(_answering(_ok())) as up:
        url = up.url  # a port that was just free, now closed
    async with _pool() as transport:
        with pytest.raises(ConnectFailed):
            await _get(transport, url)


@_in_a_loop
async def test_silent_server_times_out_reading() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.wait_eof()

    async with _Upstream(handler) as up, _pool(read_timeout=0.2) as transport:
        with pytest.raises(TransportTimeout) as caught:
            await asyncio.wait_for(_get(transport, up.url), 5)
        assert caught.value.phase == "read"


@_in_a_loop
async def test_stall_after_headers_loses_the_body() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nsome")
        await peer.wait_eof()

    async with _Upstream(handler) as up, _pool(read_timeout=0.2) as transport:
        response = await _get(transport, up.url)
        assert await response.next_chunk() == b"some"
        with pytest.raises(BodyLost, match="stopped sending"):
            await asyncio.wait_for(response.next_chunk(), 5)


@_in_a_loop
async def test_a_whole_body_that_arrives_in_pieces_is_read_whole() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello")
        await asyncio.sleep(0.05)  # the rest comes in a later segment
        await peer.send(b"world")
        await peer.wait_eof()

    async with _Upstream(handler) as up, _pool() as transport:
        response = await _get(transport, up.url)
        assert await response.read() == b"helloworld"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_cut_short_is_lost_and_its_connection_dropped(framing: str) -> None:
    cut = {
        "content-length": b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789",
        "chunked": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n64\r\n0123456789",
    }[framing]

    async def handler(peer: _Peer) -> None:
        await peer.request()
        if peer.index == 1:
            await peer.send(cut)  # then FIN
            return
        await peer.send(_ok())
        await peer.wait_eof()

    async def scenario() -> None:
        async with _Upstream(handler) as up, _pool() as transport:
            with pytest.raises(BodyLost):
                await (await _get(transport, up.url)).read()
            assert await (await _get(transport, up.url)).read() == b"hello"
            assert up.connections == 2

    asyncio.run(scenario())


def _reset_on_close(peer: _Peer) -> None:
    linger = struct.pack("ii", 1, 0)  # closing now sends RST, not FIN
    peer.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)


@_in_a_loop
async def test_reset_during_a_body_without_length_loses_the_body() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\n\r\npartial")
        await asyncio.sleep(0.05)
        _reset_on_close(peer)

    async with _Upstream(handler) as up, _pool() as transport:
        with pytest.raises(BodyLost):
            await _chunks(await _get(transport, up.url))


@_in_a_loop
async def test_wait_body_keeps_the_first_bytes_for_the_reader() -> None:
    async def handler(peer: _Peer) -> None:
        while await peer.request() is not None:
            await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            await peer.send(b"5\r\nfirst\r\n6\r\nsecond\r\n0\r\n\r\n")

    async with _Upstream(handler) as up, _pool() as transport:
        response = await _get(transport, up.url)
        assert await response.wait_body() is True
        assert b"".join(await _chunks(response)) == b"firstsecond"


@_in_a_loop
async def test_wait_body_of_an_empty_stream_is_false() -> None:
    empty = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"
    async with _Upstream(_answering(empty)) as up, _pool() as transport:
        response = await _get(transport, up.url)
        assert await response.wait_body() is False
        assert await response.next_chunk() is None


# --- the pool -------------------------------------------------------------------


@_in_a_loop
async def test_a_held_response_makes_the_next_request_wait_for_its_slot() -> None:
    async def handler(peer: _Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await peer.wait_eof()  # the stream never ends

    async with (
        _Upstream(handler) as up,
        _pool(max_connections=1, connect_timeout=0.2) as transport,
    ):
        held = await _get(transport, up.url)
        with pytest.raises(TransportTimeout) as caught:
            await _get(transport, up.url)
        assert caught.value.phase == "connect"
        waiting = asyncio.ensure_future(_get(transport, up.url))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        held.abort()
        second = await waiting
        assert second.status == 200
        second.abort()
        assert up.connections == 2


@_in_a_loop
async def test_abort_mid_stream_closes_at_once_and_frees_the_slot() -> None:
    closed: asyncio.Event = asyncio.Event()

    async def handler(peer: _Peer) -> None:
        if peer.index > 1:
            return await _answering(_ok())(peer)
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await peer.wait_eof()
        closed.set()

    async with _Upstream(handler) as up, _pool(max_connections=1) as transport:
        response = await _get(transport, up.url)
        assert await response.next_chunk() == b"first"
        response.abort()
        await asyncio.wait_for(closed.wait(), 5)  # the upstream saw the connection close
        assert await (await _get(transport, up.url)).read() == b"hello"


# --- the request ----------------------------------------------------------------


@_in_a_loop
async def test_header_with_a_line_break_is_refused_before_sending() -> None:
    async with _Upstream(_answering(_ok())) as up, _pool(max_connections=1) as transport:
        with pytest.raises(ValueError):
            await transport.request("GET", up.url, {"x-a": "1\r\nx-b: 2"}, None)
        assert up.requests == []
        assert await (await _get(transport, up.url)).read() == b"hello"  # no slot was taken


@_in_a_loop
async def test_request_head_carries_the_target_as_given_and_nothing_of_its_own() -> None:
    async with _Upstream(_answering(_ok())) as up, _pool() as transport:
        headers = {"authorization": "Bearer k", "content-type": "application/json"}
        target = "/openai/v1/a%2Fb/%7Euser?api-version=2024-06&q=%2F"
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


@_in_a_loop
async def test_slow_reader_gets_a_large_body_intact_and_the_connection_back() -> None:
    body = bytes(range(256)) * (5 * 1024 * 4)  # 5 MiB
    async with _Upstream(_answering(_ok(body))) as up, _pool() as transport:
        response = await _get(transport, up.url)
        received = []
        while (chunk := await response.next_chunk()) is not None:
            received.append(chunk)
            await asyncio.sleep(0.001)  # a slow client
        assert b"".join(received) == body
        await (await _get(transport, up.url)).read()
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
async def test_https_upstreams_are_verified_against_the_ca_bundle_and_kept_alive() -> None:
    authority = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server)
    with authority.cert_pem.tempfile() as bundle:
        async with _Upstream(_answering(_ok()), tls=server) as up:
            assert up.url.startswith("https://")
            async with _pool(ca_bundle=bundle) as transport:
                for _ in range(2):
                    assert await (await _get(transport, up.url)).read() == b"hello"
            assert up.connections == 1
            async with _pool() as transport:  # the system's store does not know this authority
                with pytest.raises(ConnectFailed, match="certificate"):
                    await _get(transport, up.url)


@pytest.mark.parametrize("end", ["read", "chunks", "release", "abort"])
def test_a_user_request_is_counted_in_flight_until_its_answer_is_over(end: str) -> None:
    # The traffic's count (proxy.upstream.traffic) ends on the response's own
    # end, however it comes: read whole, read to its last chunk, released, aborted.
    async def test() -> None:
        async with _Upstream(_answering(_ok(b"hello"))) as up, _pool() as transport:
            traffic = Traffic()
            sent = await traffic.begin("key", stated=None)
            response = sent.answered(await _get(transport, up.url))
            assert traffic.in_flight("key") == 1  # its head is in, not its end
            if end == "read":
                assert await response.read() == b"hello"
            elif end == "chunks":
                assert await _chunks(response) == [b"hello"]
            elif end == "release":
                response.release()
            else:
                response.abort()
            assert traffic.in_flight("key") == 0
            response.abort()  # the relay's last word, after any end: counted once
            assert traffic.in_flight("key") == 0

    asyncio.run(test())


def test_an_answer_dropped_unreleased_in_a_reference_cycle_still_ends_its_count() -> None:
    """The count's safety net for a bug: an answer nobody ended, dropped where
    only the cyclic collector frees it (an exception's traceback holding it),
    ends its count when collected, so its upstream is not busy for ever."""

    async def test() -> None:
        async with _Upstream(_answering(_ok(b"hello"))) as up, _pool() as transport:
            traffic = Traffic()
            response = (await traffic.begin("key", stated=None)).answered(
                await _get(transport, up.url)
            )
            assert traffic.in_flight("key") == 1
            lost = _caught_holding(response)
            del response, lost  # now only the cycle holds the answer, and its count's end
            gc.collect()
            assert traffic.in_flight("key") == 0

    asyncio.run(test())


def _caught_holding(answer: object) -> BaseException:
    """An error whose traceback holds ``answer`` in a reference cycle (the
    error → its traceback → this frame → the error), as a handler keeping
    the error it caught makes one."""
    try:
        raise RuntimeError("a bug on the way")
    except RuntimeError as error:
        kept = error
    assert answer is not None
    return kept


@pytest.mark.parametrize("end", ["read", "chunks", "release", "abort"])
def test_an_answers_end_is_told_to_the_traffic_once(
    end: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However the answer ends, and whatever comes after (an abort, its
    collection), its count is ended once: the later ends have nothing to do,
    and nothing waits for its collection once it is over."""
    told = 0
    ended = traffic_module.Sending.end

    def counted(self: traffic_module.Sending) -> None:
        nonlocal told
        told += 1
        ended(self)

    monkeypatch.setattr(traffic_module.Sending, "end", counted)

    async def test() -> None:
        async with _Upstream(_answering(_ok(b"hello"))) as up, _pool() as transport:
            sent = await Traffic().begin("key", stated=None)
            response = sent.answered(await _get(transport, up.url))
            if end == "read":
                await response.read()
            elif end == "chunks":
                await _chunks(response)
            elif end == "release":
                response.release()
            else:
                response.abort()
            response.abort()
            assert weakref.getweakrefcount(response) == 0  # nothing to run at its collection
            del response
            gc.collect()

    asyncio.run(test())
    assert told == 1
