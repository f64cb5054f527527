"""Every size a client controls has a limit that holds before anything is
buffered: bodies on every route, model names, session ids, instructions,
summary edits, metric labels; and steering a session or checkpoint the caller
has nothing of is a 404, as on the dashboard's pages.

Bodies are sent straight into the app's ASGI interface with a ``receive``
that counts what it was asked for, so "refused before it was read" is a count
of chunks taken, not a guess from memory use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.state.logs import _ESCAPES, JsonFormatter, TextFormatter, escaped
from proxy.state.metrics import MAX_LABEL_CHARS
from tests.proxy.conftest import AppFactory, ProxyFactory
from tests.proxy.inprocess import InProcessProxy, http_scope
from tests.proxy.servers import FakeUpstream

ALICE, BOB = "sk-alice-0123456789", "sk-bob-9876543210"
CHUNK = b"x" * 65536
#: Small limits, so that crossing them costs the test little.
FORM_LIMIT = 32 * 1024
BODY_LIMIT = 256 * 1024
LIMITS = {
    "max_form_bytes": FORM_LIMIT,
    "max_body_bytes": BODY_LIMIT,
    "max_model_chars": 64,
    "max_session_id_chars": 32,
    "max_instructions_chars": 100,
    "max_summary_chars": 1000,
}


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _started(start_app: AppFactory, **server: Any) -> InProcessProxy:
    return start_app(server={**LIMITS, **server})


def _send_body(
    proxy: InProcessProxy,
    method: str,
    path: str,
    chunks: int,
    *,
    content_type: str,
    declared: int | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes, int]:
    """``chunks`` pieces of 64 KiB sent to ``path`` as a client streams them;
    the status, headers and body of the answer, and how many pieces the app took."""
    taken = 0
    answer: dict[str, Any] = {"body": b""}

    async def call() -> None:
        nonlocal taken

        async def receive() -> dict[str, Any]:
            nonlocal taken
            if taken < chunks:
                taken += 1
                return {"type": "http.request", "body": CHUNK, "more_body": taken < chunks}
            await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                answer["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
            elif message["type"] == "http.response.body":
                answer["body"] += message.get("body", b"")

        sent = {"host": "127.0.0.1", "content-type": content_type, **(headers or {})}
        if declared is not None:
            sent["content-length"] = str(declared)
        else:
            sent["transfer-encoding"] = "chunked"
        raw = [(k.encode(), v.encode()) for k, v in sent.items()]
        scope = http_scope(method, path, raw, client=("127.0.0.1", 50000))
        await proxy.app(scope, receive, send)

    proxy.http.portal.call(call)
    return answer["status"], answer["headers"], answer["body"], taken


# --- bodies, on every route ------------------------------------------------------------

#: Each kind of route, the limit it has, and the shape its refusal takes.
ROUTES = [
    ("POST", "/ui/login", "application/x-www-form-urlencoded", FORM_LIMIT, "page"),
    ("POST", "/ui/sessions/abc/settings", "application/x-www-form-urlencoded", FORM_LIMIT, "page"),
    ("PUT", "/v1/compaction/sessions/abc/settings", "application/json", FORM_LIMIT, "json"),
    ("PUT", "/v1/compaction/checkpoints/abc", "application/json", FORM_LIMIT, "json"),
    ("POST", "/v1/compaction/preview", "application/json", FORM_LIMIT, "json"),
    ("POST", "/v1/chat/completions", "application/json", BODY_LIMIT, "json"),
    ("POST", "/v1/embeddings", "application/json", BODY_LIMIT, "json"),
]


@pytest.mark.parametrize(("method", "path", "content_type", "limit", "shape"), ROUTES)
@pytest.mark.parametrize("declared", [True, False], ids=["with-length", "chunked"])
def test_a_body_over_its_routes_limit_is_refused_as_it_streams_in_never_read_whole(
    start_app: AppFactory,
    method: str,
    path: str,
    content_type: str,
    limit: int,
    shape: str,
    declared: bool,
) -> None:
    # The proxy key is set: the login form must be bounded for a visitor
    # who has no key at all.
    proxy = _started(start_app, api_key="proxy-key-1234")
    chunks = 3200  # 200 MiB, if it were all read
    size = chunks * len(CHUNK)
    status, headers, body, taken = _send_body(
        proxy,
        method,
        path,
        chunks,
        content_type=content_type,
        declared=size if declared else None,
        headers={"x-compaction-proxy-key": "proxy-key-1234"},
    )
    assert status == 413, body[:300]
    # Declared too large: not a byte taken; streamed: no more than the limit.
    assert taken == (0 if declared else limit // len(CHUNK) + 1)
    if shape == "page":
        assert headers["content-type"].startswith("text/html")
        assert b"larger than the limit" in body
    else:
        error = json.loads(body)["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")


def test_a_body_within_its_limit_still_reaches_its_route_whole(start_app: AppFactory) -> None:
    proxy = _started(start_app)
    status, _, body, taken = _send_body(
        proxy, "POST", "/v1/files", 3, content_type="application/octet-stream", declared=None
    )
    assert (status, taken) == (200, 3), body
    assert json.loads(body)["bytes"] == 3 * len(CHUNK)


# --- lengths ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/messages", {"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"input": "hi"}),
    ],
)
def test_a_model_name_over_its_limit_is_a_400_naming_the_model(
    start_app: AppFactory, path: str, body: dict[str, Any]
) -> None:
    proxy = _started(start_app)
    fine = proxy.http.post(path, json={**body, "model": "m" * 64}, headers=_auth(ALICE))
    assert len(proxy.transport.asked()) == 1, fine.text  # sent on, whatever it answers
    refused = proxy.http.post(path, json={**body, "model": "m" * 65}, headers=_auth(ALICE))
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and "64" in error["message"]
    if path == "/v1/messages":  # Anthropic's shape: no param
        assert refused.json()["type"] == "error" and "param" not in error
    else:
        assert error["param"] == "model"
    assert len(proxy.transport.asked()) == 1  # the refused one never left


def test_a_session_id_over_its_limit_is_a_400_on_the_api_and_on_the_pages(
    start_app: AppFactory,
) -> None:
    proxy = _started(start_app)
    long = "a" * 33
    for method, path in [
        ("GET", f"/v1/compaction/sessions/{long}"),
        ("POST", f"/v1/compaction/sessions/{long}/compact"),
    ]:
        refused = proxy.http.request(method, path, headers=_auth(ALICE))
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "session"
    page = proxy.http.get(f"/ui/sessions/{long}")
    assert page.status_code == 400
    assert page.headers["content-type"].startswith("text/html")
    assert "longer than 32 characters" in page.text


def test_a_summary_edit_over_its_limit_is_a_400_naming_the_summary(
    start_app: AppFactory,
) -> None:
    proxy = _started(start_app)
    refused = proxy.http.put(
        "/v1/compaction/checkpoints/any", json={"summary": "s" * 1001}, headers=_auth(ALICE)
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "summary"
    assert "1,000" in refused.json()["error"]["message"]


def _opened(proxy: InProcessProxy, key: str, task: str) -> str:
    """A session of ``key``'s, once its first request is recorded (a second or so)."""
    messages = [{"role": "user", "content": task}]
    answer = proxy.http.post(
        "/v1/chat/completions", json={"model": "gpt-4o", "messages": messages}, headers=_auth(key)
    )
    assert answer.status_code == 200, answer.text
    for _ in range(400):
        sessions = proxy.http.get("/v1/compaction/sessions", headers=_auth(key))
        if sessions.json()["data"]:
            break
        time.sleep(0.025)
    [session] = sessions.json()["data"]
    return str(session["session"])


