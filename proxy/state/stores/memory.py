"""Everything in this process's memory: for tests and throwaway runs.

Bounded: past ``capacity`` checkpoints the oldest is forgotten with its
originals, past ``capacity`` sessions' settings the least recently set; the
event log keeps the newest events only; past ``max_model_rows`` learned windows
(or calibrations) the least recently set. Lost on exit, so
every other instance counts as dead for :meth:`fail_interrupted`.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

from compaction import Checkpoint, Message
from proxy.state.stores.base import (
    DEFAULT_CAPACITY,
    DEFAULT_EVENTS_LIMIT,
    DEFAULT_GLOBAL_EVENTS,
    DEFAULT_MAX_MODEL_ROWS,
    DEFAULT_RETENTION_SECONDS,
    INTERRUPTED,
    Event,
    checked_ratio,
    interrupted,
)
from proxy.state.stores.figures import (
    DEFAULT_REQUESTS_LIMIT,
    DEFAULT_REQUESTS_RETENTION_SECONDS,
    DEFAULT_SESSION_REQUESTS,
    DEFAULT_SESSIONS_LIMIT,
    SAVINGS_BUCKET_SECONDS,
    RequestRecord,
    SessionSettings,
    SessionSummary,
    by_session,
    fold,
    savings_of,
)
from proxy.state.stores.locks import LeaseLocks

_Key = tuple[str, str]  #: (owner, session)
_K = TypeVar("_K")
_V = TypeVar("_V")


def _set_bounded(rows: OrderedDict[_K, tuple[_V, float]], key: _K, value: _V, cap: int) -> None:
    """``rows[key] = (value, now)`` as the most recently set; past ``cap`` rows the
    least recently set go."""
    rows[key] = (value, time.time())
    rows.move_to_end(key)
    while len(rows) > cap:
        rows.popitem(last=False)


def _drop_older(rows: OrderedDict[_K, tuple[_V, float]], cutoff: float) -> None:
    for key in [key for key, (_, at) in rows.items() if at < cutoff]:
        del rows[key]


class MemoryStore:
    """The :class:`~proxy.state.stores.protocols.Store` contract in a few dicts."""

    tracks_liveness = False  #: one process: nothing else can be alive in it

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        store_originals: bool = True,
        max_events: int = DEFAULT_GLOBAL_EVENTS,
        requests_retention_seconds: float = DEFAULT_REQUESTS_RETENTION_SECONDS,
        max_model_rows: int = DEFAULT_MAX_MODEL_ROWS,
    ) -> None:
        self._by_hash: OrderedDict[str, Checkpoint] = OrderedDict()
        self._by_id: dict[str, tuple[Checkpoint, str]] = {}  #: with its owner
        #: (owner, session) of every checkpoint kept; ``None`` once one was
        #: dropped, until asked again (see :meth:`holds_checkpoints_now`).
        self._held: set[tuple[str, str]] | None = set()
        self._originals: OrderedDict[str, tuple[float, list[Message]]] = OrderedDict()
        self._events: deque[Event] = deque(maxlen=max_events)
        self._open: dict[str, Event] = {}  #: latest event of unfinished compactions
        #: Least recently set first, each with when it was set.
        self._windows: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._calibrations: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._max_model_rows = max_model_rows
        self._locks = LeaseLocks()
        self._capacity = capacity
        self._retention = retention_seconds
        self._store_originals = store_originals
        self._requests_retention = requests_retention_seconds
        self._requests: dict[_Key, deque[RequestRecord]] = {}
        #: Least recently active first: past ``capacity`` sessions the oldest go.
        self._sessions: OrderedDict[_Key, SessionSummary] = OrderedDict()
        self._savings: dict[tuple[str, float], int] = {}
        self._settings: OrderedDict[_Key, tuple[SessionSettings, float]] = OrderedDict()

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        return self.lookup_now(hashes)

    def lookup_now(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        # In this process's memory: always known.
        found = {}
        for value in hashes:
            checkpoint = self._by_hash.get(value)
            if checkpoint is not None:
                found[value] = checkpoint
        return found

    async def holds_checkpoints(self, owner: str, session: str) -> bool:
        return self.holds_checkpoints_now(owner, session)

    def holds_checkpoints_now(self, owner: str, session: str) -> bool:
        held = self._held
        if held is None:  # some were dropped: found again from those kept
            held = self._held = {(who, cp.session) for cp, who in self._by_id.values()}
        return (owner, session) in held

    async def put(
        self, checkpoint: Checkpoint, originals: Sequence[Message] | None = None, *, owner: str = ""
    ) -> None:
        # A newer checkpoint for the same span replaces the older one; the
        # older one's originals stay until the retention, as in SQLite and Redis.
        replaced = self._by_hash.pop(checkpoint.end_hash, None)
        if replaced is not None:
            self._by_id.pop(replaced.id, None)
        self._by_hash[checkpoint.end_hash] = checkpoint
        self._by_id[checkpoint.id] = (checkpoint, owner)
        if self._held is not None:
            self._held.add((owner, checkpoint.session))
        if originals is not None and self._store_originals:
            self._originals[checkpoint.id] = (checkpoint.created_at, list(originals))
            self._originals.move_to_end(checkpoint.id)
        while len(self._by_hash) > self._capacity:
            _, evicted = self._by_hash.popitem(last=False)
            self._by_id.pop(evicted.id, None)
            self._held = None
        while len(self._originals) > self._capacity:
            self._originals.popitem(last=False)

    async def get(self, checkpoint_id: str, *, owner: str | None = None) -> Checkpoint | None:
        checkpoint, owned_by = self._by_id.get(checkpoint_id, (None, ""))
        return checkpoint if owner is None or owner == owned_by else None

    async def originals(self, checkpoint_id: str) -> list[Message] | None:
        kept = self._originals.get(checkpoint_id)
        return None if kept is None else list(kept[1])

    async def owner_of(self, checkpoint_id: str) -> str | None:
        found = self._by_id.get(checkpoint_id)
        return None if found is None else found[1]

    async def add_event(self, event: Event) -> None:
        self._events.append(event)
        if event.is_open:
            self._open[event.compaction_id] = event
        else:
            self._open.pop(event.compaction_id, None)

    async def events(
        self,
        session: str | None = None,
        limit: int = DEFAULT_EVENTS_LIMIT,
        *,
        owner: str | None = None,
    ) -> list[Event]:
        found: list[Event] = []
        for event in reversed(self._events):
            if len(found) >= limit:
                break
            if (session is None or event.session == session) and (
                owner is None or event.owner == owner
            ):
                found.append(event)
        return found

    async def fail_interrupted(self, instance: str, message: str = INTERRUPTED) -> int:
        stale = [event for event in self._open.values() if event.instance != instance]
        for event in stale:
            await self.add_event(interrupted(event, instance, message))
        return len(stale)

    async def heartbeat(self, instance: str, ttl: float) -> None:
        return None

    def lock(self, key: str, ttl: float) -> AbstractAsyncContextManager[None]:
        return self._locks.hold(key, ttl)

    async def learned_windows(self) -> dict[str, int]:
        return {model: window for model, (window, _) in self._windows.items()}

    async def set_learned_window(self, model: str, window: int) -> None:
        _set_bounded(self._windows, model, window, self._max_model_rows)

    async def calibrations(self) -> dict[str, float]:
        return {key: ratio for key, (ratio, _) in self._calibrations.items()}

    async def set_calibration(self, key: str, ratio: float) -> None:
        _set_bounded(self._calibrations, key, checked_ratio(ratio), self._max_model_rows)

    async def record_requests(self, records: Sequence[RequestRecord]) -> None:
        for key, found in by_session(records).items():
            kept = self._requests.get(key)
            if kept is None:
                kept = self._requests[key] = deque(maxlen=DEFAULT_SESSION_REQUESTS)
            kept.extend(found)
            self._sessions[key] = fold(self._sessions.get(key), found)
            self._sessions.move_to_end(key)
        for bucket, saved in savings_of(records).items():
            self._savings[bucket] = self._savings.get(bucket, 0) + saved
        while len(self._sessions) > self._capacity:
            evicted, _ = self._sessions.popitem(last=False)
            self._requests.pop(evicted, None)

    async def requests(
        self, session: str, *, owner: str | None = None, limit: int = DEFAULT_REQUESTS_LIMIT
    ) -> list[RequestRecord]:
        found = [
            record
            for (owned_by, name), kept in self._requests.items()
            if name == session and (owner is None or owned_by == owner)
            for record in kept
        ]
        found.sort(key=lambda record: record.created_at, reverse=True)
        return found[: max(limit, 0)]

    async def sessions(
        self, *, owner: str | None = None, limit: int = DEFAULT_SESSIONS_LIMIT
    ) -> list[SessionSummary]:
        found = [s for (o, _), s in self._sessions.items() if owner is None or o == owner]
        found.sort(key=lambda summary: summary.last_at, reverse=True)
        return found[: max(limit, 0)]

    async def session_count(self, *, owner: str | None = None) -> int:
        if owner is None:
            return len(self._sessions)
        return sum(1 for owned_by, _ in self._sessions if owned_by == owner)

    async def savings(self, *, owner: str | None = None) -> list[tuple[float, int]]:
        totals: dict[float, int] = {}
        for (owned_by, bucket), saved in self._savings.items():
            if owner is None or owned_by == owner:
                totals[bucket] = totals.get(bucket, 0) + saved
        return sorted(totals.items())

    async def session_settings(self, session: str, owner: str) -> SessionSettings:
        kept = self._settings.get((owner, session))
        return SessionSettings() if kept is None else kept[0]

    async def set_session_settings(
        self, session: str, owner: str, settings: SessionSettings
    ) -> None:
        _set_bounded(self._settings, (owner, session), settings, self._capacity)

    async def owners_of_session(self, session: str) -> list[str]:
        found = {owner for owner, name in self._sessions if name == session}
        found.update(event.owner for event in self._events if event.session == session)
        return sorted(found)

    async def purge(self, now: float | None = None) -> int:
        moment = time.time() if now is None else now
        self._purge_requests(moment - self._requests_retention)
        cutoff = moment - self._retention
        old = [cp for cp in self._by_hash.values() if cp.created_at < cutoff]
        for checkpoint in old:
            del self._by_hash[checkpoint.end_hash]
            self._by_id.pop(checkpoint.id, None)
            self._held = None
        dropped = [key for key, (created, _) in self._originals.items() if created < cutoff]
        for key in dropped:
            del self._originals[key]
        kept = [event for event in self._events if event.created_at >= cutoff]
        if len(kept) != len(self._events):
            self._events = deque(kept, maxlen=self._events.maxlen)
        _drop_older(self._settings, cutoff)
        _drop_older(self._windows, cutoff)
        _drop_older(self._calibrations, cutoff)
        return len(dropped)

    def _purge_requests(self, cutoff: float) -> None:
        for key in [key for key, s in self._sessions.items() if s.last_at < cutoff]:
            del self._sessions[key]
        for key, kept in list(self._requests.items()):
            fresh = [record for record in kept if record.created_at >= cutoff]
            if not fresh:
                del self._requests[key]
            elif len(fresh) != len(kept):
                self._requests[key] = deque(fresh, maxlen=kept.maxlen)
        old = [b for b in self._savings if b[1] + SAVINGS_BUCKET_SECONDS < cutoff]
        for bucket in old:
            del self._savings[bucket]

    async def close(self) -> None:
        return None
