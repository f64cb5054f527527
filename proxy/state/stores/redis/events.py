"""The Redis store's events and its replicas' liveness: the capped lists of
compaction events (all, by session, by owner), the hash of compactions still
open, each instance's heartbeat key, and closing the open compactions of an
instance whose heartbeat lapsed (a Lua script, so two replicas starting
together record one failure, not two). Keys in
:mod:`~proxy.state.stores.redis.store`'s docstring.
"""

from __future__ import annotations

from proxy.state.stores import codec
from proxy.state.stores.base import DEFAULT_EVENTS_LIMIT, INTERRUPTED, Event, interrupted
from proxy.state.stores.redis.core import SCHEME, RedisCore
from proxy.state.stores.redis.replies import GarbledReply, awaited


class RedisEvents(RedisCore):
    """Events and heartbeats, on the shared client and keys."""

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
        # What it holds is the scheme this replica writes: the held keys' backfill
        # waits while a replica from before them is alive (held.py).
        alive = self._key("alive", instance)
        done = await awaited(self._client.set(alive, SCHEME, px=ttl_ms))
        if done is not True:  # a SET without a condition always answers OK
            raise GarbledReply(f"Redis answered SET with {type(done).__name__}")
