"""Held keys after an upgrade (``proxy/state/stores/redis/held.py``): a
checkpoint a proxy from before them wrote still holds its session, found by a
backfill that runs once, in the background, one replica at a time, waits out
the replicas from before, never shortens a key, keeps to its prefix, and gives
up (to try again) on a Redis that answers garbage — and, through the proxy, a
``/compact`` made on a small conversation by such a replica still applies to
its later small requests on this version's."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from compaction import Checkpoint, Message, session_key
from proxy.session.untouched import EARLY_SHARE
from proxy.state.stores import RedisStore, codec
from proxy.state.stores.redis.core import SCHEME
from proxy.state.stores.redis.held import BACKFILL_BATCH, RECHECK_SECONDS, SCHEME_KEY
from tests.proxy.inprocess import RecordingTransport, running, settings_for
from tests.proxy.servers import FakeUpstream
from tests.proxy.state.stores.conftest import _delete_prefix, require_redis
from tests.proxy.state.stores.fake_redis import NIL, FakeRedis
from tests.proxy.state.stores.test_contract import checkpoint
from tests.synthetic import agent_session

DAY_MS = 86_400_000
#: The retention every store here keeps checkpoints for (the default, 30 days).
RETENTION_MS = 30 * DAY_MS

Stores = Callable[..., RedisStore]


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex}:"


@pytest.fixture
async def raw(
    redis_url: str | None, prefix: str, anyio_backend: str
) -> AsyncIterator[aioredis.Redis]:
    """A plain client on the tests' Redis: what an older proxy wrote, written
    as it wrote it; the prefix's keys deleted afterwards."""
    url = require_redis(redis_url)
    client = aioredis.Redis.from_url(url)
    yield client
    await client.aclose()
    await _delete_prefix(url, prefix)


@pytest.fixture
async def stores(redis_url: str | None, prefix: str, anyio_backend: str) -> AsyncIterator[Stores]:
    """This version's stores on the prefix: several replicas."""
    url = require_redis(redis_url)
    opened: list[RedisStore] = []

    def make(**options: Any) -> RedisStore:
        store = RedisStore.from_url(url, key_prefix=options.pop("key_prefix", prefix), **options)
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


async def put_the_old_way(
    client: aioredis.Redis,
    prefix: str,
    made: Checkpoint,
    *,
    owner: str = "alice",
    ttl_ms: int = RETENTION_MS,
    originals: Sequence[Message] | None = None,
) -> None:
    """``made`` stored as a proxy from before held keys stored it: the same
    keys and expiries, no ``held:`` key."""
    raw = codec.dump_checkpoint(made)
    async with client.pipeline(transaction=True) as pipe:
        pipe.set(f"{prefix}cp:{made.end_hash}", raw, px=ttl_ms)
        pipe.set(f"{prefix}ckpt:{made.id}", raw, px=ttl_ms)
        pipe.set(f"{prefix}owner:{made.id}", owner, px=ttl_ms)
        if originals is not None:
            pipe.set(f"{prefix}orig:{made.id}", codec.dump_messages(originals), px=ttl_ms)
        await pipe.execute()


def held_key(prefix: str, owner: str, session: str) -> str:
    return f"{prefix}held:{owner}\x1f{session}"


@pytest.mark.anyio
async def test_a_checkpoint_from_before_held_keys_holds_its_session(
    raw: aioredis.Redis, stores: Stores, prefix: str
) -> None:
    """Asked at once, it is "maybe" (the full way finds it by its chain); once
    the backfill ran it is held, for as long as the checkpoint lives, and a
    session without any is "none" again."""
    old = checkpoint("h1", session="s1")
    await put_the_old_way(raw, prefix, old, ttl_ms=DAY_MS)
    store = stores()
    assert await store.holds_checkpoints("alice", "s1")

    await store.held_keys_complete()
    assert await store.holds_checkpoints("alice", "s1")
    assert not await store.holds_checkpoints("bob", "s1")  # another owner's session
    assert not await store.holds_checkpoints("alice", "s2")
    left = await raw.pttl(held_key(prefix, "alice", "s1"))
    assert 0 < left <= await raw.pttl(f"{prefix}cp:h1") + 1_000  # as long as it, no longer
    assert await raw.get(prefix + SCHEME_KEY) == str(SCHEME).encode()
    assert (await store.lookup(["h1"]))["h1"].id == old.id  # the checkpoint itself untouched


