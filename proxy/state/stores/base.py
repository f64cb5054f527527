"""What a store keeps, and the events it records: the terms of the store contract.

A store holds five things for the proxy (docs/state.md):

* **checkpoints**, found by the chain hash at the end of the span they cover;
* the **originals** a checkpoint replaced, for its retention;
* the **event log** of compactions (queued → started → compacted | failed |
  superseded);
* **learned windows** (context sizes stated by upstream overflow errors);
* **calibration ratios** (the upstream's token count ÷ the proxy's estimate),
  under keys the proxy builds, e.g. ``"<upstream url>\x1f<model>"``.

It also offers single-flight **locks**, and keeps per-request **figures** and
per-session **settings**. The contract, one protocol per concern, is
:mod:`proxy.state.stores.protocols`; this module holds what they exchange.
Every method is async; a backend whose I/O is blocking (SQLite) runs it on
its own worker thread.

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
from dataclasses import dataclass, field
from typing import Final, Literal

EventType = Literal[
    "compaction.queued",
    "compaction.started",
    "context.compacted",
    "compaction.failed",
    # A compaction prepared in the background that ends without a checkpoint
    # for a reason that is no fault: its summary could not be used by the
    # compaction it was for, or it gave way to a request the server serves
    # one at a time. The error field says which; nothing is retried.
    "compaction.superseded",
    "checkpoint.edited",
    # The model read back content a compaction removed (proxy/recall/);
    # the notes count the calls by outcome.
    "context.recalled",
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
#: How many learned windows, and how many calibration ratios, are kept: they
#: are keyed by model names clients send, which cost a client nothing to invent.
DEFAULT_MAX_MODEL_ROWS: Final = 1_000


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
