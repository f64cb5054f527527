"""The store contract: what every backend keeps, and the events it records.

A store holds five things for the proxy (DESIGN.md §7):

* **checkpoints**, found by the chain hash at the end of the span they cover;
* the **originals** a checkpoint replaced, for its retention;
* the **event log** of compactions (queued → started → compacted | failed);
* **learned windows** (context sizes stated by upstream overflow errors);
* **calibration ratios** (the upstream's token count ÷ the proxy's estimate),
  under keys the proxy builds, e.g. ``"<upstream url>\x1f<model>"``.

It also offers single-flight **locks**. Every method is async; a backend
whose I/O is blocking (SQLite) runs it on its own worker thread.

Checkpoints and events have an **owner**: an opaque digest of the caller's
credential (:func:`proxy.edge.access.owner_of`; never the credential). A store
keeps it beside the checkpoint (the library's :class:`~compaction.Checkpoint`
knows no callers) and on the event, and filters by it itself, so one caller's
last N events are found however busy the others are. ``owner=None`` reads
every owner's (the admin key, the CLI); ``""`` is the owner of what was
recorded before owners were, which only ``None`` sees.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

from compaction import Checkpoint, Message
from proxy.state.stores.figures import (
    DEFAULT_REQUESTS_LIMIT,
    DEFAULT_SESSIONS_LIMIT,
    RequestRecord,
    SessionSettings,
    SessionSummary,
)

EventType = Literal[
    "compaction.queued",
    "compaction.started",
    "context.compacted",
    "compaction.failed",
    "checkpoint.edited",
]

#: Event types that leave a compaction unfinished.
OPEN_EVENT_TYPES: Final[frozenset[str]] = frozenset({"compaction.queued", "compaction.started"})
INTERRUPTED: Final = "interrupted by restart"

DEFAULT_RETENTION_SECONDS: Final = 30 * 86400.0
DEFAULT_CAPACITY: Final = 10_000
DEFAULT_EVENTS_LIMIT: Final = 100
#: How many events are kept per session and in all (memory and Redis lists).
DEFAULT_SESSION_EVENTS: Final = 1_000
DEFAULT_GLOBAL_EVENTS: Final = 10_000


class StoreError(ValueError):
    """A store cannot be used: an unknown URL scheme, a database from a newer version."""


def checked_ratio(ratio: float) -> float:
    """``ratio`` as a float, refused unless finite and positive.

    Every budget is scaled by it, and a stored one outlives the process, so a
    NaN or a zero must never reach the store.
    """
    value = float(ratio)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"a calibration ratio must be finite and positive, not {ratio!r}")
    return value


@dataclass(frozen=True)
class Event:
    """One step in the life of a compaction."""

    compaction_id: str  #: groups the lifecycle events of one compaction
    type: EventType
    session: str
    model: str
    reason: str
    instance: str  #: id of the proxy process that emitted it
    stage: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    replaced_hashes: tuple[str, ...] = ()
    error: str | None = None
    checkpoint_id: str | None = None
    #: What the compaction reported on the way (a summary rejected, a fallback).
    notes: tuple[str, ...] = ()
    #: Whose conversation: a digest of the caller's credential (see the module doc).
    owner: str = ""
    #: True for a compaction prepared ahead of need, off the request path
    #: (proxy/session/background.py); it is applied when the conversation crosses its trigger.
    background: bool = False
    #: ``checkpoint.edited``: the summary text the edit replaced (kept, not lost).
    previous_summary: str | None = None
    created_at: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def is_open(self) -> bool:
        """True while the compaction has neither succeeded nor failed."""
        return self.type in OPEN_EVENT_TYPES


def interrupted(event: Event, instance: str, message: str = INTERRUPTED) -> Event:
    """The ``compaction.failed`` event closing ``event``'s compaction, emitted by ``instance``."""
    return Event(
        compaction_id=event.compaction_id,
        type="compaction.failed",
        session=event.session,
        model=event.model,
        reason=event.reason,
        instance=instance,
        stage=event.stage,
        tokens_before=event.tokens_before,
        replaced_hashes=event.replaced_hashes,
        error=message,
        owner=event.owner,
        background=event.background,
    )