@pytest.mark.anyio
async def test_a_checkpoint_without_an_owner_key_holds_the_unnamed_owners_session(
    raw: aioredis.Redis, stores: Stores, prefix: str
) -> None:
    """The first versions kept no owner: such a checkpoint is read as the
    unnamed owner's (as ``get`` reads it), and held as that owner's."""
    old = checkpoint("h1", session="s1")
    await put_the_old_way(raw, prefix, old, owner="")
    await raw.delete(f"{prefix}owner:{old.id}")
    store = stores()
    await store.held_keys_complete()
    assert await store.holds_checkpoints("", "s1")
    assert not await store.holds_checkpoints("alice", "s1")


@pytest.mark.anyio
async def test_until_the_backfill_has_run_no_session_is_said_to_hold_none(
    raw: aioredis.Redis, stores: Stores, prefix: str
) -> None:
    """Another replica holds the backfill's lock (and dies without finishing):
    meanwhile every session is "maybe"; once the lock lapses this replica does
    the work, and a session without checkpoints is "none"."""
    store = stores()
    await raw.set(f"{prefix}lock:upgrade:held", "another replica", px=60_000)
    assert await store.holds_checkpoints("alice", "never compacted")
    await asyncio.sleep(0.3)  # the backfill waits on the lock meanwhile (a poll or two)
    assert await store.holds_checkpoints("alice", "never compacted")
    assert await raw.get(prefix + SCHEME_KEY) is None

    await raw.delete(f"{prefix}lock:upgrade:held")  # its lease lapsed
    await store.held_keys_complete()
    assert not await store.holds_checkpoints("alice", "never compacted")


@pytest.mark.anyio
async def test_a_backfill_lengthens_a_held_key_and_never_shortens_one(
    raw: aioredis.Redis, stores: Stores, prefix: str
) -> None:
    """A put racing the backfill sets its session's key (the full retention)
    for a checkpoint the walk does not see; the walk then finds an older one
    of that session with a minute left: the key keeps the longer. A session
    whose checkpoints all came before gets the longest of theirs."""
    store = stores()
    await raw.set(held_key(prefix, "alice", "s1"), b"1", px=RETENTION_MS)  # the racing put's
    await put_the_old_way(raw, prefix, checkpoint("old1", session="s1"), ttl_ms=60_000)
    await put_the_old_way(raw, prefix, checkpoint("old2", session="s2"), ttl_ms=60_000)
    await put_the_old_way(raw, prefix, checkpoint("old3", session="s2"), ttl_ms=DAY_MS)
    await raw.set(held_key(prefix, "alice", "s2"), b"1", px=1_000)  # one lapsing anyway

    await store.held_keys_complete()
    assert await raw.pttl(held_key(prefix, "alice", "s1")) > DAY_MS  # still the put's
    assert DAY_MS - 60_000 < await raw.pttl(held_key(prefix, "alice", "s2")) <= DAY_MS


