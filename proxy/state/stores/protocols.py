"""The store contract, one small protocol per concern, and :class:`Store`, all of them.

A consumer types its store against the concern it uses, so a reader can see
what it touches and a test can hand it a fake of that much only:

* :class:`CheckpointStore` — checkpoints by end hash and by id, and the
  originals each replaced (the compaction, the state API, the dashboard);
* :class:`EventStore` — the event log of compactions (the same readers);
* :class:`LivenessStore` — which instances are alive, and closing what the
  dead ones left open (the app's keep-alive loop);
* :class:`LockStore` — single-flight locks (the compaction);
* :class:`WindowStore` — learned context windows (start-up, the overflow retry);
* :class:`CalibrationStore` — calibration ratios (start-up, the usage reader);
* :class:`FigureStore` — per-request figures, sessions, savings (the
  recorder, the dashboard);
* :class:`SettingsStore` — per-session settings (steering, the dashboard);
* :class:`UpkeepStore` — purging past the retention, closing (the app's lifespan).

Every backend (:mod:`~proxy.state.stores.memory`, :mod:`~proxy.state.stores.sqlite`,
:mod:`~proxy.state.stores.redis`) and the :class:`~proxy.state.stores.resilient.ResilientStore`
in front of them implements :class:`Store`, so every one of these; each
backend is still one class, because its concerns share its connection (the
SQLite worker thread, the Redis client and key scheme) and what the backends
could share is already shared as plain functions (:func:`~proxy.state.stores.figures.fold`,
:func:`~proxy.state.stores.base.interrupted`, :class:`~proxy.state.stores.locks.LeaseLocks`).

The protocols are runtime-checkable, so a test can ask ``isinstance`` of
each; that sees only that the members exist, so the tests compare the
parameters too, and mypy the types wherever a backend is used as a :class:`Store`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from compaction import Checkpoint, Message
from proxy.state.stores.base import DEFAULT_EVENTS_LIMIT, INTERRUPTED, Event
from proxy.state.stores.figures import (
    DEFAULT_REQUESTS_LIMIT,
    DEFAULT_SESSIONS_LIMIT,
    RequestRecord,
    SessionSettings,
    SessionSummary,
)


@runtime_checkable
class CheckpointLookup(Protocol):
    """Whether any stored checkpoint may apply to a request, asked on every one:
    by the chain hashes of its conversation, or — for a request too small to
    compact — by its session alone."""

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        """The checkpoints stored under any of ``hashes``, in one round trip."""
        ...

    def lookup_now(self, hashes: Sequence[str]) -> dict[str, Checkpoint] | None:
        """What :meth:`lookup` would answer, when the store knows it without any
        I/O or wait; ``None`` when it must be asked.

        A growing conversation asks about the same chain, one turn longer,
        every request, and almost always hears "none": a store that can tell
        that nothing was written since it last looked answers at once, on the
        caller's thread. It must never answer wrong: when in doubt, ``None``.
        """
        ...

    async def holds_checkpoints(self, owner: str, session: str) -> bool:
        """Whether any checkpoint of ``owner``'s ``session`` (:attr:`Checkpoint.session`)
        is stored: when none is, none can apply to its next request, and a
        request too small to compact is forwarded without reading its chain.
        It may err towards ``True`` (a checkpoint dropped since may still count),
        never towards ``False``."""
        ...

    def holds_checkpoints_now(self, owner: str, session: str) -> bool | None:
        """What :meth:`holds_checkpoints` would answer, when the store knows it
        without any I/O or wait (as :meth:`lookup_now`); ``None`` when it must be asked."""
        ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Checkpoints, found by the chain hash at the end of the span they cover,
    and the originals each replaced, as their owner's (:mod:`~proxy.state.stores.base`)."""

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
        """The messages the checkpoint replaced; ``None`` if not kept or expired.

        Not filtered by owner: a caller reads them only for a checkpoint an
        owner-checked :meth:`get` found (ids are random, never guessed)."""
        ...

    async def owner_of(self, checkpoint_id: str) -> str | None:
        """The owner the checkpoint was stored as; ``None`` when there is no such
        checkpoint. What an admin's edit stores it as again: an owner is read,
        never inferred."""
        ...


@runtime_checkable
class EventStore(Protocol):
    """The event log: queued → started → compacted | failed, and edits."""

    async def add_event(self, event: Event) -> None:
        """Record ``event`` as the newest."""
        ...

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


