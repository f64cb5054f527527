"""What only the Redis backend promises: one round trip, replicas sharing data,
locks across replicas, heartbeats deciding who is dead, one clock (the store's)
whatever each replica's says."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError

from proxy.state.stores import RedisStore, StoreError, open_store
from proxy.state.stores.locks import MAX_HOLD, LockBusy
from proxy.state.stores.redis import TRANSACTION_ATTEMPTS, Contended, GarbledReply
from tests.proxy.state.stores.conftest import _delete_prefix, require_redis
from tests.proxy.state.stores.fake_redis import NIL, NUMBER, STATUS, UNDECODABLE, FakeRedis
from tests.proxy.state.stores.test_contract import ORIGINALS, checkpoint, event
from tests.proxy.state.stores.test_figures_contract import record

pytestmark = pytest.mark.anyio

Replicas = Callable[..., RedisStore]


@pytest.fixture
async def replicas(redis_url: str | None, anyio_backend: str) -> AsyncIterator[Replicas]:
    """Stores on one Redis and one key prefix: several proxy replicas."""
    url = require_redis(redis_url)
    prefix = f"test-{uuid.uuid4().hex}:"
    opened: list[RedisStore] = []

    def make(**options: object) -> RedisStore:
        store = open_store(url, key_prefix=prefix, **options)  # type: ignore[arg-type]
        assert isinstance(store, RedisStore)
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()
    await _delete_prefix(url, prefix)


async def test_lookup_is_one_round_trip(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = replicas()
    for index in range(5):
        await store.put(checkpoint(f"h{index}"))
    await store.learned_windows()  # the connection is open and its handshake done

    sent: list[int] = []
    original = AbstractConnection.send_packed_command

    async def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent.append(1)
        await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    chain = [f"h{index}" for index in range(200)]
    found = await store.lookup(chain)
    assert sorted(found) == [f"h{index}" for index in range(5)]
    assert len(sent) == 1


async def test_replicas_share_checkpoints_originals_events_and_windows(
    replicas: Replicas,
) -> None:
    first, second = replicas(), replicas()
    made = checkpoint()
    await first.put(made, ORIGINALS)
    await first.add_event(event("c1", "context.compacted", instance="first"))
    await second.set_learned_window("m", 8192)
    assert await second.lookup(["h1"]) == {"h1": made}
    assert await second.get(made.id) == made
    assert await second.originals(made.id) == ORIGINALS
    assert [item.compaction_id for item in await second.events(session="s1")] == ["c1"]
    assert await first.learned_windows() == {"m": 8192}


async def test_a_lock_held_by_one_replica_blocks_the_other(replicas: Replicas) -> None:
    first, second = replicas(), replicas()
    order: list[str] = []

    async def take(store: RedisStore, name: str) -> None:
        async with store.lock("span", ttl=10):
            order.append(f"{name} in")
            await asyncio.sleep(0.1)
            order.append(f"{name} out")

    await asyncio.gather(take(first, "first"), take(second, "second"))
    assert order in (
        ["first in", "first out", "second in", "second out"],
        ["second in", "second out", "first in", "first out"],
    )


async def test_a_dead_replicas_lock_lapses_for_the_other(replicas: Replicas) -> None:
    dead, alive = replicas(), replicas()
    # What a replica killed inside `async with lock(...)` leaves behind: the key.
    assert await dead._client.set(dead._key("lock", "span"), "dead", nx=True, px=300)
    await dead.close()
    entered = asyncio.Event()

    async def take() -> None:
        async with alive.lock("span", ttl=10):
            entered.set()
            # The lock is the live replica's now, not the dead one's left over.
            assert await alive._client.get(alive._key("lock", "span")) != b"dead"

    task = asyncio.create_task(take())
    await asyncio.sleep(0.05)  # a pause well inside the dead one's 300 ms
    assert not entered.is_set(), "the lock was taken while the dead replica's key stood"
    async with asyncio.timeout(5):
        await task  # …and it lapsed for the other in the end
    assert entered.is_set()


async def test_only_compactions_of_instances_without_heartbeat_are_failed(
    replicas: Replicas,
) -> None:
    store = replicas()
    await store.heartbeat("alive", ttl=10)
    await store.heartbeat("dying", ttl=0.2)
    await store.add_event(event("by-alive", "compaction.started", instance="alive"))
    await store.add_event(event("by-dying", "compaction.started", instance="dying"))
    await store.add_event(event("by-gone", "compaction.queued", instance="gone"))
    assert await store.fail_interrupted("me") == 1  # "gone" never beat
    await asyncio.sleep(0.4)
    assert await store.fail_interrupted("me") == 1  # "dying" stopped beating
    assert await store.fail_interrupted("me") == 0
    failed = {item.compaction_id for item in await store.events() if item.error}
    assert failed == {"by-gone", "by-dying"}


async def test_two_replicas_starting_together_record_one_failure(replicas: Replicas) -> None:
    first, second = replicas(), replicas()
    await first.add_event(event("c", "compaction.started", instance="crashed"))
    counts = await asyncio.gather(first.fail_interrupted("a"), second.fail_interrupted("b"))
    assert sorted(counts) == [0, 1]
    assert [item.type for item in await first.events()] == [
        "compaction.failed",
        "compaction.started",
    ]


async def test_event_lists_are_capped(redis_url: str | None, anyio_backend: str) -> None:
    url = require_redis(redis_url)
    prefix = f"test-{uuid.uuid4().hex}:"
    store = RedisStore.from_url(url, key_prefix=prefix, session_events=3, global_events=5)
    try:
        for index in range(8):
            await store.add_event(event(f"c{index}", session="a" if index < 4 else "b"))
        assert [item.compaction_id for item in await store.events(limit=100)] == [
            "c7",
            "c6",
            "c5",
            "c4",
            "c3",
        ]
        assert len(await store.events(session="a", limit=100)) == 3
    finally:
        await store.close()
        await _delete_prefix(url, prefix)


async def test_every_key_lives_under_the_prefix(replicas: Replicas) -> None:
    store = replicas()
    await store.put(checkpoint(), ORIGINALS)
    await store.add_event(event("c", "compaction.started"))
    await store.heartbeat("me", 10)
    await store.set_learned_window("m", 1)
    prefix = store._prefix
    keys = {key.decode() async for key in store._client.scan_iter(match=prefix + "*")}
    assert {prefix + "events", prefix + "open", prefix + "windows", prefix + "alive:me"} <= keys
    assert all(key.startswith(prefix) for key in keys)
    ttl = await store._client.pttl(prefix + "cp:h1")
    assert 0 < ttl <= 30 * 86400 * 1000


# -- a Redis that answers garbage is a store that is down --------------------------------


async def _within(seconds: float, call: Awaitable[Any]) -> Any:
    """``await call``, failing the test if it has not ended after ``seconds``
    (a deadline for "it ended", which a call that swallows its cancellation
    cannot slip past, unlike ``asyncio.timeout``)."""
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        pytest.fail(f"still running after {seconds} s")
    return task.result()


class Sleeps:
    """The store's pauses, recorded and not waited."""

    def __init__(self) -> None:
        self.pauses: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        await asyncio.sleep(0)


