"""The dashboard's pages, the app in-process: who sees what, the CSRF and Origin
checks on its buttons, and that no key and no raw HTML ever shows. Each visitor
is a client of its own (its own cookies) on the same running app."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from compaction import session_key
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.servers import FakeUpstream
from tests.synthetic import agent_session

MODELS = {"gpt-4o": {"context_window": 8192}}
ALICE, BOB = "sk-alice-0123456789", "sk-bob-9876543210"
ADMIN = "admin-secret-4242"
PROXY_KEY = "proxy-secret-1717"


def _chat(
    proxy: InProcessProxy, messages: list[dict[str, Any]], key: str, **headers: str
) -> httpx.Response:
    response = proxy.http.post(
        f"{proxy.url}/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"authorization": f"Bearer {key}", **headers},
    )
    assert response.status_code == 200, response.text
    return response


def _root(v1: str) -> str:
    return v1.removesuffix("/v1")


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "every form carries a CSRF token"
    return found.group(1)


def _wait_for_rows(client: httpx.Client, count: int) -> str:
    """The overview once the background writer recorded ``count`` sessions."""
    deadline = time.monotonic() + 10
    while True:
        page = client.get("/ui").text
        if page.count('class="mono session-link"') >= count or time.monotonic() > deadline:
            return page
        time.sleep(0.05)


def _wait_for(client: httpx.Client, path: str, text: str) -> str:
    """The page at ``path`` once it says ``text`` (the figures are written in batches)."""
    deadline = time.monotonic() + 10
    while True:
        page = client.get(path).text
        if text in page or time.monotonic() > deadline:
            return page
        time.sleep(0.05)


def _sign_in(client: httpx.Client, key: str, proxy_key: str = "") -> httpx.Response:
    token = _csrf(client.get("/ui/login").text)
    return client.post("/ui/login", data={"csrf": token, "key": key, "proxy_key": proxy_key})


def test_each_visitor_sees_their_own_sessions_and_never_a_key(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    base = _root(proxy.url)
    alice = agent_session(seed=11, steps=60, task="Pages: Alice's task.")
    bob = agent_session(seed=12, steps=60, task="Pages: Bob's task.")
    _chat(proxy, alice, ALICE)
    _chat(proxy, bob, BOB)

    with proxy.client(base_url=base) as anonymous:
        # Nothing of theirs, but how many there are and how to see them.
        page = _wait_for(anonymous, "/ui", "2 sessions of callers that send an API key")
        assert "2 sessions of callers that send an API key are not shown" in page
        assert "Sign in with the key your agent sends" in page
        assert "No sessions recorded yet" not in page
        assert "Alice" not in page and "Bob" not in page  # no label of theirs
        assert session_key(alice) not in page and session_key(bob) not in page

    with proxy.client(base_url=base) as client:
        assert _sign_in(client, ALICE).status_code == 303
        page = _wait_for_rows(client, 1)
        assert session_key(alice) in page and session_key(bob) not in page
        session_page = client.get(f"/ui/sessions/{session_key(alice)}").text
        assert "<svg" in session_page and "Edit this summary" in session_page
        assert ALICE not in page + session_page
        # Her sessions are named by their task; Bob's name is nowhere.
        assert "Pages: Alice&#39;s task." in page and "Bob" not in page + session_page
        # Bob's session is not Alice's to see: the page of a session that does not exist.
        theirs = client.get(f"/ui/sessions/{session_key(bob)}")
        assert theirs.status_code == 404 and "No such session" in theirs.text
        assert "Bob" not in theirs.text and "Edit this summary" not in theirs.text
        assert "hidden-sessions" not in page  # a signed-in owner is not told of others' sessions

    with proxy.client(base_url=base) as admin:
        assert _sign_in(admin, ADMIN).status_code == 303
        page = _wait_for_rows(admin, 2)
        assert session_key(alice) in page and session_key(bob) in page
        assert ADMIN not in page and ALICE not in page and BOB not in page


def test_a_button_needs_the_pages_token_and_its_own_origin(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    upstream = fake_upstream
    proxy = start_app(models=MODELS)
    base = _root(proxy.url)
    messages = agent_session(seed=13, steps=60, task="Pages: CSRF.")
    # A keyless caller: its sessions are the anonymous visitor's.
    response = proxy.http.post(
        f"{base}/v1/chat/completions", json={"model": "gpt-4o", "messages": messages}
    )
    checkpoint_id = response.headers["x-compaction-id"]
    session = session_key(messages)
    with proxy.client(base_url=base) as client:
        page = client.get(f"/ui/sessions/{session}").text
        token = _csrf(page)
        target = f"/ui/checkpoints/{checkpoint_id}"
        assert client.post(target, data={"summary": "forged"}).status_code == 403
        assert client.post(target, data={"summary": "forged", "csrf": "0" * 32}).status_code == 403
        evil = {"origin": "http://evil.example"}
        forged = client.post(target, data={"summary": "forged", "csrf": token}, headers=evil)
        assert forged.status_code == 403
        # Another browser (another cookie) cannot use this page's token either.
        with proxy.client(base_url=base) as other:
            other.get("/ui")
            assert other.post(target, data={"summary": "x", "csrf": token}).status_code == 403

        edited = "## Goal\n- <script>alert(1)</script> keep **bold**"
        own = {"origin": base}
        saved = client.post(target, data={"summary": edited, "csrf": token}, headers=own)
        assert saved.status_code == 303
        assert saved.headers["location"] == f"/ui/sessions/{session}#checkpoint-{checkpoint_id}"
        page = client.get(f"/ui/sessions/{session}").text
        assert "<script>" not in page  # shown as text, never run
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "<strong>bold</strong>" in page and "<h2>Goal</h2>" in page

    follow_up = [
        *messages,
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "?"},
    ]
    proxy.http.post(
        f"{base}/v1/chat/completions", json={"model": "gpt-4o", "messages": follow_up}
    ).raise_for_status()
    forwarded = str(upstream.chat_requests[-1].json()["messages"])
    assert "<script>alert(1)</script> keep **bold**" in forwarded  # the text, as typed


def test_the_settings_and_compact_now_buttons(start_app: AppFactory) -> None:
    proxy = start_app(models=MODELS)
    base = _root(proxy.url)
    messages = agent_session(seed=14, steps=4, task="Pages: buttons.")
    session = session_key(messages)
    proxy.http.post(
        f"{base}/v1/chat/completions", json={"model": "gpt-4o", "messages": messages}
    ).raise_for_status()
    with proxy.client(base_url=base) as client:
        token = _csrf(_wait_for(client, f"/ui/sessions/{session}", "Compact now"))
        off = client.post(
            f"/ui/sessions/{session}/settings", data={"csrf": token, "instructions": "Keep paths."}
        )
        assert off.status_code == 303  # the box unticked: compaction off
        page = client.get(f"/ui/sessions/{session}").text
        assert "compaction off" in page and "Keep paths.</textarea>" in page
        now = client.post(f"/ui/sessions/{session}/compact", data={"csrf": token})
        assert now.status_code == 303
        assert "pending: the next request compacts" in client.get(f"/ui/sessions/{session}").text
    # Off does not stop a compaction asked for: compact now is manual, like /compact.
    answered = proxy.http.post(
        f"{base}/v1/chat/completions", json={"model": "gpt-4o", "messages": messages}
    )
    assert answered.headers["x-compaction-reason"] == "manual"


def test_with_a_proxy_key_the_dashboard_asks_for_it(start_app: AppFactory) -> None:
    proxy = start_app(models=MODELS, server={"api_key": PROXY_KEY})
    base = _root(proxy.url)
    with proxy.client(base_url=base) as client:
        first = client.get("/ui")
        assert first.status_code == 303 and first.headers["location"] == "/ui/login"
        assert 'name="proxy_key"' in client.get("/ui/login").text
        assert _sign_in(client, ALICE, proxy_key="wrong").status_code == 403
        assert client.get("/ui").status_code == 303
        assert _sign_in(client, ALICE, proxy_key=PROXY_KEY).status_code == 303
        page = client.get("/ui")
        assert page.status_code == 200 and PROXY_KEY not in page.text
        # Signing out needs the page's token too, then the key is asked for again.
        token = _csrf(page.text)
        assert client.post("/ui/logout", data={"csrf": token}).status_code == 303
        assert client.get("/ui").status_code == 303
    # The JSON routes keep the proxy key guard.
    assert proxy.http.get(f"{base}/v1/compaction/sessions").status_code == 401


@pytest.mark.parametrize(
    ("path", "status"),
    [("/ui", 200), ("/ui/login", 200), ("/ui/sessions/abc", 404), ("/ui/nothing/here", 404)],
)
def test_pages_forbid_scripts_and_framing(start_app: AppFactory, path: str, status: int) -> None:
    proxy = start_app(models=MODELS)
    base = _root(proxy.url)
    response = proxy.http.get(base + path)
    assert response.status_code == status
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert "<script" not in response.text


def test_a_session_or_checkpoint_the_visitor_has_nothing_of_is_a_404_page(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    base = _root(proxy.url)
    bob = agent_session(seed=15, steps=60, task="Pages: a session of Bob.")
    checkpoint_id = _chat(proxy, bob, BOB).headers["x-compaction-id"]
    session = session_key(bob)
    with proxy.client(base_url=base) as client:
        assert _sign_in(client, ALICE).status_code == 303
        token = _csrf(client.get("/ui").text)
        own = {"origin": base}
        nowhere = client.get("/ui/sessions/0123456789abcdef")
        theirs = client.get(f"/ui/sessions/{session}")
        assert nowhere.status_code == theirs.status_code == 404
        # The same page either way: it tells nobody whether another caller's exists.
        assert nowhere.text == theirs.text and "No such session" in theirs.text
        for action in ("settings", "compact"):
            posted = client.post(
                f"/ui/sessions/{session}/{action}", data={"csrf": token}, headers=own
            )
            assert posted.status_code == 404, action
        assert client.get(f"/ui/checkpoints/{checkpoint_id}").status_code == 404
        edit = client.post(
            f"/ui/checkpoints/{checkpoint_id}", data={"csrf": token, "summary": "x"}, headers=own
        )
        assert edit.status_code == 404 and "No such checkpoint" in edit.text
        assert client.get("/ui/checkpoints/not-a-checkpoint").status_code == 404
    with proxy.client(base_url=base) as owner:
        assert _sign_in(owner, BOB).status_code == 303
        found = owner.get(f"/ui/checkpoints/{checkpoint_id}")
        assert found.status_code == 303
        assert found.headers["location"] == f"/ui/sessions/{session}#checkpoint-{checkpoint_id}"
        page = _wait_for(owner, f"/ui/sessions/{session}", "Pages: a session of Bob.")
        assert "Pages: a session of Bob." in page and "Edit this summary" in page


def test_a_session_shows_its_label_window_and_tokens_received_and_sent(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS)
    base = _root(proxy.url)
    messages = agent_session(seed=16, steps=60, task="Rename the config loader and fix its tests")
    session = session_key(messages)
    response = proxy.http.post(
        f"{base}/v1/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"user-agent": "my-agent/2.1"},
    )
    received = int(response.headers["x-compaction-tokens-before"])
    sent = int(response.headers["x-compaction-tokens-after"])
    assert received > sent, "precondition: the request was compacted"
    with proxy.client(base_url=base) as client:
        overview = _wait_for(client, "/ui", "session-link")
        page = client.get(f"/ui/sessions/{session}").text
    # Named by the task's first words (cut between words), and the client.
    assert "Rename the config loader and fix its tests" in overview
    assert "my-agent/2.1" in overview and "my-agent/2.1" in page
    # The window is the model's (8,192), the limit and trigger are apart from it.
    row = overview.split('class="context"', 1)[1].split("</td>", 1)[0]
    limit = int((8192 - 2048) * 0.98)
    assert f"/ 8k · limit {limit / 1000:.0f}k · trigger {limit / 1000:.0f}k" in row
    assert f"of a 8,192-token window; limit {limit:,}, trigger {limit:,}" in row
    chart = page.split('id="context-chart"', 1)[1].split("</svg>", 1)[0]
    # Two lines: as received (higher) and as sent, with the trigger and the limit.
    assert chart.count("<polyline") == 2
    assert 'class="received"' in chart and 'class="series"' in chart
    assert ">received</text>" in chart and ">sent</text>" in chart
    assert "limit 6k" in chart and "trigger 6k" in chart
    heights = re.findall(r'<polyline class="(\w+)" points="[\d.]+,([\d.]+)', chart)
    y = {css: float(top) for css, top in heights}
    assert y["received"] < y["series"]  # SVG's y grows downwards: received is above
