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
        task.add_done_callback(lambda done: self._forget(key, done))
        return outcome

    def _admit(self, key: str, owner: str) -> Start:
        if key in self._tasks:
            return "running"
        if len(self._tasks) >= self._max_running:
            return "at_capacity"
        if self._per_owner[owner] >= self._max_per_owner:
            return "owner_at_capacity"
        return "started"

    def _forget(self, key: str, task: asyncio.Task[None]) -> None:
        """A task that ended: its slot freed, its failure logged."""
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
