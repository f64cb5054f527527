"""The Redis store's per-request figures and sessions: each session's newest
requests (capped), its summary folded in a WATCH transaction so replicas
folding the same session lose nothing, the recent-sessions indexes stamped on
the store's clock, tokens saved by hour, per-session settings, and whose a
session is. Keys in :mod:`~proxy.state.stores.redis.store`'s docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.state.stores import codec
from proxy.state.stores.figures import (
    DEFAULT_REQUESTS_LIMIT,
    DEFAULT_SESSION_REQUESTS,
    DEFAULT_SESSIONS_LIMIT,
    RequestRecord,
    SessionSettings,
    SessionSummary,
    bucket_of,
    by_session,
    fold,
)
from proxy.state.stores.redis.core import RedisCore
from proxy.state.stores.redis.replies import awaited


class RedisFigures(RedisCore):
    """Request figures, session summaries and settings, on the shared client and keys."""

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
