"""A store that cannot fail the requests the proxy exists for (issue 10, finding 4).

    health = StoreHealth()
    store = ResilientStore(open_store(url), timeout=2.0, health=health, observer=metrics)
    health.report()  # what /healthz says

Every call is cut off after ``timeout`` seconds, timed, and on failure
answered according to who asked:

* **the request path degrades**: ``lookup`` finds nothing (the request is
  compacted afresh), writes — ``put``, ``add_event``, ``set_*``, heartbeats,
  ``fail_interrupted``, ``purge`` — are skipped, and ``lock`` lets its caller
  in without the shared lock. Single flight is lost only while the store is
  down, and then there is nothing to share: a compaction made now cannot be
  stored, so the next request compacts again whether it waited or not;
* **readers with nothing to fall back on** — ``get``, ``originals`` and
  ``events`` (the state endpoints), ``learned_windows`` and ``calibrations``
  (start-up) — raise :class:`StoreUnavailable`: the app answers 503, or
  loads them later.

A call that **timed out** makes the calls after it skip the store for
:data:`PAUSE_AFTER_TIMEOUT` seconds: a hung Redis would otherwise cost every
request one timeout per store call (seven for a compaction). A call that
failed at once (a refused connection, a full disk) costs nothing to repeat,
so the next call tries again.

The store is **degraded** (``/healthz``) from a failed call until a call of
the same side — read or write — succeeds: a full disk still reads, so a read
proves nothing of the writes. A write proves itself only if it must have
written (a heartbeat to SQLite, a purge with nothing to purge do not).

Failures are logged at error level by exception type only — a store error
may quote a key or a value, never the conversation — at most once every
:data:`LOG_EVERY` seconds, so a store that flaps does not flood the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, Protocol, TypeVar

from compaction import Checkpoint, Message
from proxy.state.stores.base import DEFAULT_EVENTS_LIMIT, INTERRUPTED, Event, Store, checked_ratio
from proxy.state.stores.figures import (
    DEFAULT_REQUESTS_LIMIT,
    DEFAULT_SESSIONS_LIMIT,
    RequestRecord,
    SessionSettings,
    SessionSummary,
)

logger = logging.getLogger("compaction_proxy.store")

_T = TypeVar("_T")

#: Seconds the store is left alone after a call timed out (the keep-alive
#: probe, every 10 s, is not held back: it costs no request anything).
PAUSE_AFTER_TIMEOUT: Final = 10.0
#: At most one error line in this many seconds, with the count of the others.
LOG_EVERY: Final = 60.0

FailureKind = Literal["error", "timeout", "skipped"]
Side = Literal["read", "write"]


class StoreUnavailable(Exception):
    """A store call failed, timed out, or was skipped while the store is failing."""

    def __init__(self, operation: str) -> None:
        super().__init__(f"the store is unavailable ({operation})")
        self.operation = operation


class StoreObserver(Protocol):
    """Told of every store call (the proxy's metrics)."""

    def store_call(self, operation: str, seconds: float) -> None: ...

    def store_failed(self, operation: str, kind: FailureKind) -> None: ...


@dataclass(frozen=True)
class HealthReport:
    """What the proxy knows of its store, from the calls it made."""

    ok: bool
    operation: str | None = None  #: the call that failed first in this run of failures
    error: str | None = None  #: its exception type, or ``"timeout"``
    since: float | None = None  #: wall-clock time of that failure
    failed_calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        if self.ok:
            return {"status": "ok"}
        store = {
            "operation": self.operation,
            "error": self.error,
            "since": self.since,
            "failed_calls": self.failed_calls,
        }
        return {"status": "degraded", "store": store}


@dataclass
class _Run:
    """Failures with no successful call between them."""

    report: HealthReport
    logged: bool


class StoreHealth:
    """The store's health as the outcomes of its calls tell it; logs the failures.

    Reads and writes are told apart: a full disk still reads, so a read that
    succeeds says nothing of the writes. Degraded from a failed call until a
    call of the same side succeeds (one that must have done I/O: a no-op
    heartbeat proves nothing). ``clock`` (monotonic seconds) is for tests.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._run: _Run | None = None
        self._failing: set[Side] = set()
        self._pause_until = -math.inf
        self._logged_at = -math.inf
        self._unlogged = 0  #: failures since the last error line

    @property
    def failing(self) -> bool:
        return self._run is not None

    def paused(self) -> bool:
        """Whether calls skip the store now (after a timeout)."""
        return self._clock() < self._pause_until

    def report(self) -> HealthReport:
        return HealthReport(ok=True) if self._run is None else self._run.report

    def succeeded(self, side: Side) -> None:
        run = self._run
        if run is None:
            return
        self._pause_until = -math.inf
        self._failing.discard(side)
        if self._failing:
            return
        self._run = None
        if run.logged:
            logger.warning(
                "the store answers again, after %d failed call(s)", run.report.failed_calls
            )

    def failed(self, operation: str, error: str, side: Side, *, timed_out: bool) -> None:
        self._failing.add(side)
        now = self._clock()
        if timed_out:
            self._pause_until = now + PAUSE_AFTER_TIMEOUT
        run = self._run
        if run is None:
            first = HealthReport(False, operation, error, time.time(), 1)
            run = self._run = _Run(first, logged=False)
        else:
            run.report = replace(run.report, failed_calls=run.report.failed_calls + 1)
        self._unlogged += 1
        if now - self._logged_at >= LOG_EVERY:
            logger.error(
                "store call failed (%s in %s; %d failure(s) since the last report); "
                "requests are served without the store until it answers again",
                error,
                operation,
                self._unlogged,
            )
            self._logged_at, self._unlogged, run.logged = now, 0, True


def _timed_out(exc: BaseException) -> bool:
    # redis-py's TimeoutError (its socket timeout) is no subclass of the
    # built-in one; this module names no backend, so it goes by the name.
    return isinstance(exc, TimeoutError) or type(exc).__name__ == "TimeoutError"


class ResilientStore:
    """The :class:`~proxy.state.stores.base.Store` contract over ``store``, whose failures
    degrade instead of failing the caller (see the module doc).

    Forwarding a method of the contract is one line: ``_soft`` with the answer
    a request can live with, or ``_hard`` for a reader that must know.
    """

    def __init__(
        self,
        store: Store,
        *,
        timeout: float,
        health: StoreHealth | None = None,
        observer: StoreObserver | None = None,
    ) -> None:
        self._store = store
        self._timeout = timeout
        self.health = health if health is not None else StoreHealth()
        self._observer = observer
        self.tracks_liveness = store.tracks_liveness

    async def _hard(
        self,
        operation: str,
        call: Callable[[], Awaitable[_T]],
        side: Side = "read",
        *,
        proves: bool = True,
        probe: bool = False,
    ) -> _T:
        """``call()`` within the time-box; :class:`StoreUnavailable` if it failed,
        timed out, or was skipped (``probe`` is never skipped). Unless ``proves``
        is false (a call that may do no I/O), its success says ``side`` works."""
        health, observer = self.health, self._observer
        if not probe and health.paused():
            if observer is not None:
                observer.store_failed(operation, "skipped")
            raise StoreUnavailable(operation)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout) as box:
                result = await call()
        except Exception as exc:
            self._failed(operation, exc, side, timed_out=box.expired())
            raise StoreUnavailable(operation) from exc
        finally:
            if observer is not None:
                observer.store_call(operation, time.perf_counter() - started)
        if proves:
            health.succeeded(side)
        return result

    def _failed(
        self, operation: str, exc: Exception, side: Side, *, timed_out: bool = False
    ) -> None:
        timed_out = timed_out or _timed_out(exc)
        error = "timeout" if timed_out else type(exc).__name__
        self.health.failed(operation, error, side, timed_out=timed_out)
        if self._observer is not None:
            self._observer.store_failed(operation, "timeout" if timed_out else "error")

    async def _soft(
        self,
        operation: str,
        default: _T,
        call: Callable[[], Awaitable[_T]],
        side: Side = "write",
        *,
        proves: bool = True,
    ) -> _T:
        """``call()``, or ``default`` if the store is unavailable."""
        try:
            return await self._hard(operation, call, side, proves=proves)
        except StoreUnavailable:
            return default

    # -- the request path: degrade -------------------------------------------

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        return await self._soft("lookup", {}, lambda: self._store.lookup(hashes), "read")

    async def put(
        self, checkpoint: Checkpoint, originals: Sequence[Message] | None = None, *, owner: str = ""
    ) -> None:
        await self._soft("put", None, lambda: self._store.put(checkpoint, originals, owner=owner))

    async def add_event(self, event: Event) -> None:
        await self._soft("add_event", None, lambda: self._store.add_event(event))

    async def fail_interrupted(self, instance: str, message: str = INTERRUPTED) -> int:
        call = lambda: self._store.fail_interrupted(instance, message)  # noqa: E731
        return await self._soft("fail_interrupted", 0, call, proves=False)  # may write nothing

    async def heartbeat(self, instance: str, ttl: float) -> None:
        call = lambda: self._store.heartbeat(instance, ttl)  # noqa: E731
        await self._soft("heartbeat", None, call, proves=self.tracks_liveness)  # else a no-op

    async def set_learned_window(self, model: str, window: int) -> None:
        await self._soft(
            "set_learned_window", None, lambda: self._store.set_learned_window(model, window)
        )

    async def set_calibration(self, key: str, ratio: float) -> None:
        value = checked_ratio(ratio)  # the caller's mistake is not the store's failure
        await self._soft("set_calibration", None, lambda: self._store.set_calibration(key, value))

    async def purge(self, now: float | None = None) -> int:
        return await self._soft("purge", 0, lambda: self._store.purge(now), proves=False)

    async def record_requests(self, records: Sequence[RequestRecord]) -> None:
        await self._soft("record_requests", None, lambda: self._store.record_requests(records))

    async def session_settings(self, session: str, owner: str) -> SessionSettings:
        # Read when about to compact: a store that cannot say means the defaults.
        call = lambda: self._store.session_settings(session, owner)  # noqa: E731
        return await self._soft("session_settings", SessionSettings(), call, "read")

    def lock(self, key: str, ttl: float) -> AbstractAsyncContextManager[None]:
        return self._lock(key, ttl)

    @contextlib.asynccontextmanager
    async def _lock(self, key: str, ttl: float) -> AsyncIterator[None]:
        # Taking the lock may wait for another holder for up to ``ttl``, so it
        # is not time-boxed here; each Redis poll is, by the client's socket
        # timeout (open_store). Releasing it is.
        held: AbstractAsyncContextManager[None] | None = None
        if self.health.paused():
            if self._observer is not None:
                self._observer.store_failed("lock", "skipped")
        else:
            held = self._store.lock(key, ttl)
            try:
                await held.__aenter__()
            except Exception as exc:
                held = None
                self._failed("lock", exc, "write")
            else:
                if self.tracks_liveness:  # a shared lock is a write; a local one no I/O
                    self.health.succeeded("write")
        try:
            yield
        finally:
            if held is not None:
                release = held
                with contextlib.suppress(StoreUnavailable):
                    await self._hard(
                        "unlock", lambda: release.__aexit__(None, None, None), "write", proves=False
                    )

    # -- readers that must know: StoreUnavailable ------------------------------

    async def get(self, checkpoint_id: str, *, owner: str | None = None) -> Checkpoint | None:
        return await self._hard("get", lambda: self._store.get(checkpoint_id, owner=owner))

    async def originals(self, checkpoint_id: str) -> list[Message] | None:
        return await self._hard("originals", lambda: self._store.originals(checkpoint_id))

    async def events(
        self,
        session: str | None = None,
        limit: int = DEFAULT_EVENTS_LIMIT,
        *,
        owner: str | None = None,
    ) -> list[Event]:
        return await self._hard("events", lambda: self._store.events(session, limit, owner=owner))

    async def learned_windows(self) -> dict[str, int]:
        return await self._hard("learned_windows", self._store.learned_windows)

    async def requests(
        self, session: str, *, owner: str | None = None, limit: int = DEFAULT_REQUESTS_LIMIT
    ) -> list[RequestRecord]:
        call = lambda: self._store.requests(session, owner=owner, limit=limit)  # noqa: E731
        return await self._hard("requests", call)

    async def sessions(
        self, *, owner: str | None = None, limit: int = DEFAULT_SESSIONS_LIMIT
    ) -> list[SessionSummary]:
        return await self._hard("sessions", lambda: self._store.sessions(owner=owner, limit=limit))

    async def session_count(self, *, owner: str | None = None) -> int:
        return await self._hard("session_count", lambda: self._store.session_count(owner=owner))

    async def savings(self, *, owner: str | None = None) -> list[tuple[float, int]]:
        return await self._hard("savings", lambda: self._store.savings(owner=owner))

    async def set_session_settings(
        self, session: str, owner: str, settings: SessionSettings
    ) -> None:
        call = lambda: self._store.set_session_settings(session, owner, settings)  # noqa: E731
        await self._hard("set_session_settings", call, "write")

    async def calibrations(self) -> dict[str, float]:
        return await self._hard("calibrations", self._store.calibrations)

    # -- upkeep ------------------------------------------------------------------

    async def probe(self) -> bool:
        """Whether the store answers a read now (never skipped: run off the request path)."""
        try:
            await self._hard("probe", self._store.learned_windows, probe=True)
        except StoreUnavailable:
            return False
        return True

    async def close(self) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._store.close()
        except Exception as exc:  # shutting down: nothing is left to serve
            logger.warning("the store did not close cleanly (%s)", type(exc).__name__)