@pytest.mark.anyio
async def test_two_replicas_backfilling_together_do_the_work_once_and_miss_nothing(
    raw: aioredis.Redis, stores: Stores, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """More checkpoints than two SCAN rounds hold, two replicas starting
    together: one walks them (under the lock), the other finds it done."""
    count = 2 * BACKFILL_BATCH + 7
    for index in range(count):
        await put_the_old_way(raw, prefix, checkpoint(f"h{index}", session=f"s{index}"))
    first, second = stores(), stores()
    caplog.set_level(logging.INFO, logger="proxy.state.stores.redis")
    await asyncio.gather(first.held_keys_complete(), second.held_keys_complete())

    walks = [r.getMessage() for r in caplog.records if "backfilled" in r.getMessage()]
    assert walks == [f"held keys backfilled: {count} checkpoint(s) read, {count} key(s) set"]
    held = await raw.exists(*[held_key(prefix, "alice", f"s{index}") for index in range(count)])
    assert held == count


class Gate:
    """The store's pauses, recorded; one of :data:`RECHECK_SECONDS` (the
    backfill's look again later) waits until the test opens the gate."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self.waiting = asyncio.Event()
        self.open = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if seconds == RECHECK_SECONDS:
            self.waiting.set()
            await self.open.wait()
            self.waiting.clear()
        else:
            await asyncio.sleep(seconds)


@pytest.mark.anyio
async def test_while_a_replica_from_before_is_alive_no_session_is_said_to_hold_none(
    raw: aioredis.Redis, stores: Stores, prefix: str
) -> None:
    """A rolling upgrade: a replica from before (its heartbeat says 1) may
    still write checkpoints without held keys, so nothing is marked until its
    heartbeat is gone. This version's heartbeats do not hold it up."""
    gate = Gate()
    store = stores(sleep=gate)
    await store.heartbeat("this version", 60)
    await raw.set(f"{prefix}alive:older", b"1", px=60_000)
    assert await store.holds_checkpoints("alice", "s1")
    await asyncio.wait_for(gate.waiting.wait(), 30)
    assert await raw.get(prefix + SCHEME_KEY) is None
    assert await store.holds_checkpoints("alice", "s1")

    # It writes one more, the old way, and stops; its heartbeat lapses.
    await put_the_old_way(raw, prefix, checkpoint("late", session="s1"))
    await raw.delete(f"{prefix}alive:older")
    gate.open.set()
    await store.held_keys_complete()
    assert await store.holds_checkpoints("alice", "s1")
    assert not await store.holds_checkpoints("alice", "s2")
    assert gate.pauses.count(RECHECK_SECONDS) == 1


@pytest.mark.anyio
async def test_a_backfill_reads_only_its_own_prefix_whatever_the_prefix_holds(
    raw: aioredis.Redis, stores: Stores, prefix: str, redis_url: str | None
) -> None:
    """A prefix is matched as itself, not as a pattern: ``…*:`` walks none of
    ``…-other:``'s checkpoints."""
    starred = prefix.rstrip(":") + "*:"
    other = prefix.rstrip(":") + "-other:"
    await put_the_old_way(raw, other, checkpoint("h1", session="theirs"))
    store = stores(key_prefix=starred)
    try:
        await store.held_keys_complete()
        assert not await store.holds_checkpoints("alice", "theirs")
        assert await raw.keys(starred.replace("*", "\\*") + "held:*") == []
    finally:
        await _delete_prefix(require_redis(redis_url), other)
        await _delete_prefix(require_redis(redis_url), starred.replace("*", "\\*"))


# -- a Redis that answers garbage ------------------------------------------------------

#: An ``MGET`` of two keys answered "neither exists": the backfill starts.
_NEITHER = b"*2\r\n_\r\n_\r\n"  # RESP3 nils: the client speaks 3


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("replies", "failure"),
    [
        # Its lock answered nil, and so is the look at the lease: garbage.
        ({"MGET": _NEITHER}, "GarbledReply"),
        # The lock taken, the keyspace empty, yet SCAN's cursor never comes back.
        (
            {
                "MGET": _NEITHER,
                "SET": b"+OK\r\n",
                "DBSIZE": b":0\r\n",
                "SCAN": b"*2\r\n$1\r\n1\r\n*0\r\n",
                "EVALSHA": b":1\r\n",
            },
            "GarbledReply",
        ),
    ],
    ids=["nil", "endless-scan"],
)
async def test_a_backfill_on_a_redis_answering_garbage_gives_up_and_tries_later(
    replies: dict[str, bytes],
    failure: str,
    anyio_backend: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The failure is logged by its kind (no key, no session), the next try
    waits :data:`RECHECK_SECONDS`, no loop spins, and meanwhile every session
    is "maybe"."""
    gate = Gate()
    async with FakeRedis(reply=NIL, replies=replies) as fake:
        store = RedisStore.from_url(fake.url, timeout=5.0, sleep=gate)
        try:
            assert await store.holds_checkpoints("alice", "s1")
            await asyncio.wait_for(gate.waiting.wait(), 30)
            assert await store.holds_checkpoints("alice", "s1")
        finally:
            await store.close()
        scans = fake.names["SCAN"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"the held keys' backfill failed ({failure}); tried again in 30 s"]
    assert scans <= 4 * (0 // BACKFILL_BATCH + 1) + 16


# -- through the proxy -----------------------------------------------------------------


class StoreFromBefore(RedisStore):
    """A replica of the version from before held keys, as far as its writes go:
    its checkpoints have no ``held:`` key, its heartbeat says 1."""

    async def put(
        self, checkpoint: Checkpoint, originals: Sequence[Message] | None = None, *, owner: str = ""
    ) -> None:
        await put_the_old_way(
            self._client, self._prefix, checkpoint, owner=owner, originals=originals
        )

    async def heartbeat(self, instance: str, ttl: float) -> None:
        await self._client.set(self._key("alive", instance), b"1", px=max(1, int(ttl * 1000)))


@contextmanager
def _proxy(store: RedisStore) -> Iterator[Any]:
    settings = settings_for(
        models={"gpt-4o": {"context_window": 32_000, "keep_recent_tokens": 500}},
        compaction={"summarizer": "extractive"},
    )
    with running(settings, RecordingTransport(app=FakeUpstream().app()), store=store) as proxy:
        yield proxy


def test_a_small_conversation_compacted_before_the_upgrade_is_sent_compacted_after_it(
    redis_url: str | None, prefix: str
) -> None:
    """A replica from before held keys makes a ``/compact`` of a small
    conversation; after the upgrade this version's replica sends that
    conversation's later requests — still far under their trigger — over the
    stored checkpoint, before its backfill has run and after."""
    url = require_redis(redis_url)
    messages = agent_session(seed=3, steps=8, output_chars=600)
    asked = [*messages, {"role": "user", "content": "/compact"}]
    try:
        with _proxy(StoreFromBefore.from_url(url, key_prefix=prefix)) as before:
            compacted = before.http.post(
                "/v1/chat/completions", json={"model": "gpt-4o", "messages": asked}
            )
            assert compacted.status_code == 200, compacted.text
            assert compacted.headers["x-compaction-reason"] == "manual"
        made = compacted.headers["x-compaction-id"]
        reply = compacted.json()["choices"][0]["message"]["content"]
        later = [
            *asked,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "Go on."},
        ]
        assert session_key(later) == session_key(messages)
        plain = redis.Redis.from_url(url)
        assert plain.keys(f"{prefix}held:*") == []  # as the version from before left it
        plain.delete(*plain.keys(f"{prefix}alive:*"))  # it stopped: its heartbeat lapsed

        with _proxy(RedisStore.from_url(url, key_prefix=prefix)) as after:
            for turn in ("before the backfill", "after it"):
                answer = after.http.post(
                    "/v1/chat/completions", json={"model": "gpt-4o", "messages": later}
                )
                assert answer.status_code == 200, (turn, answer.text)
                assert int(answer.headers["x-compaction-tokens-before"]) < 32_000 * EARLY_SHARE / 2
                assert answer.headers["x-compaction-stage"] == "reused", turn
                assert answer.headers["x-compaction-id"] == made, turn
                sent = after.transport.asked("/chat/completions")[-1].json()["messages"]
                assert len(sent) < len(later), turn  # the checkpoint applied upstream
                _wait_for_key(plain, prefix + SCHEME_KEY)
        plain.close()
    finally:
        asyncio.run(_delete_prefix(url, prefix))


def _wait_for_key(client: redis.Redis, key: str) -> None:
    """Until ``key`` exists (the backfill, in the app's background, has run)."""
    deadline = time.monotonic() + 30
    while not client.exists(key):
        if time.monotonic() > deadline:
            pytest.fail(f"{key} was never set")
        time.sleep(0.05)
