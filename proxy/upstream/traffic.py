"""What each upstream is serving now, counted where requests are sent.

A server with one slot (llama.cpp's default) answers one request at a time:
a background summary there makes the user's next request queue behind it.
:class:`Traffic` counts the user requests in flight and the background
summaries per upstream and model (by
:func:`proxy.state.models.calibration_key`); :meth:`Sending.answered` wraps an
answer so its end (its last byte relayed, not its headers) ends the count.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import Counter
from collections.abc import Coroutine
from typing import Any, Literal

from proxy.upstream.transport import UpstreamResponse

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

    async def begin(self, key: str, *, stated: int | None) -> Sending:
        """A user request to ``key``'s upstream is about to be sent: counted in
        flight until :meth:`Sending.end`. On a one-slot upstream
        (:meth:`single_slot`, ``stated`` the slots it states) the background
        summaries in flight are cancelled first, and waited for, so the
        request is not queued behind one; with none in flight (most
        requests) the question is not asked."""
        in_flight = list(self._summaries.get(key, ()))
        if in_flight and self.single_slot(key, stated):
            for summary in in_flight:
                summary.give_way()
            await asyncio.wait([s.task for s in in_flight])
        self._requests[key] += 1
        return Sending(self, key, overlapped=bool(in_flight), ended=self._ended[key])

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

    __slots__ = ("_done", "_finalizer", "_traffic", "ended", "key", "overlapped")

    def __init__(self, traffic: Traffic, key: str, *, overlapped: bool, ended: int) -> None:
        self._traffic = traffic
        self.key = key
        #: Whether a background summary to the same upstream was in flight at its sending.
        self.overlapped = overlapped
        #: How many such summaries had ended by then.
        self.ended = ended
        self._done = False
        #: Ends the count if its answer is collected before (see :meth:`answered`).
        self._finalizer: weakref.finalize[[], UpstreamResponse] | None = None

    def answered(self, response: UpstreamResponse) -> UpstreamResponse:
        """Its answer's headers are in: it queued behind a summary if one in
        flight at its sending has ended since (see :class:`Traffic`). The
        answer is returned counted: its end (read to its end, released or
        aborted — every answer is, a stream's once relayed) ends this
        request's count, since a stream keeps a one-slot server busy until
        its last byte, not just until its headers (the answer's ``on_end``)."""
        traffic = self._traffic
        if self.overlapped and traffic._ended[self.key] > self.ended:
            _count(traffic._overlaps, self.key)
        response.on_end = self.end
        # An answer dropped unreleased (a bug) must not hold the count forever.
        # A finalizer, not a weak reference with a callback: the finalizers'
        # registry keeps it alive, so it runs even when the answer is collected
        # in a reference cycle (an exception's traceback holding it, the likely
        # bug), where a weak reference held by this Sending would be collected
        # with it, its callback never called. The count's end detaches it.
        self._finalizer = weakref.finalize(response, self.end)
        return response

    def end(self) -> None:
        """Its answer is over (read, relayed, or cut off). Idempotent."""
        if self._done:
            return
        self._done = True
        finalizer = self._finalizer
        if finalizer is not None:
            self._finalizer = None
            finalizer.detach()  # nothing left to run when the answer is collected
        requests, key = self._traffic._requests, self.key
        requests[key] -= 1
        if requests[key] <= 0:
            del requests[key]
            for waiter in self._traffic._quiet.pop(key, []):
                if not waiter.done():
                    waiter.set_result(None)


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
