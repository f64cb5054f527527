"""Work started by a request that outlives it: the compactions prepared ahead
of need (:mod:`proxy.session.ahead`), each in a task of its own. This module keeps
those tasks:

* **single flight** — at most one task per conversation span in this process
  (:meth:`Background.start` refuses a second); across replicas the task takes
  the store's lock of the span and asks the store again before working;
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
from collections.abc import Coroutine
from typing import Any

logger = logging.getLogger("compaction_proxy.background")


class Background:
    """The running tasks, by the key of the conversation span they prepare."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def running(self, key: str) -> bool:
        return key in self._tasks

    def start(self, key: str, work: Coroutine[Any, Any, None]) -> bool:
        """Run ``work`` unless a task for ``key`` already runs (then ``work`` is closed)."""
        if key in self._tasks:
            work.close()
            return False
        task = asyncio.create_task(work, name=f"background {key[:40]}")
        self._tasks[key] = task
        task.add_done_callback(lambda done: self._finished(key, done))
        return True

    def _finished(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
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
