"""Hostile clients, through the real app on loopback.

* Cross-site requests — a web page's "simple" cross-site POST (``text/plain``, a foreign
  ``Origin``) reached the upstream and was billed to the user.
* The pass-through's path — it forwarded the *decoded* path: ``%2e%2e`` walked out of
  the base path, ``%20`` and ``%00`` went into the upstream request line.
* Duplicate keys — a body naming ``messages`` twice was accepted; the proxy counted the
  last, the upstream may read the first.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from config import load_settings
from proxy.app import create_app
from tests.proxy.conftest import AppFactory
from tests.proxy.servers import FakeUpstream, serve_in_thread, serve_raw

HI = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
JSON = {"content-type": "application/json"}


def chat_requests(fake: tuple[FakeUpstream, str]) -> list[str]:
    return [r.path for r in fake[0].received]


# --- cross-site requests ----------------------------------------------------


def test_a_web_pages_simple_post_is_refused_before_the_upstream(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    proxy = start_app()
    page = {"content-type": "text/plain", "origin": "https://evil.example"}
    response = proxy.http.post(f"{proxy.url}/chat/completions", content=HI, headers=page)
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "forbidden_origin" and error["type"] == "invalid_request_error"
    assert "evil.example" in error["message"]
    assert fake_upstream.received == []


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://127.0.0.1:1"])
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/compaction/preview"),
        ("GET", "/v1/models"),
        ("POST", "/v1/embeddings"),
        ("GET", "/healthz"),
    ],
)
def test_a_foreign_origin_is_refused_on_every_path(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
    origin: str,
    method: str,
    path: str,
) -> None:
    proxy = start_app(server={"cors_origins": ["https://app.example"]})
    base = proxy.url.removesuffix("/v1")
    response = proxy.http.request(
        method, base + path, content=HI, headers={**JSON, "origin": origin}
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden_origin"
    assert fake_upstream.received == []


def test_an_allowed_origin_and_clients_without_one_are_served(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    proxy = start_app(server={"cors_origins": ["https://app.example"]})
    page = {**JSON, "origin": "https://app.example"}
    from_page = proxy.http.post(f"{proxy.url}/chat/completions", content=HI, headers=page)
    assert from_page.status_code == 200
    assert from_page.headers["access-control-allow-origin"] == "https://app.example"
    assert (
        proxy.http.post(f"{proxy.url}/chat/completions", content=HI, headers=JSON).status_code
        == 200
    )
    assert (
        proxy.http.get(f"{proxy.url}/models", headers={"origin": "https://app.example"}).status_code
        == 200
    )
    assert len(fake_upstream.received) == 3


@pytest.mark.parametrize("api_key", [None, "proxy-secret"])
def test_a_preflight_from_an_allowed_origin_still_works(
    start_app: AppFactory, api_key: str | None
) -> None:
    proxy = start_app(server={"cors_origins": ["https://app.example"], "api_key": api_key})
    preflight = {
        "origin": "https://app.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    allowed = proxy.http.options(f"{proxy.url}/chat/completions", headers=preflight)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    foreign = proxy.http.options(
        f"{proxy.url}/chat/completions", headers={**preflight, "origin": "https://evil.example"}
    )
    assert foreign.status_code == 403


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "text/json",
    ],
)
@pytest.mark.parametrize("path", ["/chat/completions", "/compaction/preview"])
def test_the_json_endpoints_refuse_bodies_that_are_not_json(
    start_app: AppFactory, fake_upstream: FakeUpstream, content_type: str | None, path: str
) -> None:
    proxy = start_app()
    headers = {"content-type": content_type} if content_type else {}
    response = proxy.http.post(proxy.url + path, content=HI, headers=headers)
    assert response.status_code == 415
    error = response.json()["error"]
    assert error["code"] == "unsupported_content_type" and "application/json" in error["message"]
    assert fake_upstream.received == []


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "Application/JSON; charset=utf-8", "application/vnd.api+json"],
)
def test_json_content_types_with_parameters_are_accepted(
    start_app: AppFactory, content_type: str
) -> None:
    proxy = start_app()
    response = proxy.http.post(
        f"{proxy.url}/chat/completions", content=HI, headers={"content-type": content_type}
    )
    assert response.status_code == 200


# --- the pass-through's path --------------------------------------------------


@contextmanager
def recording_upstream() -> Iterator[tuple[str, list[bytes]]]:
    """A raw-socket upstream that records each request line as it arrived and
    answers ``200 {}``; yields its base URL and the lines."""
    lines: list[bytes] = []

    def answer(conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
            head += chunk
        lines.append(head.split(b"\r\n", 1)[0])
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: 2\r\nconnection: close\r\n\r\n{}"
        )

    with serve_raw(answer) as url:
        yield url, lines


def raw_get(base: str, target: bytes) -> tuple[int, bytes]:
    """``GET target`` written byte for byte (an HTTP library would normalize it)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"GET "
            + target
            + b" HTTP/1.1\r\nhost: "
            + f"{host}:{port}".encode()
            + b"\r\nconnection: close\r\n\r\n"
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    return status, reply.split(b"\r\n\r\n", 1)[1]