def test_instructions_over_their_limit_are_a_400_and_change_nothing(
    start_app: AppFactory,
) -> None:
    proxy = _started(start_app)
    session = _opened(proxy, ALICE, "Instructions limit.")
    path = f"/v1/compaction/sessions/{session}/settings"
    refused = proxy.http.put(path, json={"instructions": "i" * 101}, headers=_auth(ALICE))
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "instructions"
    kept = proxy.http.put(path, json={"instructions": "i" * 100}, headers=_auth(ALICE))
    assert kept.status_code == 200 and kept.json()["instructions"] == "i" * 100


# --- steering what is not the caller's ----------------------------------------------


def test_steering_a_session_that_never_was_or_is_another_callers_is_a_404(
    start_app: AppFactory,
) -> None:
    proxy = _started(start_app)
    session = _opened(proxy, ALICE, "Alice's own session.")
    attempts = [
        ("GET", "/v1/compaction/sessions/{}", None),
        ("PUT", "/v1/compaction/sessions/{}/settings", {"enabled": False}),
        ("POST", "/v1/compaction/sessions/{}/compact", None),
    ]
    for method, template, body in attempts:
        for key, target in [(ALICE, "0123456789abcdef"), (BOB, session)]:
            refused = proxy.http.request(
                method, template.format(target), json=body, headers=_auth(key)
            )
            assert refused.status_code == 404, (method, template, key, refused.text)
            error = refused.json()["error"]
            assert (error["code"], error["message"]) == ("not_found", "No such session.")
    # Bob's "compact now" of Alice's session left nothing pending for her.
    later = [
        {"role": "user", "content": "Alice's own session."},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "Go on."},
    ]
    answer = proxy.http.post(
        "/v1/chat/completions", json={"model": "gpt-4o", "messages": later}, headers=_auth(ALICE)
    )
    assert answer.headers["x-compaction-stage"] == "none"
    assert proxy.http.get(f"/v1/compaction/sessions/{session}", headers=_auth(ALICE)).is_success
    owned = proxy.http.post(f"/v1/compaction/sessions/{session}/compact", headers=_auth(ALICE))
    assert owned.status_code == 202
    edited = proxy.http.put(
        "/v1/compaction/checkpoints/0123456789abcdef", json={"summary": "x"}, headers=_auth(BOB)
    )
    assert edited.status_code == 404


