"""proxy.edge.disconnect.ClientWatch with a scripted ASGI receive."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.edge.disconnect import ClientWatch


class _Receive:
    """An ASGI receive whose disconnect arrives when the test says so."""

    def __init__(self) -> None:
        self.calls = 0
        self.left = asyncio.Event()

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        await self.left.wait()
        return {"type": "http.disconnect"}


def test_a_quick_answer_never_listens() -> None:
    async def run() -> int:
        receive = _Receive()
        watch = ClientWatch(receive, arm_after=0.05)
        with watch.waiting():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.08)  # past arm_after: the timer was cancelled
        return receive.calls

    assert asyncio.run(run()) == 0


def test_a_client_leaving_a_slow_answer_cancels_the_wait() -> None:
    async def run() -> tuple[bool, bool]:
        receive = _Receive()
        watch = ClientWatch(receive, arm_after=0.02)
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, receive.left.set)
        finished = False
        with pytest.raises(asyncio.CancelledError), watch.waiting():
            await asyncio.sleep(10)
            finished = True  # only if the wait was not cancelled
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        return watch.gone, finished

    gone, finished = asyncio.run(run())
    assert gone and not finished  # the wait was cut short by the client leaving


def test_the_listener_stops_with_the_wait() -> None:
    async def run() -> tuple[bool, int]:
        receive = _Receive()
        watch = ClientWatch(receive, arm_after=0.01)
        with watch.waiting():
            await asyncio.sleep(0.05)  # armed: listening
        receive.left.set()  # the client leaves after the answer came
        await asyncio.sleep(0.02)
        return watch.gone, receive.calls

    gone, calls = asyncio.run(run())
    assert calls == 1 and not gone