@pytest.fixture
def passthrough() -> Iterator[tuple[str, list[bytes]]]:
    """The proxy in front of :func:`recording_upstream` at base path ``/api/v1``."""
    with recording_upstream() as (upstream, lines):
        settings = load_settings(
            None, upstream={"base_url": upstream + "/api/v1"}, store={"url": "memory://"}
        )
        with serve_in_thread(create_app(settings)) as proxy:
            yield proxy, lines


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/%2e%2e/%2e%2e/admin",
        b"/v1/%2E%2e/admin",
        b"/v1/x/%2e%2e/%2e%2e/%2e%2e/admin",
        b"/v1/models%2F..%2F..%2Fadmin",
        b"/v1/a%20b",
        b"/v1/a%00b",
        b"/v1/a%09b",
        b"/v1//admin",
        b"/v1/%2e%2e%2fadmin",
    ],
)
def test_a_path_that_could_leave_the_base_path_or_break_the_request_line_is_refused(
    passthrough: tuple[str, list[bytes]], target: bytes
) -> None:
    proxy, lines = passthrough
    status, body = raw_get(proxy, target)
    assert status == 400 and b"invalid_request_error" in body
    assert lines == []


def test_a_line_break_in_the_path_matches_no_route(
    passthrough: tuple[str, list[bytes]],
) -> None:
    proxy, lines = passthrough
    status, body = raw_get(proxy, b"/v1/a%0d%0aX-Injected:%201")
    assert status == 404 and b"invalid_request_error" in body
    assert lines == []


@pytest.mark.parametrize(
    ("target", "line"),
    [
        (b"/v1/models", b"GET /api/v1/models HTTP/1.1"),
        (b"/v1/models/", b"GET /api/v1/models/ HTTP/1.1"),
        (b"/v1/models/a%2Fb", b"GET /api/v1/models/a%2Fb HTTP/1.1"),
        (b"/v1/models/a%3fb%23c", b"GET /api/v1/models/a%3fb%23c HTTP/1.1"),
        (b"/v1/models/ft:x%3Ay", b"GET /api/v1/models/ft:x%3Ay HTTP/1.1"),
        (
            b"/v1/files?purpose=a%20b&after=x%2Fy",
            b"GET /api/v1/files?purpose=a%20b&after=x%2Fy HTTP/1.1",
        ),
    ],
)
def test_the_path_goes_upstream_as_received_under_the_base_path(
    passthrough: tuple[str, list[bytes]], target: bytes, line: bytes
) -> None:
    proxy, lines = passthrough
    status, _ = raw_get(proxy, target)
    assert status == 200
    assert lines == [line]


# --- duplicate keys ------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (
            b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],'
            b' "messages": [{"role": "user", "content": "something else"}]}',
            "messages",
        ),
        (b'{"model": "a", "messages": [], "model": "b"}', "model"),
        # Spelled differently, the same key once decoded.
        (b'{"messages": [], "\\u006dessages": [{"role": "user", "content": "x"}]}', "messages"),
        (b'{"messages": [], "stream": true, "stream": false}', "stream"),
        # A document simdjson declines (an integer beyond 64 bits) is read exactly too.
        (b'{"messages": [], "seed": 1, "seed": 123456789012345678901234567890}', "seed"),
    ],
)
@pytest.mark.parametrize("path", ["/chat/completions", "/compaction/preview"])
def test_a_top_level_key_named_twice_is_refused(
    start_app: AppFactory, fake_upstream: FakeUpstream, raw: bytes, key: str, path: str
) -> None:
    proxy = start_app()
    response = proxy.http.post(proxy.url + path, content=raw, headers=JSON)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == key and "more than once" in error["message"]
    assert fake_upstream.received == []


def test_nested_keys_named_like_top_level_ones_pass(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    proxy = start_app()
    raw = (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "the \\"model\\" key"}],'
        b' "tools": [{"type": "function", "function": {"name": "f", "parameters":'
        b' {"type": "object", "properties": {"model": {"type": "string"},'
        b' "messages": {"type": "array"}, "model ": {}}}}}],'
        b' "metadata": {"a": 1, "a": 2}}'
    )
    response = proxy.http.post(f"{proxy.url}/chat/completions", content=raw, headers=JSON)
    assert response.status_code == 200
    assert fake_upstream.received[0].body == raw  # the client's own bytes went on
