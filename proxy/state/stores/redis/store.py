"""The shared store: several proxy replicas behind one load balancer, one Redis.

Keys, all under a configurable prefix (default ``compaction-proxy:``)::

    cp:<end hash>        checkpoint JSON            TTL = retention; lookup is one MGET
    ckpt:<id>            the same JSON, by id       TTL = retention
    owner:<id>           the checkpoint's owner     TTL = retention
    orig:<id>            replaced messages JSON     TTL = retention (purge is implicit)
    events               newest events, capped list (LPUSH + LTRIM in one MULTI)
    events:<session>     one session's, capped      TTL = retention, renewed on each event
    evowners:<session>   set of the owners with events of it   TTL = retention, renewed
    owned:<owner>        one owner's, capped        TTL = retention, renewed on each event
    open                 hash compaction id → latest event, while queued/started
    alive:<instance>     heartbeat                  TTL = the heartbeat's ttl
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
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import WatchError

from compaction import Checkpoint, Message
from proxy.state.stores import codec
from proxy.state.stores.base import (
    DEFAULT_EVENTS_LIMIT,
    DEFAULT_GLOBAL_EVENTS,
    DEFAULT_MAX_MODEL_ROWS,
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_SESSION_EVENTS,
    INTERRUPTED,
    Event,
    StoreError,
    checked_ratio,
    interrupted,
)
from proxy.state.stores.figures import (
    DEFAULT_REQUESTS_LIMIT,
    DEFAULT_REQUESTS_RETENTION_SECONDS,
    DEFAULT_SESSION_REQUESTS,
    DEFAULT_SESSIONS_LIMIT,
    RequestRecord,
    SessionSettings,
    SessionSummary,
    bucket_of,
    by_session,
    fold,
)
from proxy.state.stores.locks import MAX_HOLD, RENEW_EVERY, LockBusy
from proxy.state.stores.redis.replies import (
    GarbledReply,
    awaited,
    expect,
    garbage_is_a_store_error,
)
from proxy.state.stores.redis.scripts import CLOSE_OPEN, RELEASE, RENEW

DEFAULT_KEY_PREFIX: Final = "compaction-proxy:"
logger = logging.getLogger(__package__)  # "proxy.state.stores.redis", as before the split
_POLL_FIRST: Final = 0.01
_POLL_MAX: Final = 0.25
#: Tries of a WATCH … EXEC transaction whose watched key changed meanwhile.
TRANSACTION_ATTEMPTS: Final = 3
#: Pause before the second try (doubled for the next, with jitter).
TRANSACTION_BACKOFF: Final = 0.02

_T = TypeVar("_T")
Sleep = Callable[[float], Awaitable[None]]


class Contended(StoreError):
    """A transaction's watched key changed at every try (or EXEC kept answering nil)."""


