"""Per-request figures, written off the request path.

    recorder = Recorder(store)
    task = recorder.start()          # in the app's lifespan
    recorder.record(RequestRecord(…))  # on the request path: never waits, never raises
    await recorder.stop(grace=2.0)   # writes what is queued (for up to 2 s), then ends

A request hands its figures to a bounded queue and goes on; one background
task drains the queue into the store in batches, gathering for a second
before each write (:data:`GATHER_SECONDS`), so a busy proxy writes once a
second rather than once a request. When
the store is slower than the traffic and the queue is full, a figure is
dropped and counted (:attr:`Recorder.dropped`) rather than making a request
wait: the dashboard may miss a point, a user never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from proxy.state.stores import FigureStore, RequestRecord

logger = logging.getLogger("compaction_proxy.recorder")

#: Figures waiting to be written; past this they are dropped.
QUEUE_SIZE: Final = 10_000
#: Figures written in one store call.
BATCH_SIZE: Final = 500
#: Seconds :meth:`Recorder.stop` gives the last writes at most, by default.
STOP_GRACE_SECONDS: Final = 5.0
#: Seconds the writer lets figures gather before a write: one write a second,
#: not one a request. A write is a thread hop and a transaction; at one per
#: request it cost the chat path ~0.3 ms on the bench (the proxy on one core).
GATHER_SECONDS: Final = 1.0
#: Sessions remembered as labelled (their task written); past this the
#: longest remembered is forgotten, and labelled again by its next request.
LABELLED_SESSIONS: Final = 10_000


class Recorder:
    """The bounded queue between the request path and the store."""

    def __init__(
        self,
        store: FigureStore,
        *,
        queue_size: int = QUEUE_SIZE,
        gather: float = GATHER_SECONDS,
        labelled_sessions: int = LABELLED_SESSIONS,
    ) -> None:
        self._store = store
        self._gather = gather
        self._closing = asyncio.Event()  #: cuts a gathering pause short at shutdown
        self._queue: asyncio.Queue[RequestRecord] = asyncio.Queue(maxsize=queue_size)
        self._task: asyncio.Task[None] | None = None
        #: Figures dropped because the queue was full.
        self.dropped = 0
        #: Figures handed to the store (whether it kept them is its business).
        self.written = 0
        #: (owner, session) of the sessions whose task the store was handed: a
        #: session keeps its first task (:func:`proxy.state.stores.fold`), so
        #: the request path need not read its later requests' first words.
        self.labelled: dict[tuple[str, str], None] = {}
        self._labelled_sessions = labelled_sessions

    def record(self, record: RequestRecord) -> None:
        """Queue ``record`` for the writer; dropped (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                logger.warning("dropped %d per-request figures: the store is behind", self.dropped)

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self._drain(), name="compaction-recorder")
        return self._task

    async def flush(self) -> None:
        """Wait until everything queued so far is written (shutdown; at most a
        gathering pause later than without it)."""
        await self._queue.join()

    async def stop(self, *, grace: float = STOP_GRACE_SECONDS) -> None:
        """Write what is queued, then end the writer: ``grace`` seconds in all,
        whatever the store does (what is not written by then is dropped; a
        write that ignores its cancellation is left behind, not waited on)."""
        task = self._task
        if task is None:
            return
        self._task = None
        self._closing.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), timeout=grace)
        task.cancel()
        await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
        if not task.done():
            logger.warning("the figures' writer did not end at shutdown; left behind")

    async def _drain(self) -> None:
        while True:
            batch = [await self._queue.get()]
            if self._gather > 0 and self._queue.qsize() < BATCH_SIZE:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self._gather)
            while len(batch) < BATCH_SIZE and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._store.record_requests(batch)
                self.written += len(batch)
                labelled = self.labelled
                for record in batch:
                    if record.task and not record.background:
                        labelled[record.owner, record.session] = None
                while len(labelled) > self._labelled_sessions:
                    del labelled[next(iter(labelled))]
            except Exception:  # the resilient store degrades; anything else is logged
                logger.warning("could not write %d per-request figure(s)", len(batch))
            finally:
                for _ in batch:
                    self._queue.task_done()
