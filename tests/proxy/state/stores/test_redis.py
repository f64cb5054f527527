"""What only the Redis backend promises: one round trip, replicas sharing data,
locks across replicas, heartbeats deciding who is dead."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio.connection import AbstractConnection

from proxy.state.stores import RedisStore, open_store
from tests.proxy.state.stores.conftest import _delete_prefix, require_redis
from tests.proxy.state.stores.test_contract import ORIGINALS, checkpoint, event

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
