"""The shared store: several proxy replicas behind one load balancer, one Redis.

Keys, all under a configurable prefix (default ``compaction-proxy:``)::

    cp:<end hash>        checkpoint JSON            TTL = retention; lookup is one MGET
    ckpt:<id>            the same JSON, by id       TTL = retention
    owner:<id>           the checkpoint's owner     TTL = retention
    orig:<id>            replaced messages JSON     TTL = retention (purge is implicit)
    held:<owner>\\x1f<session>  "1" while the session has a checkpoint   TTL = its newest one's
    scheme               the key scheme every record follows (2: every checkpoint is held)
    events               newest events, capped list (LPUSH + LTRIM in one MULTI)
    events:<session>     one session's, capped      TTL = retention, renewed on each event
    evowners:<session>   set of the owners with events of it   TTL = retention, renewed
    owned:<owner>        one owner's, capped        TTL = retention, renewed on each event
    open                 hash compaction id → latest event, while queued/started
    alive:<instance>     heartbeat: the scheme it writes   TTL = the heartbeat's ttl
    lock:<key>           single-flight lock         SET NX PX; compare-and-delete release
    windows              hash model → learned context window
    windows:at           sorted set model by when it was last set (the cap, the purge)
    calibrations         hash key → calibration ratio (a float's repr)
    calibrations:at      sorted set key by when it was last set
    reqs:<owner>:<session>  newest requests' figures, capped   TTL = figures' retention
    owners:<session>     set of the owners with that session   TTL = figures' retention
    sess:<owner>:<session>  the session's summary JSON         TTL = figures' retention
    recent               sorted set "<owner>:<session>" by last activity
    recent:<owner>       sorted set session by last activity
    saved, saved:<owner> hash hour → tokens saved (HINCRBY)
    settings:<owner>:<session>  per-session settings JSON      TTL = retention

An instance is alive while its heartbeat key exists; a lock whose holder died
lapses after its ttl, and a waiter (polling with backoff) takes it.

Time is the store's: every stamp a replica writes (``recent``, the ``:at``
sets) and every cut-off it reads or purges by comes from Redis ``TIME``
(:meth:`RedisStore._now`), never from the replica's own clock — a replica
whose clock ran days ahead would otherwise cut the others' sessions from the
shared lists as too old, and sort its own above everyone's.

A Redis that answers what no Redis would — nil to a SET, an integer where a
hash belongs, bytes that are not the JSON written — is a store that is down:
the operation raises :class:`GarbledReply` (a :class:`StoreError`; what a reply
may be is :mod:`~proxy.state.stores.redis.replies`), never a
``TypeError`` from deep in a caller. No loop here runs for ever on such
answers: a waiter for a lock gives up after the longest a lease can live
(:class:`~proxy.state.stores.locks.LockBusy`), a transaction whose watched
key keeps changing (or whose EXEC keeps answering nil) is tried
:data:`TRANSACTION_ATTEMPTS` times with a pause between, then
:class:`Contended`.

The store is in parts, one concern each, composed by :class:`RedisStore`
(which keeps the checkpoints and originals, the rows kept by model, the purge):
the client, keys, clock, lock and transactions every part shares
(:mod:`~proxy.state.stores.redis.core`), events and liveness
(:mod:`~proxy.state.stores.redis.events`), per-request figures and sessions
(:mod:`~proxy.state.stores.redis.figures`), and whether a session holds a
checkpoint, with the backfill of those keys after an upgrade
(:mod:`~proxy.state.stores.redis.held`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Sequence
from typing import Any, Final

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from compaction import Checkpoint, Message
from proxy.state.stores import codec
from proxy.state.stores.base import (
    DEFAULT_GLOBAL_EVENTS,
    DEFAULT_MAX_MODEL_ROWS,
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_SESSION_EVENTS,
    checked_ratio,
)
from proxy.state.stores.figures import DEFAULT_REQUESTS_RETENTION_SECONDS
from proxy.state.stores.redis.core import (
    TRANSACTION_ATTEMPTS,
    TRANSACTION_BACKOFF,
    Contended,
    Sleep,
)
from proxy.state.stores.redis.events import RedisEvents
from proxy.state.stores.redis.figures import RedisFigures
from proxy.state.stores.redis.held import RedisHeld
from proxy.state.stores.redis.replies import awaited, garbage_is_a_store_error
from proxy.state.stores.redis.scripts import CLOSE_OPEN, HOLD, RELEASE, RENEW

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "TRANSACTION_ATTEMPTS",
    "TRANSACTION_BACKOFF",
    "Contended",
    "RedisStore",
]

DEFAULT_KEY_PREFIX: Final = "compaction-proxy:"


class RedisStore(RedisEvents, RedisFigures, RedisHeld):
    """The :class:`~proxy.state.stores.protocols.Store` contract on a Redis server."""

    tracks_liveness = True  #: every instance's heartbeat key expires with it

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        store_originals: bool = True,
        session_events: int = DEFAULT_SESSION_EVENTS,
        global_events: int = DEFAULT_GLOBAL_EVENTS,
        requests_retention_seconds: float = DEFAULT_REQUESTS_RETENTION_SECONDS,
        max_model_rows: int = DEFAULT_MAX_MODEL_ROWS,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._client = client
        self._sleep = sleep  #: the pauses of the lock's poll and the transactions' retries
        self._max_model_rows = max_model_rows
        self._figures_ms = max(1, int(requests_retention_seconds * 1000))
        self._prefix = key_prefix
        self._retention_ms = max(1, int(retention_seconds * 1000))
        self._store_originals = store_originals
        self._session_events = session_events
        self._global_events = global_events
        self._release = client.register_script(RELEASE)
        self._renew = client.register_script(RENEW)
        self._close_open = client.register_script(CLOSE_OPEN)
        self._hold = client.register_script(HOLD)
        self._upgrading = None  #: the held keys' backfill, once started (held.py)

    @classmethod
    def from_url(cls, url: str, *, timeout: float | None = None, **options: Any) -> RedisStore:
        """A store on a new client for ``url``; the client connects on first use.

        ``timeout`` bounds each command and connection attempt (redis-py's
        default is 5 s). Only a dropped connection is retried, once and at
        once: that reconnects after a Redis restart, where retrying a timeout
        or backing off would stretch a failure past the caller's time-box.
        """
        if timeout is None:
            return cls(aioredis.Redis.from_url(url), **options)
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        return cls(client, **options)

    # -- checkpoints -------------------------------------------------------

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        if not hashes:
            return {}
        wanted = list(dict.fromkeys(hashes))
        values = await awaited(self._client.mget([self._key("cp", value) for value in wanted]))
        return {
            value: codec.load_checkpoint(raw)
            for value, raw in zip(wanted, values, strict=True)
            if raw is not None
        }

    def lookup_now(self, hashes: Sequence[str]) -> dict[str, Checkpoint] | None:
        # Replicas write the same keys with nothing to tell this one that
        # they did: every lookup is a round trip.
        return {} if not hashes else None

    async def put(
        self, checkpoint: Checkpoint, originals: Sequence[Message] | None = None, *, owner: str = ""
    ) -> None:
        raw = codec.dump_checkpoint(checkpoint)
        ttl = self._retention_ms
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.set(self._key("cp", checkpoint.end_hash), raw, px=ttl, get=True)
            pipe.set(self._key("ckpt", checkpoint.id), raw, px=ttl)
            pipe.set(self._key("owner", checkpoint.id), owner, px=ttl)
            # Lives as long as the session's newest checkpoint (held.py).
            pipe.set(self._held_key(owner, checkpoint.session), b"1", px=ttl)
            if originals is not None and self._store_originals:
                pipe.set(self._key("orig", checkpoint.id), codec.dump_messages(originals), px=ttl)
            replies = await pipe.execute()
        previous = replies[0]
        if previous is not None:
            # A newer checkpoint for the same span: the older one is no longer
            # found by id either (its originals stay until they expire).
            old = codec.load_checkpoint(previous)
            if old.id != checkpoint.id:
                await awaited(
                    self._client.delete(self._key("ckpt", old.id), self._key("owner", old.id))
                )

    async def get(self, checkpoint_id: str, *, owner: str | None = None) -> Checkpoint | None:
        keys = [self._key("ckpt", checkpoint_id), self._key("owner", checkpoint_id)]
        raw, owned_by = await awaited(self._client.mget(keys))
        if raw is None or (owner is not None and (owned_by or b"").decode() != owner):
            return None
        return codec.load_checkpoint(raw)

    async def originals(self, checkpoint_id: str) -> list[Message] | None:
        raw = await awaited(self._client.get(self._key("orig", checkpoint_id)))
        return None if raw is None else codec.load_messages(raw)

    async def owner_of(self, checkpoint_id: str) -> str | None:
        keys = [self._key("ckpt", checkpoint_id), self._key("owner", checkpoint_id)]
        raw, owned_by = await awaited(self._client.mget(keys))
        if raw is None:
            return None
        return (owned_by or b"").decode()

    # -- learned windows ---------------------------------------------------

    async def learned_windows(self) -> dict[str, int]:
        entries: dict[bytes, bytes] = await awaited(self._client.hgetall(self._key("windows")))
        return {model.decode(): int(window) for model, window in entries.items()}

    async def set_learned_window(self, model: str, window: int) -> None:
        await self._set_model_row("windows", model, window)

    async def _set_model_row(self, table: str, name: str, value: int | str) -> None:
        """``table[name] = value``, stamped now; past ``max_model_rows`` the least
        recently set rows go (a client may invent any number of model names)."""
        stamps = self._key(table, "at")
        now = await self._now()
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(self._key(table), name, value)
            pipe.zadd(stamps, {name: now})
            pipe.zrange(stamps, 0, -(self._max_model_rows + 1))  # all but the newest cap
            excess = (await pipe.execute())[2]
        if excess:
            await self._drop_model_rows(table, excess)

    async def _drop_model_rows(self, table: str, names: Sequence[bytes]) -> None:
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hdel(self._key(table), *names)
            pipe.zrem(self._key(table, "at"), *names)
            await pipe.execute()

    async def _purge_model_rows(self, table: str, cutoff: float) -> None:
        """Drop the rows of ``table`` last set before ``cutoff``; rows written
        before they were stamped count as set now."""
        stamps = self._key(table, "at")
        names = await awaited(self._client.hkeys(self._key(table)))
        if names:
            now = await self._now()
            await awaited(self._client.zadd(stamps, dict.fromkeys(names, now), nx=True))
        old = await awaited(self._client.zrangebyscore(stamps, "-inf", f"({cutoff!r}"))
        excess = await awaited(self._client.zrange(stamps, 0, -(self._max_model_rows + 1)))
        dropped = list(dict.fromkeys([*old, *excess]))
        if dropped:
            await self._drop_model_rows(table, dropped)

    # -- calibration ratios ------------------------------------------------

    async def calibrations(self) -> dict[str, float]:
        entries: dict[bytes, bytes] = await awaited(self._client.hgetall(self._key("calibrations")))
        return {key.decode(): float(ratio) for key, ratio in entries.items()}

    async def set_calibration(self, key: str, ratio: float) -> None:
        # repr() is the shortest text that reads back as the same float.
        value = repr(checked_ratio(ratio))
        await self._set_model_row("calibrations", key, value)

    # -- lifecycle ---------------------------------------------------------

    async def purge(self, now: float | None = None) -> int:
        # Every record carries its own expiry but the rows kept by model.
        cutoff = (await self._now() if now is None else now) - self._retention_ms / 1000
        for table in ("windows", "calibrations"):
            await self._purge_model_rows(table, cutoff)
        return 0

    async def close(self) -> None:
        upgrading = self._upgrading
        if upgrading is not None:
            upgrading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await upgrading
        await self._client.aclose()


# Every operation reads its replies through the translation, but the two whose
# own errors mean something else: a ratio the caller got wrong (ValueError) and
# the lock (which checks its replies itself). The parts' operations too: each
# is wrapped once, here, on the store that composes them.
for _name in dir(RedisStore):
    _method = inspect.getattr_static(RedisStore, _name)
    if (
        not _name.startswith("_")
        and _name not in ("set_calibration", "lock", "close")
        and inspect.iscoroutinefunction(_method)
    ):
        setattr(RedisStore, _name, garbage_is_a_store_error(_method))