@runtime_checkable
class LivenessStore(Protocol):
    """Which proxy instances are alive, so that what a dead one left open is closed."""

    #: Whether instances declare themselves alive (:meth:`heartbeat`), so that a
    #: dead one's open compactions can be told from a live one's at any time.
    #: Without it, :meth:`fail_interrupted` is safe only at start-up.
    tracks_liveness: bool

    async def heartbeat(self, instance: str, ttl: float) -> None:
        """Declare ``instance`` alive for ``ttl`` seconds (shared backends only)."""
        ...

    async def fail_interrupted(self, instance: str, message: str = INTERRUPTED) -> int:
        """Close, as ``compaction.failed``, every compaction left queued or started by a
        dead instance other than ``instance``; how many were closed."""
        ...


@runtime_checkable
class LockStore(Protocol):
    """Single flight: one holder of a key at a time, across every replica sharing the store."""

    def lock(self, key: str, ttl: float) -> AbstractAsyncContextManager[None]:
        """Hold ``key`` exclusively; a holder that never releases loses it after ``ttl``."""
        ...


@runtime_checkable
class WindowStore(Protocol):
    """Context windows the upstream stated in its overflow errors, by model key."""

    async def learned_windows(self) -> dict[str, int]:
        """Every learned window, by its key."""
        ...

    async def set_learned_window(self, model: str, window: int) -> None:
        """Store ``window`` under ``model``, replacing any earlier one.

        The model is a name a client sent: past ``max_model_rows`` windows the
        least recently set is dropped, and a window not set again within the
        retention is purged."""
        ...


@runtime_checkable
class CalibrationStore(Protocol):
    """Calibration ratios (the upstream's token count ÷ the proxy's estimate), under
    keys the proxy builds, e.g. ``"<upstream url>\\x1f<model>"``."""

    async def calibrations(self) -> dict[str, float]:
        """Every calibration ratio stored, by its key."""
        ...

    async def set_calibration(self, key: str, ratio: float) -> None:
        """Store ``ratio`` under the opaque ``key``, replacing any earlier one.

        Raises :class:`ValueError` unless ``ratio`` is finite and positive
        (:func:`~proxy.state.stores.base.checked_ratio`); bounding it is the caller's business.
        Rows are bounded as the learned windows are (:meth:`WindowStore.set_learned_window`).
        """
        ...


@runtime_checkable
class FigureStore(Protocol):
    """Per-request figures, the sessions they add up to, and the hourly savings
    (:mod:`proxy.state.stores.figures`)."""

    async def record_requests(self, records: Sequence[RequestRecord]) -> None:
        """Keep ``records`` (in the order they happened) and fold them into their
        sessions' summaries and the hourly savings."""
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


@runtime_checkable
class SettingsStore(Protocol):
    """What a user set for one of their conversations."""

    async def session_settings(self, session: str, owner: str) -> SessionSettings:
        """What was set for ``owner``'s ``session``; the defaults when nothing was."""
        ...

    async def set_session_settings(
        self, session: str, owner: str, settings: SessionSettings
    ) -> None:
        """Store ``settings`` for ``owner``'s ``session``, replacing what was set.
        Kept for the retention after they were last set, then purged."""
        ...

    async def owners_of_session(self, session: str) -> list[str]:
        """Every owner with figures or events of a session by that id, sorted:
        two callers may use one id, and the admin steers one of them by name."""
        ...


@runtime_checkable
class UpkeepStore(Protocol):
    """Keeping the store within its retention, and letting it go."""

    async def purge(self, now: float | None = None) -> int:
        """Drop what is older than the retention (per-request figures: their own
        retention) — checkpoints, originals, events, session settings, learned
        windows and calibrations by when they were last set; how many originals
        were dropped."""
        ...

    async def close(self) -> None:
        """Release the connection (or worker thread); the store is not used after."""
        ...


@runtime_checkable
class Store(
    CheckpointLookup,
    CheckpointStore,
    EventStore,
    LivenessStore,
    LockStore,
    WindowStore,
    CalibrationStore,
    FigureStore,
    SettingsStore,
    UpkeepStore,
    Protocol,
):
    """Everything a store keeps (docs/state.md): what the app opens and hands to
    :class:`~proxy.session.service.Conversations`. Type against one concern where that is
    all that is used."""