# --- metric labels ------------------------------------------------------------------


def test_long_model_names_do_not_grow_a_metrics_scrape(start_app: AppFactory) -> None:
    proxy = start_app(server={"max_model_chars": 256})
    names = [f"{i:03d}" + "n" * 250 for i in range(30)]
    for name in names:
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
        assert proxy.http.post("/v1/chat/completions", json=body).status_code == 200
    scrape = proxy.http.get("/metrics").text
    assert not any(name in scrape for name in names)
    assert 'model="other"' in scrape
    labels = re.findall(r'model="([^"]*)"', scrape)
    assert labels and max(len(label) for label in labels) <= MAX_LABEL_CHARS


# --- the text log ------------------------------------------------------------------


def _record(message: str, *args: object, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "compaction_proxy.requests", logging.INFO, "f", 1, message, args, None
    )
    record.fields = fields
    return record


FORGERIES = ["\n2026-01-01 00:00:00,000 INFO forged: x", "\r", "\x1b[2J", "\x85", "\u2028", "\x00"]


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_text_log_line_escapes_control_characters_in_every_field(forgery: str) -> None:
    record = _record(f"chat {forgery}", model=f"gpt{forgery}", **{f"k{forgery}": forgery})
    line = TextFormatter().format(record)
    controls = [c for c in line if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\u2028\u2029"]
    assert controls == []
    assert len(line.splitlines()) == 1


@given(st.text())
def test_a_field_is_escaped_exactly_as_the_escape_table_says(text: str) -> None:
    # The formatter skips the translation for text it finds printable.
    assert escaped(text) == text.translate(_ESCAPES)
    assert not set(map(ord, escaped(text))) & set(_ESCAPES)


def test_a_json_log_line_is_one_line_whatever_a_field_holds() -> None:
    record = _record("chat", model='gpt\n{"level": "error"}\r\x1b')
    line = JsonFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert json.loads(line)["model"] == 'gpt\n{"level": "error"}\r\x1b'


def test_an_upload_over_the_limit_through_the_real_transport_is_a_413_and_never_sent_whole(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    url = start_proxy(server={"max_body_bytes": BODY_LIMIT})

    def pieces() -> Iterator[bytes]:
        for _ in range(64):  # 4 MiB, sixteen times the limit
            yield CHUNK

    for content in (CHUNK * 64, pieces()):  # with a length, and without one
        answer = httpx.post(f"{url}/files", content=content, timeout=30)
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"]["code"] == "request_too_large"
    assert not any(r.path == "/v1/files" and len(r.body) > BODY_LIMIT for r in upstream.received)
