"""Background preparations are capped, and their summaries never take the
connections the requests need (proxy/session/background.py, ahead.py).

The proxy runs in-process with its real transports, in front of a loopback
upstream that holds every summary request until the test lets it go, so
the preparations pile up the way a slow model makes them. Counted, never
timed: how many summaries were open at once (in all, and for one caller),
how many preparations were refused and why, and what the caller got.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from proxy.app import create_app
from tests.proxy.inprocess import settings_for
from tests.proxy.servers import SUMMARY_TEXT
from tests.proxy.summary_upstream import SummaryUpstream, chat_reply, serve_summaries
from tests.synthetic import agent_session

#: Past the precompute share of this window's trigger, short of the trigger:
#: each such request is forwarded and starts a preparation that asks for a summary.
MODEL = {"context_window": 32_768, "precompute_share": 0.3, "tool_result_chars": 1_000_000}
USER_POOL = 4
MAX_RUNNING = 3
BACKGROUND_POOL = 2


def _metric(http: TestClient, name: str, outcome: str | None = None) -> float:
    text = http.get("/metrics").text
    labels = f'{{outcome="{outcome}"}}' if outcome is not None else ""
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


@pytest.fixture
def held() -> Iterator[tuple[SummaryUpstream, str, threading.Event]]:
    """The upstream holding every summary until the event is set."""
    release = threading.Event()

    async def answer(writer: asyncio.StreamWriter, key: str) -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)
        writer.write(chat_reply(SUMMARY_TEXT))
        await writer.drain()

    with serve_summaries(answer) as (upstream, url):
        try:
            yield upstream, url, release
        finally:
            release.set()


def _post(http: TestClient, key: str, seed: int, steps: int = 20) -> httpx.Response:
    body = {"model": "gpt-4o", "messages": agent_session(seed=seed, steps=steps)}
    return http.post("/v1/chat/completions", json=body, headers={"authorization": key})


def test_background_preparations_are_capped_and_never_take_a_request_connection(
    held: tuple[SummaryUpstream, str, threading.Event],
) -> None:
    upstream, url, release = held
    settings = settings_for(
        upstream={"base_url": url, "max_connections": USER_POOL, "connect_timeout": 1.0},
        background={
            "max_running": MAX_RUNNING,
            "max_running_per_owner": 1,
            "max_connections": BACKGROUND_POOL,
        },
        models={"gpt-4o": MODEL},
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as http:
        # Six callers near their trigger; the first one twice (another conversation).
        keys = [f"Bearer sk-{n}" for n in range(6)]
        answers = [_post(http, keys[0], seed=100)]
        answers.append(_post(http, keys[0], seed=101))
        answers += [_post(http, key, seed=n) for n, key in enumerate(keys[1:], start=1)]
        assert [a.status_code for a in answers] == [200] * 7
        assert all(a.headers["x-compaction-stage"] == "none" for a in answers)

        running = _metric(http, "compaction_proxy_background_running")
        # Every preparation started has asked for its summary, and the
        # background's pool is full of them.
        _until(
            lambda: (
                _metric(http, "compaction_proxy_summarizer_calls_total") >= running
                and upstream.open >= min(running, BACKGROUND_POOL)
            ),
            "the preparations ask for their summaries",
        )

        # Another caller's request while they are held: answered, not a 504
        # for want of a pooled connection.
        chats = upstream.chats
        other = _post(http, "Bearer sk-other", seed=7, steps=2)
        assert other.status_code == 200, other.text
        assert upstream.chats == chats + 1

        assert running == MAX_RUNNING
        assert _metric(http, "compaction_proxy_background_jobs_total", "owner_at_capacity") == 1
        assert _metric(http, "compaction_proxy_background_jobs_total", "at_capacity") == 3
        assert upstream.most_open <= BACKGROUND_POOL
        assert upstream.most_open_by_key == 1

        release.set()
        _until(
            lambda: _metric(http, "compaction_proxy_background_running") == 0,
            "the preparations finish",
        )
        assert _metric(http, "compaction_proxy_background_jobs_total", "prepared") == MAX_RUNNING
        # Only the callers whose preparation started were summarized for.
        assert set(upstream.open_by_key) == {keys[0], keys[1], keys[2]}


def test_a_preparation_refused_for_a_cap_is_closed_unrun() -> None:
    from proxy.session.background import Background

    ran: list[str] = []
    refused: list[str] = []

    async def work(name: str, gate: asyncio.Event) -> None:
        ran.append(name)
        await gate.wait()

    async def run() -> list[Any]:
        gate = asyncio.Event()
        background = Background(max_running=2, max_per_owner=1, on_refused=refused.append)
        outcomes = [
            background.start("a", work("a", gate), owner="alice"),
            background.start("a", work("a again", gate), owner="alice"),
            background.start("b", work("b", gate), owner="alice"),
            background.start("c", work("c", gate), owner="bob"),
            background.start("d", work("d", gate), owner="carol"),
        ]
        await asyncio.sleep(0)
        gate.set()
        await background.close(5)
        # Once they are done, their owners' and the process's slots are free again.
        outcomes.append(background.start("b", work("b", gate), owner="alice"))
        await background.close(5)
        return outcomes

    outcomes = asyncio.run(run())
    assert outcomes == [
        "started",
        "running",
        "owner_at_capacity",
        "started",
        "at_capacity",
        "started",
    ]
    assert refused == ["owner_at_capacity", "at_capacity"]
    assert sorted(ran) == ["a", "b", "c"]
