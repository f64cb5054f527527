"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``),
driven by Playwright, against the proxy and a fake upstream on loopback.

A session compacts several times; the browser opens /ui, follows the session's
link, finds the chart and the summary, edits the summary through the page;
the next request of the conversation must carry the edit upstream. And two
callers start the same conversation (one session id): the admin picks one's
session from the page the id opens and saves its settings, which land on
that owner's session alone.

``.ci/run`` installs ``chromium``; where it is absent the test says so and
skips. Set ``UI_SCREENSHOTS_DIR`` (an absolute path: the tests run in a
temporary directory) to keep the pages' screenshots; docs/dashboard.md's come from
``UI_SCREENSHOTS_DIR=$PWD/docs pytest tests/proxy/ui/test_browser.py``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, sync_playwright

from compaction import SUMMARY_MARKER, parse_summary, session_key
from compaction.chat.own import recorded
from proxy.edge.access import owner_digest
from tests.proxy.conftest import ProxyFactory
from tests.proxy.servers import FakeUpstream
from tests.synthetic import agent_session

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
EDITED = "## Goal\n- Ship the parser fix from the browser.\n\n## Next Steps\n- Run the suite."

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH: apt-get install chromium (as .ci/run does)"
)


def _chat(url: str, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": "gpt-4o", "messages": messages}
    response = httpx.post(f"{url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response


def _session_that_compacts(url: str) -> list[dict[str, Any]]:
    """A growing conversation sent turn after turn; returns its last state."""
    compactions = 0
    messages: list[dict[str, Any]] = []
    for steps in range(8, 129, 8):
        messages = agent_session(seed=21, steps=steps, task="Browser test: fix the parser.")
        answered = _chat(url, messages)
        compactions += answered.headers["x-compaction-stage"] not in ("none", "reused")
    assert compactions >= 3, "the session compacts several times"
    return messages


def _shoot(page: Page, name: str, keep: Path | None) -> None:
    """The top of the page, down to 1,800 pixels (a session's event log goes on)."""
    if keep is not None:
        height = min(1800, page.evaluate("document.body.scrollHeight"))
        clip = {"x": 0, "y": 0, "width": 1280, "height": height}
        page.screenshot(path=str(keep / name), full_page=True, clip=clip)


def test_the_dashboard_shows_a_session_and_edits_its_summary(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    upstream, _ = fake
    # Nothing prepared in the background: a summary made after the page was
    # read would be newer than the one edited, and the follow-up would use it.
    url = start_proxy(
        models={"gpt-4o": {"context_window": 8192}}, compaction={"precompute_share": 0}
    )
    base = url.removesuffix("/v1")
    for n, task in enumerate(("Browser test: a short chat.", "Browser test: another one.")):
        _chat(url, agent_session(seed=30 + n, steps=40 + 20 * n, task=task))  # other rows
    messages = _session_that_compacts(url)
    session = session_key(messages)
    keep = Path(os.environ["UI_SCREENSHOTS_DIR"]) if os.environ.get("UI_SCREENSHOTS_DIR") else None

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh profile every run
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = browser.new_page()
            page.goto(f"{base}/ui")
            link = page.locator(f"a.session-link:has-text('{session}')")
            link.wait_for()  # the figures are written in the background
            row = page.locator("#sessions tr", has=link)
            # Named by its task, for its owner (here: a keyless caller, as the visitor).
            assert row.locator("a.session-label").inner_text() == "Browser test: fix the parser."
            assert "/ 8k · limit 6k · trigger 6k" in row.locator("td.context").inner_text()
            _shoot(page, "dashboard-overview.png", keep)
            link.click()
            page.wait_for_url(f"{base}/ui/sessions/{session}")

            chart = page.locator("#context-chart svg")
            assert chart.is_visible()
            # The context as received and as sent, with the trigger and the limit.
            assert chart.locator("polyline").count() == 2
            assert chart.locator("line.rule").count() == 2
            assert chart.locator("circle.mark").count() >= 3  # one per compaction
            summary = page.locator(".rendered-summary").first
            assert summary.is_visible()
            assert summary.locator("h2", has_text="Goal").count() == 1  # Markdown, rendered
            _shoot(page, "dashboard-session.png", keep)

            newest = page.locator(".checkpoint").first
            newest.locator("summary", has_text="Edit this summary").click()
            newest.locator("textarea[name=summary]").fill(EDITED)
            newest.locator("button", has_text="Save summary").click()
            page.wait_for_load_state()
            shown = page.locator(".rendered-summary").first
            assert "Ship the parser fix from the browser." in shown.inner_text()
        finally:
            browser.close()

    follow_up = [
        *messages,
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go"},
    ]
    _chat(url, follow_up)
    sent = upstream.chat_requests[-1].json()["messages"]
    summaries = [m["content"] for m in sent if str(m["content"]).startswith(SUMMARY_MARKER)]
    assert summaries
    # What the upstream received, read as the proxy's own summary.
    forwarded = parse_summary(recorded({"role": "user", "content": summaries[0]}))
    # The edit replaced the body; the file lists the proxy computed stay after it.
    assert forwarded is not None and forwarded.body == EDITED and forwarded.files


def test_the_admin_picks_one_owner_of_a_shared_session_id_and_steers_only_theirs(
    start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    admin_key = "admin-secret-4242"
    url = start_proxy(models={"gpt-4o": {"context_window": 8192}}, server={"admin_key": admin_key})
    base = url.removesuffix("/v1")
    # Two callers start the same conversation: one session id, two sessions.
    messages = agent_session(seed=22, steps=60, task="Browser test: one start, two callers.")
    keys = {"alice": "sk-alice-0123456789", "bob": "sk-bob-9876543210"}
    for key in keys.values():
        body = {"model": "gpt-4o", "messages": messages}
        headers = {"authorization": f"Bearer {key}"}
        answered = httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=60)
        assert answered.status_code == 200, answered.text
    session = session_key(messages)
    owners = {name: owner_digest(key) for name, key in keys.items()}
    as_admin = {"x-compaction-proxy-admin-key": admin_key}

    def settings_of(owner: str) -> dict[str, Any]:
        found = httpx.get(
            f"{url}/compaction/sessions/{session}", params={"owner": owner}, headers=as_admin
        )
        assert found.status_code == 200, found.text
        settings: dict[str, Any] = found.json()["settings"]
        return settings

    # The figures are written in the background: the overview lists a
    # session once its owner's first request is recorded.
    deadline = time.monotonic() + 30
    while not all(_recorded(url, session, owner, as_admin) for owner in owners.values()):
        assert time.monotonic() < deadline, "the two callers' requests were never recorded"
        time.sleep(0.05)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = browser.new_page()
            page.goto(f"{base}/ui/login")
            page.locator("input[name=key]").fill(admin_key)
            page.locator("button", has_text="Sign in").click()
            page.wait_for_url(f"{base}/ui")
            # One row per owner, each linking to its owner's session.
            links = page.locator(f"a.session-link:has-text('{session}')")
            links.nth(1).wait_for()
            hrefs = sorted(links.nth(n).get_attribute("href") or "" for n in range(2))
            assert hrefs == sorted(f"/ui/sessions/{session}?owner={o}" for o in owners.values())

            # Without an owner, the page offers the two to pick from.
            answered = page.goto(f"{base}/ui/sessions/{session}")
            assert answered is not None and answered.status == 409
            assert page.locator("#owners a.owner-link").count() == 2
            page.locator(f"#owners a.owner-link:has-text('{owners['bob']}')").click()
            page.wait_for_url(f"{base}/ui/sessions/{session}?owner={owners['bob']}")

            form = page.locator("#settings-form")
            form.locator("input[name=enabled]").uncheck()
            form.locator("textarea[name=instructions]").fill("Keep Bob's file paths.")
            form.locator("button", has_text="Save settings").click()
            page.wait_for_url(f"{base}/ui/sessions/{session}?owner={owners['bob']}")
            shown = page.locator("#settings-form textarea[name=instructions]")
            assert shown.input_value() == "Keep Bob's file paths."
        finally:
            browser.close()

    # Bob's session is off, with his instructions; Alice's of the same id untouched.
    bobs, alices = settings_of(owners["bob"]), settings_of(owners["alice"])
    assert (bobs["enabled"], bobs["instructions"]) == (False, "Keep Bob's file paths.")
    assert (alices["enabled"], alices["instructions"]) == (True, "")


def _recorded(url: str, session: str, owner: str, headers: dict[str, str]) -> bool:
    found = httpx.get(
        f"{url}/compaction/sessions/{session}", params={"owner": owner}, headers=headers
    )
    return found.status_code == 200 and bool(found.json().get("requests"))
