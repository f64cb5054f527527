"""Work started by a request that outlives it: the compactions prepared ahead
of need (:mod:`proxy.session.ahead`), each in a task of its own. This module keeps
those tasks:

* **single flight** — at most one task per conversation span in this process
  (:meth:`Background.start` refuses a second); across replicas the task takes
  the store's lock of the span and asks the store again before working;
* **capped** — at most ``max_running`` tasks at once, and ``max_per_owner`` of
  one caller's: one more is not started (nor queued) but refused, counted by
  its reason (``at_capacity``, ``owner_at_capacity``). Nothing is lost: the
  request that crosses the trigger compacts on its own path, as it would
  without preparation;
* **never tied to a client** — a client that leaves does not cancel it;
* **waited for, not duplicated** — a request that crosses the trigger while
  the task runs awaits it (:meth:`Background.wait`) instead of asking the
  model a second time;
* **drained at shutdown** — tasks still running get a grace period, then are
  cancelled (their compaction is recorded as failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, Literal

logger = logging.getLogger("compaction_proxy.background")

#: Tasks at once in a process, and of one owner, unless configured
#: (``background.max_running``, ``background.max_running_per_owner``).
DEFAULT_MAX_RUNNING = 4
DEFAULT_MAX_PER_OWNER = 1

#: Spans remembered as prepared for nothing (:meth:`Background.spend`); the
#: oldest are forgotten first. A span's key names the session and the
#: checkpoint it follows, so a compaction moves the conversation to a new one.
SPENT_SPANS = 1024

#: What :meth:`Background.start` did: started the work, or why not.
Start = Literal["started", "running", "at_capacity", "owner_at_capacity"]


class Background:
    """The running tasks, by the key of the conversation span they prepare.

    ``on_refused`` is told the reason each time work is refused for a cap
    (the proxy counts it in /metrics).
    """

    def __init__(
        self,
        *,
        max_running: int = DEFAULT_MAX_RUNNING,
        max_per_owner: int = DEFAULT_MAX_PER_OWNER,
        on_refused: Callable[[Start], object] | None = None,
    ) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._owners: dict[str, str] = {}  # key → owner, for the running tasks
        self._per_owner: Counter[str] = Counter()
        self._max_running = max_running
        self._max_per_owner = max_per_owner
        self._on_refused = on_refused
        self._spent: dict[str, None] = {}  # insertion order: the oldest first

    def running(self, key: str) -> bool:
        return key in self._tasks

    def spend(self, key: str) -> None:
        """Remember that preparing ``key``'s span gave nothing to store, though
        the model answered (its summary refused, or covering no reusable span):
        preparing it again would ask the model again for the same nothing."""
        self._spent.pop(key, None)
        self._spent[key] = None
        while len(self._spent) > SPENT_SPANS:
            del self._spent[next(iter(self._spent))]

    def spent(self, key: str) -> bool:
        """Whether ``key``'s span was prepared for nothing (:meth:`spend`)."""
        return key in self._spent

    def start(self, key: str, work: Coroutine[Any, Any, None], *, owner: str = "") -> Start:
        """Run ``work`` unless a task for ``key`` already runs or a cap is reached
        (then ``work`` is closed, never run); what was done."""
        outcome = self._admit(key, owner)
        if outcome != "started":
            work.close()
            if outcome != "running":
                logger.info(
                    "background compaction not started: %s (%d running)",
                    outcome.replace("_", " "),
                    len(self._tasks),
                )
                if self._on_refused is not None:
                    self._on_refused(outcome)
            return outcome
        task = asyncio.create_task(work, name=f"background {key[:40]}")
        self._tasks[key] = task
        self._owners[key] = owner
        self._per_owner[owner] += 1
        task.add_done_callback(lambda done: self._finished(key, done))
        return outcome

    def _admit(self, key: str, owner: str) -> Start:
        if key in self._tasks:
            return "running"
        if len(self._tasks) >= self._max_running:
            return "at_capacity"
        if self._per_owner[owner] >= self._max_per_owner:
            return "owner_at_capacity"
        return "started"

    def _finished(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
            owner = self._owners.pop(key)
            self._per_owner[owner] -= 1
            if self._per_owner[owner] <= 0:
                del self._per_owner[owner]
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            logger.warning("background compaction failed: %s", type(error).__name__, exc_info=error)

    async def wait(self, key: str) -> None:
        """Until the task for ``key`` (if any) is done; its failure is its own,
        and cancelling the waiter does not cancel the task."""
        task = self._tasks.get(key)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    async def close(self, grace: float) -> None:
        """Let running tasks finish for up to ``grace`` seconds, then cancel the rest."""
        tasks = list(self._tasks.values())
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            logger.warning("cancelled %d background compaction(s) at shutdown", len(pending))
            await asyncio.wait(pending, timeout=grace)

    def __len__(self) -> int:
        return len(self._tasks)


# --- the upstream's slots: who is being served ------------------------------------

#: Overlaps seen before an upstream whose slots are unknown is treated as
#: serving one request at a time: a user request sent while a background
#: summary to it was in flight, and answered (its headers) only after that
#: summary ended — the mark of a request queued behind it. One can be chance
#: (a long answer on a server with slots to spare); a few in a row are not.
SINGLE_SLOT_OVERLAPS = 3
#: Upstreams and models whose one-slot observations are remembered: model
#: names are the client's to invent, so the oldest are forgotten past this.
TRAFFIC_KEYS = 1024

#: What is done with a preparation for an upstream that serves one request
#: at a time (``background.single_slot``): run only while no user request is
#: in flight (and give way to one that arrives), or not run at all.
SingleSlot = Literal["wait", "off"]


class GaveWay(Exception):
    """A background summary cancelled for a user request on a one-slot upstream."""


class Traffic:
    """What each upstream (by :func:`proxy.state.models.calibration_key`) is
    serving now: the user requests in flight and the background summaries.

    A server with one slot (llama.cpp's default) answers one request at a
    time: a summary asked ahead of need there makes the user's next request
    queue behind it. So a preparation's summary for such an upstream starts
    only while no user request to it is in flight (:meth:`quiet`) — from its
    sending until its answer is over, a stream's last byte included — and a
    user request that arrives meanwhile cancels it before being sent
    (:meth:`begin`): the user is served first; the work is lost, and the
    compaction is made when the conversation crosses its trigger (or prepared
    again at a quieter moment). Whether an upstream has one slot is what it
    states (``/props`` ``total_slots``) or, failing that, what is observed:
    :data:`SINGLE_SLOT_OVERLAPS` user requests answered only after a summary
    in flight at their sending had ended.
    """

    def __init__(self, *, overlaps: int = SINGLE_SLOT_OVERLAPS) -> None:
        self._requests: Counter[str] = Counter()
        self._quiet: dict[str, list[asyncio.Future[None]]] = {}
        self._summaries: dict[str, set[_Summary]] = {}
        self._ended: Counter[str] = Counter()  # summaries ended, ever, per upstream
        self._overlaps: Counter[str] = Counter()
        self._overlaps_needed = overlaps
        # Upstreams whose preparations were turned off, logged (insertion-ordered).
        self._told: dict[str, None] = {}

    def in_flight(self, key: str) -> int:
        """User requests to ``key``'s upstream being sent now."""
        return self._requests[key]

    def waiting(self, key: str) -> int:
        """Background summaries to ``key``'s upstream waiting for it to be free."""
        return sum(not waiter.done() for waiter in self._quiet.get(key, ()))

    def summaries(self, key: str) -> int:
        """Background summaries to ``key``'s upstream in flight now."""
        return len(self._summaries.get(key, ()))

    def single_slot(self, key: str, stated: int | None) -> bool:
        """Whether ``key``'s upstream serves one request at a time: it said so
        (``stated`` slots), or it was seen to (see the class doc)."""
        if stated is not None:
            return stated == 1
        return self._overlaps[key] >= self._overlaps_needed

    def overlaps(self, key: str) -> int:
        return self._overlaps[key]

    async def begin(self, key: str, *, single: bool) -> Sending:
        """A user request to ``key``'s upstream is about to be sent: counted in
        flight until :meth:`Sending.end`. On a one-slot upstream (``single``)
        the background summaries in flight are cancelled first, and waited
        for, so the request is not queued behind one."""
        in_flight = list(self._summaries.get(key, ()))
        if single and in_flight:
            for summary in in_flight:
                summary.give_way()
            await asyncio.wait([s.task for s in in_flight])
        self._requests[key] += 1
        return Sending(self, key, overlapped=bool(in_flight), ended=self._ended[key])

    def _answered(self, sending: Sending) -> None:
        if sending.overlapped and self._ended[sending.key] > sending.ended:
            _count(self._overlaps, sending.key)

    def _end(self, key: str) -> None:
        self._requests[key] -= 1
        if self._requests[key] <= 0:
            del self._requests[key]
            for waiter in self._quiet.pop(key, []):
                if not waiter.done():
                    waiter.set_result(None)

    async def quiet(self, key: str) -> None:
        """Until no user request to ``key``'s upstream is in flight."""
        while self._requests[key] > 0:
            waiter = asyncio.get_running_loop().create_future()
            self._quiet.setdefault(key, []).append(waiter)
            await waiter

    async def summary(
        self, key: str, call: Coroutine[Any, Any, str], *, single: bool, patience: float
    ) -> str:
        """Run ``call``, a background summary to ``key``'s upstream, counted as
        in flight. On a one-slot upstream (``single``) it waits, up to
        ``patience`` seconds, until no user request is in flight, and raises
        :class:`GaveWay` when one arrives meanwhile (or the wait runs out)."""
        if single:
            try:
                await asyncio.wait_for(self.quiet(key), patience)
            except TimeoutError:
                call.close()
                raise GaveWay("the upstream was never free of user requests") from None
        summary = _Summary(asyncio.ensure_future(call))
        running = self._summaries.setdefault(key, set())
        running.add(summary)
        try:
            return await summary.task
        except asyncio.CancelledError:
            if summary.gave_way:
                raise GaveWay("gave way to a user request on a one-slot upstream") from None
            summary.task.cancel()
            raise
        finally:
            running.discard(summary)
            if not running:
                self._summaries.pop(key, None)
            _count(self._ended, key)

    def tell_once(self, key: str) -> bool:
        """True the first time preparations for ``key``'s upstream are turned off."""
        if key in self._told:
            return False
        self._told[key] = None
        _forget_oldest(self._told)
        return True


class Sending:
    """One user request in flight (:meth:`Traffic.begin`), until :meth:`end`."""

    __slots__ = ("_done", "_traffic", "ended", "key", "overlapped")

    def __init__(self, traffic: Traffic, key: str, *, overlapped: bool, ended: int) -> None:
        self._traffic = traffic
        self.key = key
        #: Whether a background summary to the same upstream was in flight at its sending.
        self.overlapped = overlapped
        #: How many such summaries had ended by then.
        self.ended = ended
        self._done = False

    def answered(self) -> None:
        """Its answer's headers are in: it queued behind a summary if one in
        flight at its sending has ended since (see :class:`Traffic`)."""
        self._traffic._answered(self)

    def end(self) -> None:
        """Its answer is over (read, relayed, or cut off). Idempotent."""
        if not self._done:
            self._done = True
            self._traffic._end(self.key)


class _Summary:
    """One background summary in flight, which a user request may cancel."""

    def __init__(self, task: asyncio.Future[str]) -> None:
        self.task = task
        self.gave_way = False

    def give_way(self) -> None:
        self.gave_way = True
        self.task.cancel()


def _count(counts: Counter[str], key: str) -> None:
    """One more for ``key``, the oldest key forgotten past :data:`TRAFFIC_KEYS`."""
    counts[key] += 1
    _forget_oldest(counts)


def _forget_oldest(rows: dict[str, Any]) -> None:
    while len(rows) > TRAFFIC_KEYS:
        del rows[next(iter(rows))]
