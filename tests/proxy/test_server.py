"""Everything around the chat path: errors, other routes, credentials, exposure, streams.

In-process (``start_app``) unless a test is about the network: timeouts, clients
leaving, a broken body as the client reads it, an unreachable address, the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from starlette.responses import Response

from config import load_settings
from proxy.app import create_app
from tests.proxy.conftest import AppFactory, ProxyFactory
from tests.proxy.inprocess import RecordingTransport
from tests.proxy.servers import FakeUpstream, serve_in_thread
from tests.synthetic import agent_session

HI = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
JSON = {"content-type": "application/json"}
#: A second upstream, for the models configured with one of their own.
LOCAL_URL = "http://local.test/v1"


# --- bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"model": "gpt-4o"}', "'messages' is a required property"),
        (b'{"messages": "hi"}', "messages"),
        (b'{"messages": [42]}', "messages[0]"),
        (b'{"messages": [{"content": "x"}]}', "messages[0].role"),
        (b'{"model": 5, "messages": []}', "'model' must be a string"),
        (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "not valid JSON"),
        (b"[" * 5000 + b"]" * 5000, "not valid JSON"),
        # Deeper than orjson writes (254) but not than it reads (1024).
        (
            b'{"messages": [{"role": "user", "content": ' + b"[" * 300 + b"]" * 300 + b"}]}",
            "nested too deeply",
        ),
        (b'{"messages": [], "metadata": ' + b"[" * 300 + b"]" * 300 + b"}", "nested too deeply"),
    ],
)
def test_bad_bodies_get_openai_shaped_400(
    start_app: AppFactory, fake_upstream: FakeUpstream, raw: bytes, needle: str
) -> None:
    proxy = start_app()
    response = proxy.http.post(f"{proxy.url}/chat/completions", content=raw, headers=JSON)
    assert response.status_code == 400
    error = response.json()["error"]
    assert needle in error["message"] and error["type"] == "invalid_request_error"
    assert fake_upstream.received == []


def test_body_above_the_limit_gets_413_before_parsing(start_app: AppFactory) -> None:
    proxy = start_app(server={"max_body_bytes": 1000})
    response = proxy.http.post(f"{proxy.url}/chat/completions", content=b"x" * 5000, headers=JSON)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"

    def chunks() -> Any:  # no content-length: counted while reading
        for _ in range(10):
            yield b"x" * 500

    streamed = proxy.http.post(f"{proxy.url}/chat/completions", content=chunks(), headers=JSON)
    assert streamed.status_code == 413


def test_unreachable_upstream_gives_502_revealing_nothing(tmp_path: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    settings = load_settings(None, upstream={"base_url": f"http://127.0.0.1:{port}/v1"})
    with serve_in_thread(create_app(settings)) as url:
        response = httpx.post(f"{url}/v1/chat/completions", json=HI)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_unreachable" and str(port) not in response.text


def test_silent_upstream_gives_bounded_504(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    fake[0].behaviours = ["hang"]
    url = start_proxy(upstream={"read_timeout": 0.5})
    # The client would wait 10 s: a 504 is the proxy's own bound at work.
    response = httpx.post(f"{url}/chat/completions", json=HI, timeout=10)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"


def test_stream_dropped_mid_way_ends_with_an_error_event_and_a_broken_response(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    fake[0].behaviours = ["drop"]
    url = start_proxy()
    received = b""
    with (
        pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"),
        httpx.stream(
            "POST", f"{url}/chat/completions", json={**HI, "stream": True}, timeout=10
        ) as response,
    ):
        for chunk in response.iter_raw():
            received += chunk
    # The client is told why, and cannot take the stream for a whole one.
    events = [e for e in received.decode().split("\n\n") if e]
    assert "upstream_dropped" in events[-1]
    assert "[DONE]" not in received.decode()


# --- streams -----------------------------------------------------------------


def test_client_disconnect_cancels_the_upstream_stream(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    upstream.chunks, upstream.chunk_delay = 200, 0.05  # a 10-second stream
    url = start_proxy()
    with httpx.stream("POST", f"{url}/chat/completions", json={**HI, "stream": True}) as response:
        lines = response.iter_lines()
        next(lines)
        next(lines)
    left = time.monotonic()
    while not upstream.stream_closed and time.monotonic() - left < 3:
        time.sleep(0.02)
    assert upstream.stream_closed, "the upstream stream was never closed"
    # Closed by the client's leaving, not by its end: most events were never made.
    assert upstream.stream_sent[0] < upstream.chunks // 2


def test_client_leaving_a_slow_answer_closes_the_upstream_request(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    upstream.behaviours.append("hang")  # answers only when the proxy gives up
    url = start_proxy()
    with pytest.raises(httpx.ReadTimeout):  # the client's own timeout, past ARM_AFTER
        httpx.post(f"{url}/chat/completions", json=HI, timeout=1.5)
    left = time.monotonic()
    while not upstream.hang_closed and time.monotonic() - left < 3:
        time.sleep(0.02)
    # The proxy's own read timeout is minutes away: only the client's leaving
    # can have closed the upstream request within the wait above.
    assert upstream.hang_closed, "the upstream request was left running"
    assert httpx.post(f"{url}/chat/completions", json=HI).status_code == 200


def test_client_leaving_before_a_streams_first_event_closes_the_upstream_request(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    """The proxy holds a stream's headers until its first event (an empty stream
    may be an overflow); a client leaving meanwhile still cancels the upstream."""
    upstream, _ = fake
    upstream.behaviours.append("hang-stream")
    url = start_proxy()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/chat/completions", json={**HI, "stream": True}, timeout=1.5)
    left = time.monotonic()
    while not upstream.hang_closed and time.monotonic() - left < 3:
        time.sleep(0.02)
    # As above: the proxy's read timeout is minutes away.
    assert upstream.hang_closed, "the upstream stream was left running"


def test_fifty_concurrent_streams_all_complete(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    upstream.chunks, upstream.chunk_delay = 10, 0.01
    url = start_proxy()

    async def one(sdk: openai.AsyncOpenAI, i: int) -> str:
        stream = await sdk.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"n{i}"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def burst() -> list[str]:
        async with openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
            return await asyncio.gather(*(one(sdk, i) for i in range(50)))

    texts = asyncio.run(burst())
    expected = "".join(f"w{i} " for i in range(10))
    assert texts == [expected] * 50


# --- other routes -------------------------------------------------------------


def test_other_routes_are_forwarded_unchanged(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    upstream = fake_upstream
    proxy = start_app()
    sdk = proxy.openai(api_key="sk-x", max_retries=0)
    assert [m.id for m in sdk.models.list()] == ["gpt-4o"]
    embedding = sdk.embeddings.create(model="e", input=["a", "b"])
    assert len(embedding.data) == 2
    assert upstream.received[-1].path == "/v1/embeddings"
    assert upstream.received[-1].headers["authorization"] == "Bearer sk-x"
    relayed = proxy.http.get(f"{proxy.url}/nothing-here")  # the upstream's own 404, relayed
    assert relayed.status_code == 404 and relayed.text == "Not Found"
    missing = proxy.http.get(proxy.url.removesuffix("/v1") + "/nothing-here")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_large_upload_is_streamed_through_intact(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    upstream = fake_upstream
    proxy = start_app()
    payload = os.urandom(3 << 20)  # above the size read whole: sent on chunked

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(payload), 100_000):
            yield payload[start : start + 100_000]

    for content in (payload, chunks()):  # with a length, and without one
        response = proxy.http.post(f"{proxy.url}/files", content=content)
        assert response.status_code == 200, response.text
        assert response.json() == {
            "object": "file",
            "bytes": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
    assert upstream.received[-1].path == "/v1/files"
    deleted = proxy.http.delete(f"{proxy.url}/files/file-1")  # no body: none is invented on the way
    assert deleted.json() == {"id": "file-1", "object": "file", "deleted": True}
    forwarded = upstream.received[-1]
    assert forwarded.body == b"" and "transfer-encoding" not in forwarded.headers


def test_preview_shows_what_would_be_sent_without_calling_the_model(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    proxy = start_app(
        models={"gpt-4o": {"context_window": 8192}}, compaction={"summarizer": "extractive"}
    )
    body = {"model": "gpt-4o", "messages": agent_session(seed=11, steps=120)}
    response = proxy.http.post(f"{proxy.url}/compaction/preview", json=body)
    assert response.status_code == 200
    preview = response.json()
    assert preview["report"]["stage"] in ("condensed", "truncated")
    assert preview["report"]["tokens_after"] <= preview["report"]["input_limit"]
    assert len(preview["messages"]) < len(body["messages"])
    assert fake_upstream.received == []


def test_preview_of_a_compacted_conversation_names_the_checkpoint_it_would_reuse(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    proxy = start_app(
        models={"gpt-4o": {"context_window": 8192}}, compaction={"summarizer": "extractive"}
    )
    messages = agent_session(seed=12, steps=120)
    sent = proxy.http.post(
        f"{proxy.url}/chat/completions", json={"model": "gpt-4o", "messages": messages}
    )
    made = sent.headers["x-compaction-id"]
    later = [*messages, {"role": "user", "content": "and?"}]
    preview = proxy.http.post(
        f"{proxy.url}/compaction/preview", json={"model": "gpt-4o", "messages": later}
    ).json()
    assert preview["report"]["stage"] == "reused"
    assert preview["report"]["checkpoint"] == made
    assert preview["messages"][-1] == later[-1]


def test_healthz(start_app: AppFactory) -> None:
    proxy = start_app()
    assert proxy.http.get(proxy.url.removesuffix("/v1") + "/healthz").json() == {"status": "ok"}


def test_checkpoint_endpoint_returns_the_replacement(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    proxy = start_app(
        models={"gpt-4o": {"context_window": 8192}}, compaction={"summarizer": "extractive"}
    )
    body = {"model": "gpt-4o", "messages": agent_session(seed=12, steps=120)}
    ident = proxy.http.post(f"{proxy.url}/chat/completions", json=body).headers["x-compaction-id"]
    checkpoint = proxy.http.get(f"{proxy.url}/compaction/checkpoints/{ident}").json()
    assert checkpoint["id"] == ident and checkpoint["covered"] > 0
    assert checkpoint["replacement"]
    assert proxy.http.get(f"{proxy.url}/compaction/checkpoints/nope").status_code == 404


def test_each_model_goes_to_its_own_upstream(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    main, local = fake_upstream, FakeUpstream()
    transport = RecordingTransport(app=main.app(), routes={LOCAL_URL: local.app()})
    proxy = start_app(
        transport=transport,
        models={"llama3.1:8b": {"upstream": LOCAL_URL, "context_window": 8192}},
    )
    proxy.http.post(f"{proxy.url}/chat/completions", json=HI)
    proxy.http.post(f"{proxy.url}/chat/completions", json={**HI, "model": "llama3.1:8b"})
    assert [r.json()["model"] for r in main.chat_requests] == ["gpt-4o"]
    assert [r.json()["model"] for r in local.chat_requests] == ["llama3.1:8b"]


# --- credentials and exposure ---------------------------------------------------


def test_configured_key_is_used_only_when_the_client_sends_none(
    start_app: AppFactory, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-configured")
    proxy = start_app()
    proxy.http.post(f"{proxy.url}/chat/completions", json=HI)
    proxy.http.post(
        f"{proxy.url}/chat/completions", json=HI, headers={"authorization": "Bearer sk-mine"}
    )
    proxy.http.post(f"{proxy.url}/chat/completions", json=HI, headers={"api-key": "azure-key"})
    sent = [r.headers for r in fake_upstream.chat_requests]
    assert sent[0]["authorization"] == "Bearer sk-configured"
    assert sent[1]["authorization"] == "Bearer sk-mine"
    assert sent[2]["api-key"] == "azure-key" and "authorization" not in sent[2]


def test_the_configured_key_is_read_from_the_environment_once(
    start_app: AppFactory, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process's environment is set before it starts: the variable is read
    for the first request that needs it, not again for every request."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-configured")
    proxy = start_app()
    proxy.http.post(f"{proxy.url}/chat/completions", json=HI)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-changed-in-the-process")
    proxy.http.post(f"{proxy.url}/chat/completions", json=HI)
    sent = [r.headers["authorization"] for r in fake_upstream.chat_requests]
    assert sent == ["Bearer sk-configured", "Bearer sk-configured"]


def test_the_configured_key_never_goes_to_a_models_own_upstream(
    start_app: AppFactory, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyless request for a model with an upstream of its own reaches it without
    the global key, which belongs to [upstream] and must not leak elsewhere."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-configured")
    local = FakeUpstream()
    transport = RecordingTransport(app=fake_upstream.app(), routes={LOCAL_URL: local.app()})
    proxy = start_app(transport=transport, models={"local-*": {"upstream": LOCAL_URL}})
    proxy.http.post(f"{proxy.url}/chat/completions", json={**HI, "model": "local-llama"})
    proxy.http.post(f"{proxy.url}/chat/completions", json=HI)  # the default upstream still gets it
    assert "authorization" not in local.chat_requests[0].headers
    assert fake_upstream.chat_requests[0].headers["authorization"] == "Bearer sk-configured"


def test_proxy_key_is_required_and_never_forwarded(
    start_app: AppFactory, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-upstream")
    proxy = start_app(server={"api_key": "proxy-secret"})
    assert proxy.http.post(f"{proxy.url}/chat/completions", json=HI).status_code == 401
    wrong = proxy.http.post(
        f"{proxy.url}/chat/completions", json=HI, headers={"authorization": "Bearer no"}
    )
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    sdk = proxy.openai(api_key="proxy-secret", max_retries=0)
    sdk.chat.completions.create(**HI)
    dedicated = proxy.http.post(
        f"{proxy.url}/chat/completions",
        json=HI,
        headers={"x-compaction-proxy-key": "proxy-secret", "authorization": "Bearer sk-own"},
    )
    assert dedicated.status_code == 200
    sent = [r.headers for r in fake_upstream.chat_requests]
    assert sent[0]["authorization"] == "Bearer sk-upstream"
    assert sent[1]["authorization"] == "Bearer sk-own"
    assert all("proxy-secret" not in str(h) for h in sent)
    assert proxy.http.get(proxy.url.removesuffix("/v1") + "/healthz").status_code == 200


def test_non_local_host_header_is_refused(start_app: AppFactory) -> None:
    proxy = start_app()
    evil = proxy.http.post(
        f"{proxy.url}/chat/completions", json=HI, headers={"host": "evil.example"}
    )
    assert evil.status_code == 403
    local = proxy.http.get(
        proxy.url.removesuffix("/v1") + "/healthz", headers={"host": "localhost:8808"}
    )
    assert local.status_code == 200


def test_no_cors_headers_unless_configured(start_app: AppFactory) -> None:
    proxy = start_app()
    response = proxy.http.post(
        f"{proxy.url}/chat/completions", json=HI, headers={"origin": "https://site.example"}
    )
    assert not any(h.startswith("access-control-") for h in response.headers)


def test_secrets_and_content_never_reach_the_logs(
    start_app: AppFactory, fake_upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    sentinel = "sk-SENTINEL-0123456789"
    secret_text = "TOP-SECRET-CONVERSATION-TEXT"
    proxy = start_app(models={"gpt-4o": {"context_window": 8192}}, compaction={"summarizer": "llm"})
    messages = agent_session(seed=13, steps=120, task=secret_text)
    with caplog.at_level(logging.DEBUG):
        sdk = proxy.openai(api_key=sentinel, max_retries=0)
        sdk.chat.completions.create(model="gpt-4o", messages=messages)
        fake_upstream.behaviours = ["500"]
        with pytest.raises(openai.InternalServerError):
            sdk.chat.completions.create(model="gpt-4o", messages=messages)
    assert caplog.records, "nothing was logged at all"
    assert sentinel not in caplog.text
    assert secret_text not in caplog.text


@pytest.mark.parametrize("query", ["limit=0", "limit=abc", "limit=100000"])
def test_bad_query_parameters_get_openais_error_shape(start_app: AppFactory, query: str) -> None:
    proxy = start_app()
    response = proxy.http.get(f"{proxy.url}/compaction/events?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "limit"
    assert "detail" not in response.json()


def test_clients_leaving_pass_through_requests_free_the_upstream_pool() -> None:
    """Clients leaving /v1/... requests the upstream has not answered must not keep
    the pooled connections: when three did, the next request got 504."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    from config import load_settings
    from proxy.app import create_app

    closed: list[float] = []

    async def slow(request: Any) -> Response:
        while not await request.is_disconnected():  # until the proxy gives up
            await asyncio.sleep(0.02)
        closed.append(time.monotonic())
        return Response(status_code=499)

    async def fast(request: Any) -> Response:
        return Response(b'{"ok": true}', media_type="application/json")

    upstream = Starlette(routes=[Route("/v1/slow", slow), Route("/v1/fast", fast)])
    with serve_in_thread(upstream) as upstream_url:
        settings = load_settings(
            None,
            store={"url": "memory://"},
            upstream={"base_url": upstream_url + "/v1", "max_connections": 3},
        )
        with serve_in_thread(create_app(settings)) as base:

            def leave() -> None:
                with contextlib.suppress(httpx.ReadTimeout):
                    httpx.get(f"{base}/v1/slow", timeout=1.5)

            threads = [threading.Thread(target=leave) for _ in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            left = time.monotonic()
            while len(closed) < 3 and time.monotonic() - left < 3:
                time.sleep(0.02)
            assert len(closed) == 3, "abandoned upstream requests were left running"
            assert httpx.get(f"{base}/v1/fast", timeout=10).status_code == 200
