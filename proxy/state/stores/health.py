"""The store's health, as the outcomes of its calls tell it (``/healthz``).

The store is **degraded** (``/healthz``) from a failed call until a call of
the same side — read or write — succeeds: a full disk still reads, so a read
proves nothing of the writes. A write proves itself only if it must have
written (a heartbeat to SQLite, a purge with nothing to purge do not).

Failures are logged at error level by exception type only — a store error
may quote a key or a value, never the conversation — at most once every
:data:`LOG_EVERY` seconds, so a store that flaps does not flood the log.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

logger = logging.getLogger("compaction_proxy.store")

#: Seconds the store is left alone after a call timed out (the keep-alive
#: probe, every 10 s, is not held back: it costs no request anything).
PAUSE_AFTER_TIMEOUT: Final = 10.0
#: At most one error line in this many seconds, with the count of the others.
LOG_EVERY: Final = 60.0

Side = Literal["read", "write"]


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

    :attr:`failing` is a plain attribute, read before anything else is asked:
    while the store is healthy, a call asks nothing more of its health (no
    pause to check, no success to record).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._run: _Run | None = None
        #: A call failed and no call of its side succeeded since.
        self.failing = False
        self._failing: set[Side] = set()
        self._pause_until = -math.inf
        self._logged_at = -math.inf
        self._unlogged = 0  #: failures since the last error line

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
        self.failing = False
        if run.logged:
            logger.warning(
                "the store answers again, after %d failed call(s)", run.report.failed_calls
            )

    def failed(self, operation: str, error: str, side: Side, *, timed_out: bool) -> None:
        self._failing.add(side)
        self.failing = True
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
