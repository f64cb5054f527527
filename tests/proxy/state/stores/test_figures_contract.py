"""The store contract for per-request figures, sessions, savings and per-session
settings: every backend (memory, SQLite, Redis, resilient) passes these same tests."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from proxy.state.stores import RequestRecord, SessionSettings, Store
from tests.proxy.state.stores.conftest import Backend

pytestmark = pytest.mark.anyio

HOUR = 3600.0
DAY = 86400.0


def record(session: str = "s1", *, owner: str = "ann", **changes: Any) -> RequestRecord:
    values: dict[str, Any] = {
        "session": session,
        "owner": owner,
        "model": "gpt-4o",
        "stage": "none",
        "reason": "threshold",
        "tokens_before": 1_000,
        "tokens_after": 1_000,
        "input_limit": 100_000,
        "trigger": 80_000,
        "status": 200,
        "ms": 12.5,
    }
    values.update(changes)
    return RequestRecord(**values)


async def test_requests_round_trip_every_field_newest_first(store: Store) -> None:
    now = time.time()
    first = record(created_at=now - 2, api="anthropic", summarizer_calls=2, checkpoint_id="c1")
    second = record(created_at=now - 1, stage="summarize", tokens_after=400)
    await store.record_requests([first, second])
    assert await store.requests("s1") == [second, first]
    assert await store.requests("s1", limit=1) == [second]
    assert await store.requests("other") == []


async def test_requests_are_an_owners_own(store: Store) -> None:
    now = time.time()
    mine = record(owner="ann", created_at=now - 1)
    theirs = record(owner="bob", created_at=now)
    await store.record_requests([mine, theirs])
    assert await store.requests("s1", owner="ann") == [mine]
    assert await store.requests("s1", owner="bob") == [theirs]
    assert await store.requests("s1", owner="eve") == []
    assert await store.requests("s1") == [theirs, mine]  # the admin's view


async def test_sessions_add_up_their_requests(store: Store) -> None:
    now = time.time()
    await store.record_requests(
        [
            record(created_at=now - 30, tokens_before=5_000, tokens_after=5_000),
            record(
                created_at=now - 20,
                stage="summarize",
                tokens_before=90_000,
                tokens_after=10_000,
                summarizer_calls=1,
            ),
        ]
    )
    # A second batch folds into the same summary.
    await store.record_requests(
        [
            record(created_at=now - 10, stage="reused", tokens_before=95_000, tokens_after=15_000),
            record(created_at=now - 5, stage="prune", reason="overflow", status=400),
        ]
    )
    [summary] = await store.sessions()
    assert (summary.session, summary.owner, summary.model) == ("s1", "ann", "gpt-4o")
    assert summary.requests == 4
    assert summary.compactions == 2
    assert summary.saved == 80_000 + 80_000
    assert summary.summarizer_calls == 1
    assert summary.upstream_errors == 1
    assert dict(summary.stages) == {"summarize": 1, "prune": 1}
    assert dict(summary.reasons) == {"threshold": 1, "overflow": 1}
    assert summary.first_at == pytest.approx(now - 30)
    assert summary.last_at == pytest.approx(now - 5)
    assert (summary.tokens_before, summary.tokens_after) == (1_000, 1_000)  # the latest's
    assert (summary.input_limit, summary.trigger) == (100_000, 80_000)


async def test_a_preparation_costs_summarizer_calls_and_is_no_request(store: Store) -> None:
    now = time.time()
    await store.record_requests(
        [
            record(created_at=now - 30, summarizer_tokens=0),
            record(
                created_at=now - 20,
                stage="condensed",
                tokens_before=0,
                tokens_after=0,
                status=0,
                summarizer_calls=2,
                summarizer_tokens=4_321,
                background=True,
            ),
        ]
    )
    await store.record_requests(
        [record(created_at=now - 10, summarizer_calls=1, summarizer_tokens=900)]
    )
    [summary] = await store.sessions()
    assert summary.requests == 2 and summary.compactions == 0
    assert (summary.summarizer_calls, summary.summarizer_tokens) == (3, 5_221)
    assert summary.last_at == pytest.approx(now - 10)
    assert (summary.tokens_before, summary.tokens_after) == (1_000, 1_000)
    kept = await store.requests("s1")
    assert [r.background for r in kept] == [False, True, False]  # newest first


async def test_sessions_newest_first_per_owner_with_limit(store: Store) -> None:
    now = time.time()
    await store.record_requests(
        [
            record("old", created_at=now - 30),
            record("new", created_at=now - 10),
            record("middle", owner="bob", created_at=now - 20),
        ]
    )
    assert [s.session for s in await store.sessions()] == ["new", "middle", "old"]
    assert [s.session for s in await store.sessions(limit=2)] == ["new", "middle"]
    assert [s.session for s in await store.sessions(owner="ann")] == ["new", "old"]
    assert [s.session for s in await store.sessions(owner="bob")] == ["middle"]
    assert await store.sessions(owner="eve") == []


async def test_savings_by_hour_per_owner(store: Store) -> None:
    hour = (time.time() // HOUR) * HOUR
    await store.record_requests(
        [
            record(created_at=hour - HOUR + 1, tokens_before=900, tokens_after=100),
            record(created_at=hour + 1, tokens_before=500, tokens_after=200),
            record(owner="bob", created_at=hour + 2, tokens_before=50, tokens_after=0),
            record(created_at=hour + 3),  # saved nothing
        ]
    )
    assert await store.savings() == [(hour - HOUR, 800), (hour, 350)]
    assert await store.savings(owner="ann") == [(hour - HOUR, 800), (hour, 300)]
    assert await store.savings(owner="eve") == []


async def test_session_settings_default_then_round_trip_per_owner(store: Store) -> None:
    assert await store.session_settings("s1", "ann") == SessionSettings()
    chosen = SessionSettings(enabled=False, instructions="Keep every file path.", updated_at=5.0)
    await store.set_session_settings("s1", "ann", chosen)
    assert await store.session_settings("s1", "ann") == chosen
    assert await store.session_settings("s1", "bob") == SessionSettings()
    await store.set_session_settings("s1", "ann", SessionSettings(instructions="x"))
    assert await store.session_settings("s1", "ann") == SessionSettings(instructions="x")


async def test_figures_past_their_retention_are_dropped(backend: Backend) -> None:
    if backend.expires:
        store = backend.open(requests_retention_seconds=0.3)
        await store.record_requests([record()])
        assert len(await store.requests("s1")) == 1
        await asyncio.sleep(0.5)
        await store.purge()
        assert await store.requests("s1") == []
        assert await store.sessions() == []
        return
    store = backend.open(requests_retention_seconds=DAY)
    now = time.time()
    old = record("old", created_at=now - 3 * DAY, tokens_after=0)
    new = record("new", created_at=now)
    await store.record_requests([old, new])
    await store.purge(now=now)
    assert await store.requests("old") == []
    assert await store.requests("new") == [new]
    assert [s.session for s in await store.sessions()] == ["new"]
    assert await store.savings() == []  # the old hour went with its requests


async def test_figures_survive_reopening(backend: Backend) -> None:
    first = backend.open()
    made = record()
    await first.record_requests([made])
    await first.set_session_settings("s1", "ann", SessionSettings(enabled=False))
    await first.close()
    second = backend.open()
    if not backend.shared:  # memory:// lives and dies with its store, by design
        assert await second.requests("s1") == []
        return
    assert await second.requests("s1") == [made]
    assert [s.requests for s in await second.sessions()] == [1]
    assert (await second.session_settings("s1", "ann")).enabled is False


async def test_sessions_are_counted_per_owner_and_in_all(store: Store) -> None:
    now = time.time()
    await store.record_requests(
        [
            record("s1", owner="ann", created_at=now - 3),
            record("s2", owner="ann", created_at=now - 2),
            record("s1", owner="bob", created_at=now - 1),
            record("s2", owner="ann", created_at=now),
        ]
    )
    assert await store.session_count() == 3
    assert await store.session_count(owner="ann") == 2
    assert await store.session_count(owner="bob") == 1
    assert await store.session_count(owner="eve") == 0


async def test_a_session_keeps_its_label_window_and_every_upstream_error(store: Store) -> None:
    now = time.time()
    await store.record_requests(
        [
            record(created_at=now - 3, task="Fix the flaky test", user_agent="agent/1"),
            # Retried after an overflow, then relayed a 500: two error answers.
            record(created_at=now - 2, reason="overflow", status=500, upstream_errors=2),
            # An empty stream: its own status and error.
            record(created_at=now - 1, status=502, error="upstream_empty", upstream_errors=1),
        ]
    )
    await store.record_requests(
        [record(created_at=now, task="Later words", user_agent="agent/2", context_window=128_000)]
    )
    [summary] = await store.sessions()
    assert summary.task == "Fix the flaky test"  # the task's, not a later request's
    assert summary.user_agent == "agent/2" and summary.context_window == 128_000
    assert summary.upstream_errors == 3 and summary.overflow_retries == 1
    assert summary.label == "Fix the flaky test"
    [latest, empty, *_] = await store.requests("s1")
    assert (empty.status, empty.error) == (502, "upstream_empty")
    assert latest.context_window == 128_000
