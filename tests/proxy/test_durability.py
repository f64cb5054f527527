"""State that outlives a process: restarts on the same SQLite file, crashes mid-summary."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from compaction import SUMMARY_MARKER
from tests.proxy.servers import FakeUpstream, ProxyProcess
from tests.synthetic import agent_session

MODELS = json.dumps({"gpt-4o": {"context_window": 8192}})


def _env(db: Path) -> dict[str, str]:
    return {"COMPACTION_PROXY_STORE__URL": f"sqlite:///{db}", "COMPACTION_PROXY_MODELS": MODELS}


#: The caller's key: its events and checkpoints are shown to it alone.
AUTH = {"authorization": "Bearer sk-test"}


def _post(url: str, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers=AUTH,
        timeout=60,
    )


def test_a_restarted_proxy_reuses_the_stored_summary(
    fake: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    upstream, upstream_url = fake
    db = tmp_path / "state" / "state.db"
    messages = agent_session(seed=31, steps=120)

    first = ProxyProcess(upstream_url, _env(db), str(tmp_path))
    try:
        response = _post(first.url, messages)
        assert response.headers["x-compaction-stage"] == "condensed"
        ident = response.headers["x-compaction-id"]
    finally:
        first.stop()
    calls = len(upstream.summary_requests)
    assert calls >= 1 and db.exists()

    second = ProxyProcess(upstream_url, _env(db), str(tmp_path))
    try:
        later = [*messages, {"role": "user", "content": "one more thing"}]
        response = _post(second.url, later)
        assert response.status_code == 200
        assert response.headers["x-compaction-id"] == ident
        checkpoint = httpx.get(f"{second.url}/compaction/checkpoints/{ident}", headers=AUTH).json()
        events = httpx.get(f"{second.url}/compaction/events", headers=AUTH).json()["data"]
    finally:
        second.stop()
    assert len(upstream.summary_requests) == calls, "the restarted proxy summarized again"
    sent = upstream.chat_requests[-1].json()["messages"]
    assert any(str(m.get("content", "")).startswith(SUMMARY_MARKER) for m in sent)
    assert sent[-1]["content"] == "one more thing"
    # Nothing the compaction removed is lost: the originals come back.
    assert checkpoint["originals"] == messages[2 : 2 + checkpoint["covered"]]
    assert [e["type"] for e in events][:3] == [
        "context.compacted",
        "compaction.started",
        "compaction.queued",
    ]


def test_a_process_killed_mid_summary_leaves_a_failed_event(
    fake: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    upstream, upstream_url = fake
    upstream.summary_delay = 60
    db = tmp_path / "state.db"
    proxy = ProxyProcess(upstream_url, _env(db), str(tmp_path))
    worker = threading.Thread(
        target=lambda: _swallow(lambda: _post(proxy.url, agent_session(seed=32, steps=120))),
        daemon=True,
    )
    worker.start()
    deadline = time.monotonic() + 30
    while not upstream.summary_requests:
        assert time.monotonic() < deadline, "the summarizer was never called"
        time.sleep(0.05)
    proxy.stop(kill=True)  # SIGKILL: no chance to clean up

    upstream.summary_delay = 0
    restarted = ProxyProcess(upstream_url, _env(db), str(tmp_path))
    try:
        events = httpx.get(f"{restarted.url}/compaction/events", headers=AUTH).json()["data"]
    finally:
        restarted.stop()
    assert events[0]["type"] == "compaction.failed"
    assert events[0]["error"] == "interrupted by restart"
    assert [e["type"] for e in events[1:3]] == ["compaction.started", "compaction.queued"]
    assert len({e["compaction_id"] for e in events[:3]}) == 1


def _swallow(action: Any) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the proxy is killed under it
        action()


def test_a_second_proxy_on_the_same_file_leaves_the_firsts_work_alone(tmp_path: Path) -> None:
    """SQLite keeps no heartbeats, so a running proxy must not
    take another one's open compaction for a dead instance's and fail it."""
    import asyncio

    from config import load_settings
    from proxy.app import create_app
    from proxy.state.stores import Event, SQLiteStore
    from tests.proxy.servers import serve_in_thread

    db = tmp_path / "shared.db"
    # Upkeep every 0.05 s.
    settings = load_settings(None, store={"url": f"sqlite:///{db}", "heartbeat_seconds": 0.15})
    with serve_in_thread(create_app(settings)):  # the second proxy, running
        other = SQLiteStore(db)  # the first proxy starts a compaction meanwhile
        started = Event(
            compaction_id="c1",
            type="compaction.started",
            session="s",
            model="m",
            reason="threshold",
            instance="first-proxy",
        )
        asyncio.run(other.add_event(started))
        time.sleep(0.5)  # ten upkeep rounds of the second proxy
        events = asyncio.run(other.events(session="s"))
        asyncio.run(other.close())
    assert [e.type for e in events] == ["compaction.started"], [e.type for e in events]
