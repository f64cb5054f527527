"""Noticing a client that leaves while the proxy waits on the upstream.

A chat request without streaming can wait a minute or more for its answer.
If the client gives up meanwhile (its own timeout, Ctrl-C), the upstream
would go on generating — and billing — an answer nobody reads. A
:class:`ClientWatch` cancels the waiting request when its client
disconnects, which closes the upstream connection.

Most answers arrive well within a second, so the watch costs nothing until
then: only a request still waiting after :data:`ARM_AFTER` seconds gets a
task that listens for the disconnect. Once the answer's headers are in, the
relay watches on its own (see ``proxy.flow.relay.Relay``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from starlette.types import Receive

#: Seconds of waiting on the upstream before the client's connection is watched.
ARM_AFTER = 1.0


class ClientWatch:
    """Cancels the current task if the client disconnects inside :meth:`waiting`."""

    def __init__(self, receive: Receive, arm_after: float = ARM_AFTER) -> None:
        self._receive = receive
        self._arm_after = arm_after
        self._listener: asyncio.Task[None] | None = None
        #: True once the client was seen leaving (the request was cancelled for it).
        self.gone = False

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Around an await on the upstream, after the request body was read."""
        task = asyncio.current_task()
        assert task is not None
        timer = asyncio.get_running_loop().call_later(self._arm_after, self._arm, task)
        try:
            yield
        finally:
            timer.cancel()
            if self._listener is not None:
                self._listener.cancel()
                self._listener = None

    def _arm(self, task: asyncio.Task[object]) -> None:
        self._listener = asyncio.ensure_future(self._listen(task))

    async def _listen(self, task: asyncio.Task[object]) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        task.cancel()


def client_left(watch: ClientWatch | None) -> bool:
    """Called on a :class:`asyncio.CancelledError`: whether it came from the
    client leaving (``watch`` saw it go). Then the cancellation is taken back
    — the server is not shutting down, there is only nobody to answer — and
    the caller logs and returns; otherwise it re-raises."""
    if watch is None or not watch.gone:
        return False
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    return True