class RedisStore:
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

    def _key(self, *parts: str) -> str:
        return self._prefix + ":".join(parts)

    async def _now(self) -> float:
        """The store's clock, in seconds since the epoch: one clock for every replica."""
        seconds, microseconds = await awaited(self._client.time())
        return int(seconds) + int(microseconds) / 1_000_000

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

    def _held_key(self, owner: str, session: str) -> str:
        return self._key("held", f"{owner}\x1f{session}")

    async def holds_checkpoints(self, owner: str, session: str) -> bool:
        return bool(await awaited(self._client.exists(self._held_key(owner, session))))

    def holds_checkpoints_now(self, owner: str, session: str) -> bool | None:
        return None  # replicas write it with nothing to tell this one: a round trip

    async def put(
        self, checkpoint: Checkpoint, originals: Sequence[Message] | None = None, *, owner: str = ""
    ) -> None:
        raw = codec.dump_checkpoint(checkpoint)
        ttl = self._retention_ms
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.set(self._key("cp", checkpoint.end_hash), raw, px=ttl, get=True)
            pipe.set(self._key("ckpt", checkpoint.id), raw, px=ttl)
            pipe.set(self._key("owner", checkpoint.id), owner, px=ttl)
            # Lives as long as the session's newest checkpoint: see holds_checkpoints.
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

    # -- events ------------------------------------------------------------

    async def add_event(self, event: Event) -> None:
        raw = codec.dump_event(event)
        by_session = self._key("events", event.session)
        by_owner = self._key("owned", event.owner)
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.lpush(self._key("events"), raw)
            pipe.ltrim(self._key("events"), 0, self._global_events - 1)
            pipe.lpush(by_session, raw)
            pipe.ltrim(by_session, 0, self._session_events - 1)
            pipe.pexpire(by_session, self._retention_ms)
            pipe.lpush(by_owner, raw)
            pipe.ltrim(by_owner, 0, self._global_events - 1)
            pipe.pexpire(by_owner, self._retention_ms)
            # Whose the session is outlives the capped list: another owner's
            # events of the same id must not push this one's out of it.
            pipe.sadd(self._key("evowners", event.session), event.owner)
            pipe.pexpire(self._key("evowners", event.session), self._retention_ms)
            if event.is_open:
                pipe.hset(self._key("open"), event.compaction_id, raw)
            else:
                pipe.hdel(self._key("open"), event.compaction_id)
            await pipe.execute()

    async def events(
        self,
        session: str | None = None,
        limit: int = DEFAULT_EVENTS_LIMIT,
        *,
        owner: str | None = None,
    ) -> list[Event]:
        if limit <= 0:
            return []
        if session is not None and owner is not None:
            # One owner's session: its list is capped, so it is read whole and
            # the owner's events kept (a session is normally one owner's anyway).
            raws = await awaited(self._client.lrange(self._key("events", session), 0, -1))
            found = (codec.load_event(raw) for raw in raws)
            return [event for event in found if event.owner == owner][:limit]
        if session is not None:
            key = self._key("events", session)
        elif owner is not None:
            key = self._key("owned", owner)
        else:
            key = self._key("events")
        raws = await awaited(self._client.lrange(key, 0, limit - 1))
        return [codec.load_event(raw) for raw in raws]

    async def fail_interrupted(self, instance: str, message: str = INTERRUPTED) -> int:
        entries: dict[bytes, bytes] = await awaited(self._client.hgetall(self._key("open")))
        stale = [(raw, codec.load_event(raw)) for raw in entries.values()]
        stale = [(raw, event) for raw, event in stale if event.instance != instance]
        others = sorted({event.instance for _, event in stale})
        if not others:
            return 0
        beats = await awaited(self._client.mget([self._key("alive", name) for name in others]))
        dead = {name for name, beat in zip(others, beats, strict=True) if beat is None}
        closed = 0
        for raw, event in stale:
            if event.instance not in dead:
                continue
            failed = interrupted(event, instance, message)
            closed += await self._close_open(
                keys=[
                    self._key("open"),
                    self._key("events"),
                    self._key("events", event.session),
                    self._key("owned", event.owner),
                ],
                args=[
                    event.compaction_id,
                    raw,
                    codec.dump_event(failed),
                    self._global_events,
                    self._session_events,
                    self._retention_ms,
                ],
            )
        return closed

    async def heartbeat(self, instance: str, ttl: float) -> None:
        ttl_ms = max(1, int(ttl * 1000))
        done = await awaited(self._client.set(self._key("alive", instance), b"1", px=ttl_ms))
        if done is not True:  # a SET without a condition always answers OK
            raise GarbledReply(f"Redis answered SET with {type(done).__name__}")

    @contextlib.asynccontextmanager
    async def lock(self, key: str, ttl: float) -> AsyncIterator[None]:
        """Held once ``SET NX`` answers OK; a waiter polls (asking how long the
        holder's lease has left, which a real Redis always knows) for at most
        ``MAX_HOLD`` × ``ttl``, the longest a lease lives, then :class:`LockBusy`."""
        name = self._key("lock", key)
        token = uuid.uuid4().hex
        ttl_ms = max(1, int(ttl * 1000))
        delay, waited, longest, lapsed = _POLL_FIRST, 0.0, MAX_HOLD * ttl, False
        give_up = asyncio.get_running_loop().time() + longest
        while True:
            taken = await awaited(self._client.set(name, token, nx=True, px=ttl_ms))
            if taken is True:
                break
            if taken is not None:
                raise GarbledReply(f"Redis answered SET NX with {type(taken).__name__}")
            left = expect(await awaited(self._client.pttl(name)), int, "PTTL")
            if left == -2 and not lapsed:
                lapsed = True  # it lapsed between the two: try again at once (once:
                continue  # a store that says so every time must not make this spin)
            lapsed = False
            if waited >= longest or asyncio.get_running_loop().time() >= give_up:
                raise LockBusy(key, longest)
            pause = delay * random.uniform(0.5, 1.0)  # jitter: waiters spread out
            if left >= 0:  # no later than the lease lapses, and never no pause at all
                pause = max(min(pause, left / 1000), _POLL_FIRST / 2)
            await self._sleep(pause)
            waited += pause
            delay = min(delay * 2, _POLL_MAX)
        keeper = asyncio.ensure_future(self._keep(name, token, ttl_ms))
        try:
            yield
        finally:
            keeper.cancel()
            expect(await self._release(keys=[name], args=[token]), int, "the lock's release")

    async def _keep(self, name: str, token: str, ttl_ms: int) -> None:
        """Renew a held lock every third of its expiry: a live holder (a slow
        summarization) keeps it, up to ``MAX_HOLD`` × ``ttl``; a dead one loses it
        after ``ttl``."""
        for _ in range(RENEW_EVERY * (MAX_HOLD - 1)):
            await asyncio.sleep(ttl_ms / 1000 / RENEW_EVERY)
            try:
                renewed = await awaited(self._renew(keys=[name], args=[token, ttl_ms]))
            except Exception:  # a blip: the next round tries again
                logger.warning("could not renew the lock %s", name, exc_info=True)
                continue
            if renewed != 1:  # lost it, or an answer that makes no sense
                return

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

    # -- per-request figures and sessions ------------------------------------

    async def record_requests(self, records: Sequence[RequestRecord]) -> None:
        if not records:
            return
        ttl = self._figures_ms
        groups = by_session(records)
        now = await self._now()
        # The records' times are this replica's clock: moved onto the store's,
        # they keep their order and end no later than now.
        offset = now - max(record.created_at for record in records)
        async with self._client.pipeline(transaction=False) as pipe:
            for (owner, session), found in groups.items():
                key = self._key("reqs", owner, session)
                pipe.lpush(key, *(codec.dump(record) for record in found))
                pipe.ltrim(key, 0, DEFAULT_SESSION_REQUESTS - 1)
                pipe.pexpire(key, ttl)
                pipe.sadd(self._key("owners", session), owner)
                pipe.pexpire(self._key("owners", session), ttl)
            for record in records:
                if record.saved:
                    bucket = repr(bucket_of(record.created_at))
                    pipe.hincrby(self._key("saved"), bucket, record.saved)
                    pipe.hincrby(self._key("saved", record.owner), bucket, record.saved)
            pipe.zremrangebyscore(self._key("recent"), "-inf", now - ttl / 1000)
            await pipe.execute()
        for (owner, session), found in groups.items():
            at = max(record.created_at for record in found) + offset
            await self._fold(owner, session, found, at, now)

    async def _fold(
        self, owner: str, session: str, found: list[RequestRecord], at: float, now: float
    ) -> None:
        """Add ``found`` to the session's summary; another replica folding the same
        session meanwhile makes this one read again (WATCH), so none is lost. The
        session's place among the recent ones is ``at``, and ``now`` the cut-off's
        start, both on the store's clock."""
        key = self._key("sess", owner, session)

        async def update(pipe: Any) -> None:
            raw = await pipe.get(key)
            summary = fold(None if raw is None else codec.load(SessionSummary, raw), found)
            pipe.multi()
            pipe.set(key, codec.dump(summary), px=self._figures_ms)
            pipe.zadd(self._key("recent"), {f"{owner}:{session}": at})
            pipe.zadd(self._key("recent", owner), {session: at})
            pipe.pexpire(self._key("recent", owner), self._figures_ms)
            oldest = now - self._figures_ms / 1000
            pipe.zremrangebyscore(self._key("recent", owner), "-inf", oldest)

        await self._transaction(update, key)

    async def _transaction(self, update: Callable[[Any], Awaitable[None]], *watched: str) -> None:
        """WATCH ``watched``, ``update`` (reads, then MULTI and the writes), EXEC;
        tried again while a watched key changed meanwhile, at most
        :data:`TRANSACTION_ATTEMPTS` times with a growing pause, then
        :class:`Contended`. (redis-py's own ``transaction`` retries for ever and
        at once: a Redis whose EXEC answers nil would make it spin.)"""
        delay = TRANSACTION_BACKOFF
        for attempt in range(TRANSACTION_ATTEMPTS):
            if attempt:
                await self._sleep(delay * random.uniform(0.5, 1.0))
                delay *= 2
            async with self._client.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(*watched)
                    await update(pipe)
                    await pipe.execute()
                except WatchError:
                    continue
                return
        raise Contended(f"{watched[0]} changed under {TRANSACTION_ATTEMPTS} tries of a transaction")

    async def requests(
        self, session: str, *, owner: str | None = None, limit: int = DEFAULT_REQUESTS_LIMIT
    ) -> list[RequestRecord]:
        if limit <= 0:
            return []
        if owner is None:
            members = await awaited(self._client.smembers(self._key("owners", session)))
            owners = sorted(member.decode() for member in members)
        else:
            owners = [owner]
        found: list[RequestRecord] = []
        for name in owners:
            raws = await awaited(
                self._client.lrange(self._key("reqs", name, session), 0, limit - 1)
            )
            found.extend(codec.load(RequestRecord, raw) for raw in raws)
        found.sort(key=lambda record: record.created_at, reverse=True)
        return found[:limit]

    async def sessions(
        self, *, owner: str | None = None, limit: int = DEFAULT_SESSIONS_LIMIT
    ) -> list[SessionSummary]:
        if limit <= 0:
            return []
        if owner is None:
            members = await awaited(self._client.zrevrange(self._key("recent"), 0, limit - 1))
            pairs = [member.decode().split(":", 1) for member in members]
        else:
            recent = self._key("recent", owner)
            members = await awaited(self._client.zrevrange(recent, 0, limit - 1))
            pairs = [[owner, member.decode()] for member in members]
        if not pairs:
            return []
        keys = [self._key("sess", name, session) for name, session in pairs]
        raws = await awaited(self._client.mget(keys))
        return [codec.load(SessionSummary, raw) for raw in raws if raw is not None]

    async def session_count(self, *, owner: str | None = None) -> int:
        key = self._key("recent") if owner is None else self._key("recent", owner)
        # The index outlives a summary by up to a write (its expiry is the
        # summary's own): counted as the sessions that would be listed.
        oldest = await self._now() - self._figures_ms / 1000
        return int(await awaited(self._client.zcount(key, oldest, "+inf")))

    async def savings(self, *, owner: str | None = None) -> list[tuple[float, int]]:
        key = self._key("saved") if owner is None else self._key("saved", owner)
        entries: dict[bytes, bytes] = await awaited(self._client.hgetall(key))
        return sorted((float(bucket), int(saved)) for bucket, saved in entries.items())

    async def session_settings(self, session: str, owner: str) -> SessionSettings:
        raw = await awaited(self._client.get(self._key("settings", owner, session)))
        return SessionSettings() if raw is None else codec.load(SessionSettings, raw)

    async def set_session_settings(
        self, session: str, owner: str, settings: SessionSettings
    ) -> None:
        key = self._key("settings", owner, session)
        # The expiry, renewed at each write, is the purge by when they were last set.
        await awaited(self._client.set(key, codec.dump(settings), px=self._retention_ms))

    async def owners_of_session(self, session: str) -> list[str]:
        # Figures and events name their owners in sets; the capped event list
        # still names those of events written before the set was kept.
        figures = await awaited(self._client.smembers(self._key("owners", session)))
        events = await awaited(self._client.smembers(self._key("evowners", session)))
        raws = await awaited(self._client.lrange(self._key("events", session), 0, -1))
        found = {member.decode() for member in (*figures, *events)}
        found.update(codec.load_event(raw).owner for raw in raws)
        return sorted(found)

    # -- lifecycle ---------------------------------------------------------

    async def purge(self, now: float | None = None) -> int:
        # Every record carries its own expiry but the rows kept by model.
        cutoff = (await self._now() if now is None else now) - self._retention_ms / 1000
        for table in ("windows", "calibrations"):
            await self._purge_model_rows(table, cutoff)
        return 0

    async def close(self) -> None:
        await self._client.aclose()


# Every operation reads its replies through the translation, but the two whose
# own errors mean something else: a ratio the caller got wrong (ValueError) and
# the lock (which checks its replies itself).
for _name, _method in list(vars(RedisStore).items()):
    if (
        not _name.startswith("_")
        and _name not in ("set_calibration", "lock", "close")
        and inspect.iscoroutinefunction(_method)
    ):
        setattr(RedisStore, _name, garbage_is_a_store_error(_method))