@dataclass(frozen=True)
class Scripted:
    """A store on a :class:`FakeRedis` that answers as scripted, its pauses recorded."""

    fake: FakeRedis
    store: RedisStore
    sleeps: Sleeps


@asynccontextmanager
async def _scripted(
    reply: bytes, replies: dict[str, bytes] | None = None
) -> AsyncIterator[Scripted]:
    async with FakeRedis(reply=reply, replies=replies) as fake:
        sleeps = Sleeps()
        store = RedisStore.from_url(fake.url, timeout=5.0, sleep=sleeps)
        try:
            yield Scripted(fake, store, sleeps)
        finally:
            await store.close()


async def _enter(store: RedisStore, ttl: float) -> None:
    """Take ``store``'s lock on one span; entering it fails the test."""
    async with store.lock("span", ttl=ttl):
        pytest.fail("a lock nobody could have taken was entered")


async def test_a_transaction_whose_exec_answers_nil_is_tried_a_few_times_then_given_up(
    anyio_backend: str,
) -> None:
    # Its clock answers (TIME, a RESP array of two bulk strings), as it must
    # for the figures to be written at all.
    clock = {"TIME": b"*2\r\n$10\r\n1700000000\r\n$1\r\n0\r\n"}
    async with _scripted(NIL, clock) as nil:
        with pytest.raises(Contended):
            await _within(10, nil.store.record_requests([record()]))
        assert nil.fake.names["EXEC"] == TRANSACTION_ATTEMPTS
        assert nil.fake.names["WATCH"] == TRANSACTION_ATTEMPTS
        # A pause before every try but the first, each longer than nothing.
        assert len(nil.sleeps.pauses) == TRANSACTION_ATTEMPTS - 1
        assert all(pause > 0 for pause in nil.sleeps.pauses)


async def test_a_lock_on_a_redis_that_answers_nil_is_refused_not_waited_for(
    anyio_backend: str,
) -> None:
    async with _scripted(NIL) as nil:
        with pytest.raises(GarbledReply):
            await _within(10, _enter(nil.store, ttl=60))
        assert nil.sleeps.pauses == []  # no poll: a held lock has a lease left


