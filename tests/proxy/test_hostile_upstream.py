"""The proxy in front of an upstream that lies, breaks or floods (bodies cut short, heads
out of bounds, the transport's guards), and behind a corporate HTTPS proxy.

Each upstream is a raw script on loopback (tests/proxy/raw_servers.py); the
proxy runs under uvicorn; the client is httpx, which tells a whole response
from a broken one as any HTTP client does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest
import trustme

from config import load_settings
from proxy.app import create_app
from tests.proxy.raw_servers import (
    Script,
    read_request,
    response,
    serve_connect_proxy,
    serve_script,
)
from tests.proxy.servers import serve_in_thread

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def _completion(text: str) -> bytes:
    body = {
        "id": "c",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    return response(json.dumps(body).encode(), "content-type: application/json")


@contextmanager
def _proxy_before(upstream: str, **upstream_settings: Any) -> Iterator[str]:
    """A proxy whose upstream is ``upstream``; yields its /v1 URL."""
    settings = load_settings(
        None,
        upstream={"base_url": upstream + "/v1", "trust_env": False, **upstream_settings},
        store={"url": "memory://"},
    )
    with serve_in_thread(create_app(settings)) as url:
        yield url + "/v1"


@contextmanager
def _proxy_before_script(script: Script, **upstream_settings: Any) -> Iterator[str]:
    with ExitStack() as stack:
        upstream = stack.enter_context(serve_script(script))
        yield stack.enter_context(_proxy_before(upstream, **upstream_settings))


def _assert_openai_error(answer: httpx.Response, status: int, words: str) -> None:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert words in error["message"] and error["type"] == "upstream_error"


# --- bodies cut short: never relayed as whole ones ----------------------------------------------


def _cut_after(head: bytes, sent: bytes) -> Script:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(head + sent)
        await writer.drain()  # then FIN

    return script


def test_a_small_answer_cut_short_is_a_502_never_a_clean_200() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
    with _proxy_before_script(_cut_after(head, b'{"id": "c"')) as proxy:
        _assert_openai_error(httpx.post(f"{proxy}/chat/completions", json=CHAT), 502, "broke off")
        _assert_openai_error(httpx.get(f"{proxy}/models"), 502, "broke off")


def test_a_large_download_cut_short_keeps_its_length_so_the_client_sees_the_break() -> None:
    size = 3 << 20
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size
    with (
        _proxy_before_script(_cut_after(head, b"x" * (1 << 20))) as proxy,
        httpx.stream("GET", f"{proxy}/files/f/content") as answer,
    ):
        assert answer.headers["content-length"] == str(size)
        with pytest.raises(httpx.RemoteProtocolError):
            answer.read()


@pytest.mark.parametrize("path", ["/chat/completions", "/responses"])
def test_a_stream_cut_short_leaves_the_clients_response_unfinished(path: str) -> None:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    event = b'data: {"choices": []}\n\n'
    chunk = b"%x\r\n%b\r\n" % (len(event), event)
    received = b""
    body = {**CHAT, "stream": True}
    with (
        _proxy_before_script(_cut_after(head, chunk + b"40\r\npartial")) as proxy,
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", f"{proxy}{path}", json=body) as answer,
    ):
        for part in answer.iter_raw():
            received += part
    assert received.startswith(event)
    assert b"upstream_dropped" in received  # an SSE client is told why


# --- answers nobody asked for ------------------------------------------------------


@pytest.mark.parametrize("when", ["with the answer", "while idle"])
def test_an_extra_upstream_response_is_never_served_to_the_next_caller(when: str) -> None:
    leak = _completion("LEAKED: the first caller's second answer")

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        served = 0
        while await read_request(reader) is not None:
            served += 1
            answer = _completion(f"connection {n}, answer {served}")
            if (n, served) == (1, 1) and when == "with the answer":
                writer.write(answer + leak)
            elif (n, served) == (1, 1):
                writer.write(answer)
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(leak)
            else:
                writer.write(answer)
            await writer.drain()

    with _proxy_before_script(script) as proxy:
        first = httpx.post(f"{proxy}/chat/completions", json=CHAT)
        assert "connection 1, answer 1" in first.text
        time.sleep(0.2)  # the leak, if any, is on the idle connection by now
        second = httpx.post(f"{proxy}/chat/completions", json=CHAT)
        assert second.status_code == 200
        assert "LEAKED" not in second.text
        assert "answer 1" in second.text  # a fresh connection's first answer


# --- heads out of bounds: a 502, never buffered without end -------------------


@pytest.mark.parametrize(
    "headers",
    [
        [b"x-big: " + b"a" * (2 << 20)],
        [b"x-h%d: v" % i for i in range(20_000)],
        [b"x-h%d: %b" % (i, b"b" * 15_000) for i in range(8)],
    ],
    ids=["one-2MiB-line", "20k-headers", "120KiB-in-all"],
)
def test_an_oversized_upstream_head_is_a_502_and_the_proxy_stays_responsive(
    headers: list[bytes],
) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in headers)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(head + b"content-length: 2\r\n\r\nok")
        await writer.drain()

    with _proxy_before_script(script) as proxy:
        answer = httpx.post(f"{proxy}/chat/completions", json=CHAT, timeout=30)
        _assert_openai_error(answer, 502, "invalid response")
        assert len(answer.content) < 1000  # nothing of the flood is relayed
        assert httpx.get(proxy.removesuffix("/v1") + "/healthz").status_code == 200


# --- behind a corporate proxy, with an internal CA ---------------------------------


@pytest.fixture
def internal_upstream() -> Iterator[tuple[int, str]]:
    """An HTTPS upstream named ``llm.internal.test`` (a name only the corporate
    proxy resolves), with a certificate from a throwaway CA; yields its port
    and the CA bundle's path."""
    authority = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("llm.internal.test").configure_cert(tls)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await read_request(reader) is not None:
            writer.write(_completion("from the internal upstream"))
            await writer.drain()

    with serve_script(script, tls=tls) as url, authority.cert_pem.tempfile() as bundle:
        yield int(url.rsplit(":", 1)[1]), bundle