class Store(Protocol):
    """Checkpoints, originals, events, learned windows, calibration ratios and locks
    (DESIGN.md §7)."""

    #: Whether instances declare themselves alive (:meth:`heartbeat`), so that a
    #: dead one's open compactions can be told from a live one's at any time.
    #: Without it, :meth:`fail_interrupted` is safe only at start-up.
    tracks_liveness: bool

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        """The checkpoints stored under any of ``hashes``, in one round trip."""
        ...

    async def put(
        self, checkpoint: Checkpoint, originals: Sequence[Message] | None = None, *, owner: str = ""
    ) -> None:
        """Store ``checkpoint`` (replacing one with the same end hash) and what it
        replaced, as ``owner``'s."""
        ...

    async def get(self, checkpoint_id: str, *, owner: str | None = None) -> Checkpoint | None:
        """The checkpoint with that id; ``None`` also when it is not ``owner``'s."""
        ...

    async def originals(self, checkpoint_id: str) -> list[Message] | None:
        """The messages the checkpoint replaced; ``None`` if not kept or expired."""
        ...

    async def add_event(self, event: Event) -> None: ...

    async def events(
        self,
        session: str | None = None,
        limit: int = DEFAULT_EVENTS_LIMIT,
        *,
        owner: str | None = None,
    ) -> list[Event]:
        """The last ``limit`` events recorded, newest first, of one session or of all,
        of ``owner`` or of everyone."""
        ...

    async def fail_interrupted(self, instance: str, message: str = INTERRUPTED) -> int:
        """Close, as ``compaction.failed``, every compaction left queued or started by a
        dead instance other than ``instance``; how many were closed."""
        ...

    async def heartbeat(self, instance: str, ttl: float) -> None:
        """Declare ``instance`` alive for ``ttl`` seconds (shared backends only)."""
        ...

    def lock(self, key: str, ttl: float) -> AbstractAsyncContextManager[None]:
        """Hold ``key`` exclusively; a holder that never releases loses it after ``ttl``."""
        ...

    async def learned_windows(self) -> dict[str, int]: ...

    async def set_learned_window(self, model: str, window: int) -> None: ...

    async def calibrations(self) -> dict[str, float]:
        """Every calibration ratio stored, by its key."""
        ...

    async def set_calibration(self, key: str, ratio: float) -> None:
        """Store ``ratio`` under the opaque ``key``, replacing any earlier one.

        Raises :class:`ValueError` unless ``ratio`` is finite and positive
        (:func:`checked_ratio`); bounding it is the caller's business.
        """
        ...

    async def record_requests(self, records: Sequence[RequestRecord]) -> None:
        """Keep ``records`` (in the order they happened) and fold them into their
        sessions' summaries and the hourly savings (:mod:`proxy.state.stores.figures`)."""
        ...

    async def requests(
        self, session: str, *, owner: str | None = None, limit: int = DEFAULT_REQUESTS_LIMIT
    ) -> list[RequestRecord]:
        """The last ``limit`` requests of ``session`` (of ``owner``, or anyone's), newest first."""
        ...

    async def sessions(
        self, *, owner: str | None = None, limit: int = DEFAULT_SESSIONS_LIMIT
    ) -> list[SessionSummary]:
        """The ``limit`` sessions last active, newest first, of ``owner`` or of everyone."""
        ...

    async def session_count(self, *, owner: str | None = None) -> int:
        """How many sessions have figures kept, of ``owner`` or of everyone."""
        ...

    async def savings(self, *, owner: str | None = None) -> list[tuple[float, int]]:
        """Tokens saved per hour (bucket start, tokens), oldest first."""
        ...

    async def session_settings(self, session: str, owner: str) -> SessionSettings:
        """What was set for ``owner``'s ``session``; the defaults when nothing was."""
        ...

    async def set_session_settings(
        self, session: str, owner: str, settings: SessionSettings
    ) -> None: ...

    async def purge(self, now: float | None = None) -> int:
        """Drop what is older than the retention (per-request figures: their own
        retention); how many originals were dropped."""
        ...

    async def close(self) -> None: ...