async def test_a_waiter_polls_a_lock_held_for_ever_no_longer_than_a_lease_lives(
    replicas: Replicas, redis_url: str | None
) -> None:
    holder = replicas()
    sleeps = Sleeps()
    waiter = RedisStore.from_url(require_redis(redis_url), key_prefix=holder._prefix, sleep=sleeps)
    # A key no live holder leaves: it never lapses.
    assert await holder._client.set(holder._key("lock", "span"), "other", nx=True)

    async def take() -> None:
        async with waiter.lock("span", ttl=0.05):
            pytest.fail("a held lock was entered")

    try:
        with pytest.raises(LockBusy):
            await _within(30, take())
    finally:
        await waiter.close()
    assert sum(sleeps.pauses) >= MAX_HOLD * 0.05
    assert len(sleeps.pauses) < 100  # it backs off: a poll is no spin


@pytest.mark.parametrize("left", [b":-2\r\n", b":0\r\n"], ids=["lapsed", "lapsing"])
async def test_a_lock_whose_lease_always_seems_to_lapse_is_polled_with_pauses(
    left: bytes, anyio_backend: str
) -> None:
    """SET NX never takes it, yet its lease is said to be gone (or going) at
    every look: the waiter pauses between looks and gives up in the end."""
    ttl = 0.01
    async with _scripted(NIL, {"PTTL": left}) as nil:
        with pytest.raises(LockBusy):
            await _within(10, _enter(nil.store, ttl=ttl))
    assert sum(nil.sleeps.pauses) >= MAX_HOLD * ttl
    assert all(pause > 0 for pause in nil.sleeps.pauses)
    # At most one look at once after each pause.
    assert nil.fake.names["PTTL"] <= 2 * (len(nil.sleeps.pauses) + 1)


@pytest.mark.parametrize("reply", [NIL, NUMBER, STATUS, UNDECODABLE], ids=repr)
async def test_replies_of_the_wrong_type_are_store_errors(reply: bytes, anyio_backend: str) -> None:
    """Every operation either succeeds (a reply that happens to fit) or raises a
    store's error — a StoreError, or redis-py's own complaint about the reply —
    never a TypeError or AttributeError for the caller to trip on."""
    async with _scripted(reply) as scripted:
        store = scripted.store
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "lookup": lambda: store.lookup(["h1", "h2"]),
            "holds_checkpoints": lambda: store.holds_checkpoints("o", "s1"),
            "put": lambda: store.put(checkpoint(), ORIGINALS),
            "get": lambda: store.get("c1"),
            "originals": lambda: store.originals("c1"),
            "add_event": lambda: store.add_event(event("c1")),
            "events": lambda: store.events(session="s1"),
            "fail_interrupted": lambda: store.fail_interrupted("me"),
            "heartbeat": lambda: store.heartbeat("me", 30),
            "learned_windows": store.learned_windows,
            "calibrations": store.calibrations,
            "record_requests": lambda: store.record_requests([record()]),
            "requests": lambda: store.requests("s1"),
            "sessions": store.sessions,
            "session_count": store.session_count,
            "savings": store.savings,
            "session_settings": lambda: store.session_settings("s1", "o"),
        }
        failed: list[str] = []
        for name, call in calls.items():
            try:
                await _within(10, call())
            except (StoreError, RedisError):
                failed.append(name)
    if reply == NIL:  # a Redis answers these with a value, never with nil
        expected = {"lookup", "holds_checkpoints", "heartbeat", "fail_interrupted"}
        assert expected | {"learned_windows"} <= set(failed)


DAY = 86_400.0


async def test_a_replica_whose_clock_runs_eight_days_ahead_cuts_none_of_the_others_records(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention is cut by the store's clock: the replica ahead writes records
    stamped 8 days on and purges by its own reckoning, and the others' sessions
    and learned windows (a 7-day retention for both) stay listed."""
    here = replicas(retention_seconds=7 * DAY, requests_retention_seconds=7 * DAY)
    ahead = replicas(retention_seconds=7 * DAY, requests_retention_seconds=7 * DAY)
    now = time.time()
    await here.record_requests([record("mine", created_at=now)])
    await here.set_learned_window("model", 8_192)

    monkeypatch.setattr(time, "time", lambda: now + 8 * DAY)  # all that replica reads of time
    await ahead.record_requests([record("its", owner="bob", created_at=now + 8 * DAY)])
    await ahead.set_calibration("key", 1.1)
    await ahead.purge()
    monkeypatch.undo()

    assert {summary.session for summary in await here.sessions()} == {"mine", "its"}
    assert [summary.session for summary in await here.sessions(owner="ann")] == ["mine"]
    assert await here.session_count() == 2
    assert await here.learned_windows() == {"model": 8_192}
    assert await here.calibrations() == {"key": 1.1}
