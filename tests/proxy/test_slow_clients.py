"""Clients that send slowly, over real sockets, against the server ``serve`` runs.

Many half-sent requests do not lock out a new client; the server closes the
idle ones once their (test-short) deadline passes — seen as the end of the
stream on the client's socket, not measured on a clock; past
``server.max_connections`` a new connection closes the longest idle ones, and
is answered 503 and closed only when requests in flight fill the cap.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from config import load_settings
from proxy.app import create_app
from proxy.cli.server import server_config
from tests.proxy.servers import FakeUpstream, serve_in_thread

#: The header and body deadlines where only what happens once they pass is
#: looked at (a connection cut, an answer not cut): short, since each test
#: waits for one to pass.
DEADLINE = 0.5
#: Long enough for the test to open its connections and ask once before any
#: expires, even on a busy machine; short enough to wait for.
HELD_DEADLINE = 1.5


@contextlib.contextmanager
def _serving(
    upstream: str | None = None, deadline: float = DEADLINE, **server: Any
) -> Iterator[tuple[str, int]]:
    settings = load_settings(
        None,
        server={"header_timeout_seconds": deadline, "body_timeout_seconds": deadline, **server},
        store={"url": "memory://"},
        upstream={"base_url": upstream} if upstream else {},
    )
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = server_config(settings, create_app(settings), log_level="warning", lifespan="on")
    uvicorn_server = uvicorn.Server(config)
    thread = threading.Thread(
        target=uvicorn_server.run, kwargs={"sockets": [listener]}, daemon=True
    )
    thread.start()
    for _ in range(1000):
        if uvicorn_server.started or not thread.is_alive():
            break
        threading.Event().wait(0.01)
    assert uvicorn_server.started, "the server did not start"
    try:
        yield "127.0.0.1", port
    finally:
        uvicorn_server.should_exit = True
        thread.join(timeout=30)
        listener.close()


def _connect(address: tuple[str, int], sent: bytes) -> socket.socket:
    client = socket.create_connection(address, timeout=30)
    client.sendall(sent)
    return client


def _open(client: socket.socket) -> bool:
    """True while the server has not closed ``client`` (nothing to read yet)."""
    timeout = client.gettimeout()
    client.setblocking(False)
    try:
        return client.recv(1) != b""
    except BlockingIOError:
        return True
    finally:
        client.settimeout(timeout)  # a server that never closes fails the test, not hangs it


def _read_to_end(client: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    return received


HALF_HEADERS = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */"
HALF_BODY = (
    b"PUT /v1/compaction/sessions/abc/settings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"enabled":'
)


def test_many_half_sent_requests_lock_nobody_out_and_are_closed_after_their_deadline() -> None:
    with _serving(deadline=HELD_DEADLINE, max_connections=500) as address:
        slow = [_connect(address, HALF_HEADERS if i % 2 else HALF_BODY) for i in range(200)]
        try:
            answer = httpx.get(f"http://{address[0]}:{address[1]}/healthz", timeout=30)
            assert answer.status_code == 200
            # Served while every one of them was still held open.
            assert all(_open(client) for client in slow)
            # Then the server ends each of them: headers that never finished, and a
            # body that stopped coming. Nothing is answered to a request never sent whole.
            for client in slow:
                assert _read_to_end(client) == b""
        finally:
            for client in slow:
                client.close()


def test_headers_trickled_a_byte_at_a_time_are_cut_off_at_their_deadline() -> None:
    # Each byte would renew an idle timer: the header deadline runs from the first.
    headers = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"s" * 400
    with _serving() as address:
        client = socket.create_connection(address, timeout=60)
        sent = 0
        with client:
            for byte in headers:
                try:
                    client.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += 1
                readable, _, _ = select.select([client], [], [], 0.05)
                if readable and client.recv(1) == b"":
                    break
            assert sent < len(headers), "the server waited for every byte"


#: A request whose body the server asks for (``100 Continue``) and then waits
#: for: a request in flight, shown to be held by the server's answer.
WAITING_FOR_BODY = (
    b"PUT /v1/compaction/sessions/abc/settings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"
)
#: The body it waits for.
THE_BODY = b'{"enabled": true}'.ljust(100)


def test_past_the_connection_cap_with_every_request_in_flight_one_more_is_answered_503() -> None:
    with _serving(deadline=60, max_connections=20) as address:
        held = []
        try:
            for _ in range(20):
                client = _connect(address, WAITING_FOR_BODY)
                held.append(client)
                assert client.recv(65536).startswith(b"HTTP/1.1 100 Continue")
            with socket.create_connection(address, timeout=60) as extra:
                refused = _read_to_end(extra)
            assert refused.startswith(b"HTTP/1.1 503")
            assert b"connection: close" in refused
            for client in held:  # each request ends, answered
                client.sendall(THE_BODY)
                assert client.recv(65536).startswith(b"HTTP/1.1 ")
        finally:
            for client in held:
                client.close()
        # With the held ones gone there is room again (once the server has
        # seen them go: their ends and the new connection arrive in any order).
        statuses = []
        for _ in range(50):
            statuses.append(httpx.get(f"http://{address[0]}:{address[1]}/healthz").status_code)
            if statuses[-1] == 200:
                break
        assert statuses[-1] == 200 and set(statuses) <= {200, 503}


def test_idle_keep_alive_connections_at_the_cap_make_room_for_a_newcomer() -> None:
    """Five times the cap in clients that ask once and then sit on their
    keep-alive connections: each newcomer is answered, the longest idle
    connections closed to make room; those still held stay within the cap."""
    with _serving(deadline=60, max_connections=20) as address:
        held = []
        try:
            for _ in range(100):
                client = _connect(address, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                held.append(client)
                assert client.recv(65536).startswith(b"HTTP/1.1 200")
            answer = httpx.get(f"http://{address[0]}:{address[1]}/healthz", timeout=60)
            assert answer.status_code == 200
            assert not _open(held[0])  # the longest idle went
            assert _open(held[-1])  # the newest is still served
            assert sum(_open(client) for client in held) < 20
        finally:
            for client in held:
                client.close()


def test_an_answer_that_streams_longer_than_every_deadline_is_never_cut() -> None:
    # Eight chunks, each a sixth of the deadline after the last: the answer
    # outlasts both deadlines.
    upstream = FakeUpstream(chunks=8, chunk_delay=DEADLINE / 6)
    with serve_in_thread(upstream.app()) as upstream_url, _serving(upstream_url + "/v1") as address:
        body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        url = f"http://{address[0]}:{address[1]}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=60) as answer:
            events = [line for line in answer.iter_lines() if line.startswith("data: ")]
        assert answer.status_code == 200
        assert events[-1] == "data: [DONE]"
        words = [e for e in events[:-1] if json.loads(e[6:])["choices"][0]["delta"].get("content")]
        assert len(words) == 8


def _http10_stream(address: tuple[str, int]) -> bytes:
    """A streamed chat completion asked over HTTP/1.0, read until the server closes."""
    body = json.dumps(
        {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.0\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with _connect(address, head + body) as client:
        return _read_to_end(client)


def test_an_http_1_0_client_gets_its_stream_unchunked_and_ended_by_the_close() -> None:
    upstream = FakeUpstream(chunks=3)
    with serve_in_thread(upstream.app()) as upstream_url, _serving(upstream_url + "/v1") as address:
        answer = _http10_stream(address)
        with _connect(address, b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n") as client:
            health = _read_to_end(client)  # a length stated: sent as it was
    assert b"content-length:" in health.lower() and health.endswith(b"}")
    head, _, stream = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding" not in head.lower()
    assert b"connection: close" in head.lower()
    # The events as sent, no chunk sizes between them.
    assert stream.startswith(b"data: {")
    assert stream.rstrip().endswith(b"data: [DONE]")
    events = [line for line in stream.split(b"\n") if line]
    assert all(line.startswith(b"data: ") for line in events)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/compaction/preview"),
        ("PUT", "/v1/compaction/sessions/abc/settings"),
        ("POST", "/v1/embeddings"),
    ],
)
def test_a_client_that_leaves_mid_body_is_no_error_of_the_proxys(
    method: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A client that hangs up halfway through its body (a cancelled request, a
    # closed laptop) is an everyday event: nobody is left to answer, and the
    # operator's log gets no traceback or error line for it.
    sent = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        '{"model": "gpt-4o", "messages": ['
    ).encode()
    with (
        _serving("http://127.0.0.1:9/v1", deadline=HELD_DEADLINE) as address,
        caplog.at_level(logging.INFO),
    ):
        client = _connect(address, sent)
        threading.Event().wait(0.2)  # the request is read to its half body
        client.close()
        for _ in range(50):  # until the hang-up is handled (or the test fails below)
            if _gone(caplog.records):
                break
            threading.Event().wait(0.1)
        with httpx.Client() as http:  # and the server goes on serving
            assert http.get(f"http://{address[0]}:{address[1]}/healthz").status_code == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == []
    gone = _gone(caplog.records)
    assert len(gone) == 1 and gone[0].levelno == logging.INFO


def _gone(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if getattr(r, "fields", {}).get("client") == "gone"]