def test_an_upstream_behind_https_proxy_with_a_custom_ca_is_reached(
    internal_upstream: tuple[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, bundle = internal_upstream
    with serve_connect_proxy({"llm.internal.test": port}) as corporate:
        for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "https_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", corporate.url)
        upstream = "https://llm.internal.test"
        with _proxy_before(upstream, trust_env=True, ca_bundle=bundle) as proxy:
            answer = httpx.post(f"{proxy}/chat/completions", json=CHAT)
            assert answer.status_code == 200, answer.text
            assert "from the internal upstream" in answer.text
        assert corporate.tunnels == ["llm.internal.test:443"]

        with _proxy_before(upstream, trust_env=True) as proxy:  # the system's CAs only
            answer = httpx.post(f"{proxy}/chat/completions", json=CHAT)
            _assert_openai_error(answer, 502, "certificate")

        # Without trust_env, or for a host NO_PROXY names, the proxy goes
        # direct, where the internal name does not resolve.
        with _proxy_before(upstream, trust_env=False, ca_bundle=bundle, connect_timeout=3) as proxy:
            answer = httpx.post(f"{proxy}/chat/completions", json=CHAT, timeout=30)
            _assert_openai_error(answer, 502, "could not be reached")
        monkeypatch.setenv("NO_PROXY", ".internal.test")
        with _proxy_before(upstream, trust_env=True, ca_bundle=bundle, connect_timeout=3) as proxy:
            answer = httpx.post(f"{proxy}/chat/completions", json=CHAT, timeout=30)
            _assert_openai_error(answer, 502, "could not be reached")
        assert len(corporate.tunnels) == 2  # the corporate proxy was not asked again


def test_proxy_credentials_in_the_proxy_url_are_sent_to_the_proxy_only(
    internal_upstream: tuple[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, bundle = internal_upstream
    with serve_connect_proxy({"llm.internal.test": port}) as corporate:
        for name in ("NO_PROXY", "no_proxy", "https_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", corporate.url.replace("://", "://alice:s3cret@"))
        with _proxy_before("https://llm.internal.test", trust_env=True, ca_bundle=bundle) as proxy:
            answer = httpx.post(f"{proxy}/chat/completions", json=CHAT)
            assert answer.status_code == 200, answer.text
        (authorization,) = corporate.authorizations
        assert authorization == "Basic " + base64.b64encode(b"alice:s3cret").decode()


# --- what of an upstream's head is relayed --------------------------------------------------------


def test_an_upstream_heads_connection_headers_and_date_are_not_relayed_its_own_are() -> None:
    """Headers that describe the upstream's connection (and its date: uvicorn
    sends the proxy's own) stop at the proxy; the answer's own pass, repeats kept."""
    answer = response(
        json.dumps({"id": "c", "choices": []}).encode(),
        "content-type: application/json",
        "Keep-Alive: timeout=5",
        "Proxy-Authenticate: Basic",
        "Upgrade: h2c",
        "Date: Mon, 01 Jan 2001 00:00:00 GMT",
        "X-Request-Id: r-1",
        "Set-Cookie: a=1",
        "Set-Cookie: b=2",
    )

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await read_request(reader) is not None:
            writer.write(answer)
            await writer.drain()

    with _proxy_before_script(script) as proxy:
        relayed = httpx.post(f"{proxy}/chat/completions", json=CHAT)
    assert relayed.status_code == 200, relayed.text
    for name in ("keep-alive", "proxy-authenticate", "upgrade"):
        assert name not in relayed.headers
    assert relayed.headers.get_list("date") != ["Mon, 01 Jan 2001 00:00:00 GMT"]
    assert len(relayed.headers.get_list("date")) == 1
    assert relayed.headers["x-request-id"] == "r-1"
    assert relayed.headers.get_list("set-cookie") == ["a=1", "b=2"]
    assert relayed.headers["x-compaction-stage"] == "none"
