"""ResilientStore: a store that fails or hangs degrades, it never fails the caller."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest

from proxy.state.stores import (
    FailureKind,
    MemoryStore,
    ResilientStore,
    Store,
    StoreHealth,
    StoreUnavailable,
)
from proxy.state.stores.health import LOG_EVERY, PAUSE_AFTER_TIMEOUT
from tests.proxy.state.stores.test_contract import ORIGINALS, checkpoint, event

pytestmark = pytest.mark.anyio


class FaultyStore:
    """A memory store whose calls fail or hang on demand; records what reached it."""

    tracks_liveness = False

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.fault: str | None = None  #: None, "error" or "hang"
        self.calls: list[str] = []
        self.cancelled: list[str] = []

    async def _fault(self, name: str) -> None:
        self.calls.append(name)
        if self.fault == "error":
            raise OSError(28, "No space left on device: /secret/path")
        if self.fault == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise

    #: What ``lookup_now`` does: "ask" (answer None, as a remote store does),
    #: "know" (the memory store's answer) or "raise".
    now = "ask"

    def lookup_now(self, hashes: list[str]) -> Any:
        if self.now == "raise":
            raise OSError(5, "Input/output error")
        return self.inner.lookup_now(hashes) if self.now == "know" else None

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name == "lock":
            return self._lock

        async def call(*args: Any, **kwargs: Any) -> Any:
            await self._fault(name)
            return await method(*args, **kwargs)

        return call

    @contextlib.asynccontextmanager
    async def _lock(self, key: str, ttl: float) -> AsyncIterator[None]:
        await self._fault("lock")
        async with self.inner.lock(key, ttl):
            yield
        await self._fault("unlock")


class Recorder:
    """The observer: what the metrics would count."""

    def __init__(self) -> None:
        self.failed: list[tuple[str, FailureKind]] = []
        self.calls: list[str] = []
        self.at_once: list[str] = []

    def store_call(self, operation: str, seconds: float) -> None:
        self.calls.append(operation)

    def store_answered_at_once(self, operation: str) -> None:
        self.at_once.append(operation)

    def store_failed(self, operation: str, kind: FailureKind) -> None:
        self.failed.append((operation, kind))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guarded(
    faulty: FaultyStore, clock: Callable[[], float] | None = None, timeout: float = 5.0
) -> tuple[ResilientStore, Recorder]:
    recorder = Recorder()
    health = StoreHealth(clock=clock) if clock is not None else StoreHealth()
    store = ResilientStore(cast(Store, faulty), timeout=timeout, health=health, observer=recorder)
    return store, recorder


async def test_a_failing_store_degrades_the_request_path_and_recovers() -> None:
    faulty = FaultyStore()
    store, recorder = guarded(faulty)
    made = checkpoint()
    await faulty.inner.put(made, ORIGINALS)
    faulty.fault = "error"

    assert await store.lookup(["h1"]) == {}  # compacted afresh
    await store.put(checkpoint("h2"), ORIGINALS)
    await store.add_event(event("c1"))
    await store.set_learned_window("m", 1000)
    await store.set_calibration("k", 1.1)
    await store.heartbeat("me", 30)
    assert await store.fail_interrupted("me") == 0
    assert await store.purge() == 0

    report = store.health.report()
    assert not report.ok
    assert (report.operation, report.error, report.failed_calls) == ("lookup", "OSError", 8)
    assert report.to_dict()["status"] == "degraded"
    assert recorder.failed[0] == ("lookup", "error") and len(recorder.failed) == 8
    assert await faulty.inner.lookup(["h2"]) == {}  # nothing was written

    faulty.fault = None
    assert await store.lookup(["h1"]) == {"h1": made}
    assert not store.health.report().ok  # a full disk still reads: not yet
    await store.heartbeat("me", 30)  # a no-op here: proves nothing either
    assert not store.health.report().ok
    await store.add_event(event("c2"))
    assert store.health.report().to_dict() == {"status": "ok"}


async def test_readers_that_must_know_are_told_the_store_is_unavailable() -> None:
    faulty = FaultyStore()
    store, _ = guarded(faulty)
    faulty.fault = "error"
    readers = (
        lambda: store.get("id"),
        lambda: store.originals("id"),
        lambda: store.events(),
        store.learned_windows,
        store.calibrations,
    )
    for read in readers:
        with pytest.raises(StoreUnavailable) as caught:
            await read()
        assert isinstance(caught.value.__cause__, OSError)


async def test_a_hung_call_is_abandoned_and_the_store_left_alone_for_a_while() -> None:
    faulty, clock = FaultyStore(), Clock()
    store, recorder = guarded(faulty, clock, timeout=0.05)
    faulty.fault = "hang"

    assert await store.lookup(["h1"]) == {}
    assert faulty.cancelled == ["lookup"]  # abandoned, not left running
    assert recorder.failed == [("lookup", "timeout")]
    assert store.health.report().error == "timeout"

    # The rest of the request does not wait on the hung store again.
    async with store.lock("span", ttl=10):
        await store.add_event(event("c1"))
        await store.put(checkpoint())
    assert faulty.calls == ["lookup"]
    assert recorder.failed[1:] == [
        ("lock", "skipped"),
        ("add_event", "skipped"),
        ("put", "skipped"),
    ]

    clock.now += PAUSE_AFTER_TIMEOUT
    faulty.fault = None
    assert await store.lookup(["h1"]) == {}
    assert faulty.calls == ["lookup", "lookup"]
    assert store.health.report().ok


async def test_the_probe_asks_a_store_that_is_being_left_alone() -> None:
    faulty, clock = FaultyStore(), Clock()
    store, _ = guarded(faulty, clock, timeout=0.05)
    faulty.fault = "hang"
    await store.lookup(["h1"])
    assert not await store.probe()
    faulty.fault = None
    assert await store.probe()  # within the pause
    assert store.health.report().ok
    assert await store.lookup(["h1"]) == {}
    assert faulty.calls == ["lookup", "learned_windows", "learned_windows", "lookup"]


async def test_failures_are_logged_once_per_burst_by_type_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    faulty, clock = FaultyStore(), Clock()
    store, _ = guarded(faulty, clock)
    caplog.set_level(logging.INFO, logger="compaction_proxy.store")
    faulty.fault = "error"
    for _ in range(5):
        await store.put(checkpoint(), ORIGINALS)
    faulty.fault = None
    await store.put(checkpoint(), ORIGINALS)
    faulty.fault = "error"  # flapping: a new failure soon after is not logged again
    await store.add_event(event("c1"))
    clock.now += LOG_EVERY
    await store.add_event(event("c2"))

    lines = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert [level for level, _ in lines] == [logging.ERROR, logging.WARNING, logging.ERROR]
    assert "OSError in put" in lines[0][1]
    assert "after 5 failed call(s)" in lines[1][1]
    assert "6 failure(s) since the last report" in lines[2][1]  # 4 puts, 2 events
    text = caplog.text
    assert "No space" not in text and "/secret/path" not in text
    assert "summary" not in text and "question" not in text


async def test_a_lock_that_cannot_be_taken_lets_the_caller_in() -> None:
    faulty = FaultyStore()
    store, recorder = guarded(faulty)
    faulty.fault = "error"
    entered = []
    async with store.lock("span", ttl=10):
        entered.append(True)
    assert entered == [True]
    assert recorder.failed == [("lock", "error")]
    with pytest.raises(RuntimeError, match="summarizer"):  # the body's own error stays
        async with store.lock("span", ttl=10):
            raise RuntimeError("summarizer failed")


async def test_a_lock_whose_release_fails_does_not_fail_the_caller() -> None:
    faulty = FaultyStore()
    store, recorder = guarded(faulty)
    async with store.lock("span", ttl=10):
        faulty.fault = "error"  # the store fails while the lock is held
    assert recorder.failed == [("unlock", "error")]
    assert not store.health.report().ok


async def test_a_bad_ratio_is_the_callers_mistake_not_the_stores() -> None:
    store, recorder = guarded(FaultyStore())
    with pytest.raises(ValueError):
        await store.set_calibration("k", math.nan)
    assert recorder.failed == [] and store.health.report().ok


# -- deadlines that hold whatever the backend does ------------------------------------


class Stubborn:
    """A backend call that ignores its first cancellation (as a Redis command's
    socket write does on Python 3.11, in ``asyncio.wait_for``) and goes on
    until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.ignored = 0
        self.ended = False

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            while True:
                try:
                    await self.release.wait()
                    return {}
                except asyncio.CancelledError:
                    if self.ignored:
                        raise
                    self.ignored += 1
        finally:
            self.ended = True


async def test_a_call_that_ignores_its_cancellation_is_still_answered_on_time() -> None:
    faulty, clock = FaultyStore(), Clock()
    store, recorder = guarded(faulty, clock, timeout=0.05)
    stubborn = Stubborn()
    faulty.lookup = stubborn  # type: ignore[attr-defined]

    async with asyncio.timeout(10):  # a deadline for "it answered", not a measure
        assert await store.lookup(["h1"]) == {}  # compacted afresh
    assert stubborn.ignored == 1 and not stubborn.ended  # the call goes on behind
    assert recorder.failed == [("lookup", "timeout")]
    assert store.health.report().error == "timeout"

    await store.close()  # cancels what was left behind, again
    async with asyncio.timeout(10):
        while not stubborn.ended:
            await asyncio.sleep(0)


async def test_closing_a_store_that_ignores_its_cancellation_ends_on_time() -> None:
    faulty = FaultyStore()
    store, _ = guarded(faulty, timeout=0.05)
    stubborn = Stubborn()
    faulty.close = stubborn  # type: ignore[attr-defined]
    async with asyncio.timeout(10):
        await store.close()
    assert stubborn.ignored == 1 and not stubborn.ended
    stubborn.release.set()


class _HeldElsewhere:
    """A lock another holder keeps for the whole test."""

    def __init__(self, inner: MemoryStore, key: str) -> None:
        self.inner, self.key = inner, key
        self.holding = asyncio.Event()
        self.done = asyncio.Event()

    async def hold(self) -> None:
        async with self.inner.lock(self.key, ttl=60):
            self.holding.set()
            await self.done.wait()


async def test_a_lock_held_past_its_wait_lets_the_caller_in_as_busy() -> None:
    faulty = FaultyStore()
    recorder = Recorder()
    store = ResilientStore(cast(Store, faulty), timeout=5.0, observer=recorder, lock_wait=0.05)
    other = _HeldElsewhere(faulty.inner, "span")
    holder = asyncio.create_task(other.hold())
    await other.holding.wait()

    entered = []
    async with asyncio.timeout(10):
        async with store.lock("span", ttl=60):
            entered.append(True)
    assert entered == [True]
    assert recorder.failed == [("lock", "busy")]
    assert store.health.report().ok  # waiting on a live holder is no store failure
    other.done.set()
    await holder


async def test_a_lock_taken_after_its_caller_gave_up_is_released() -> None:
    inner = MemoryStore()
    release_taking = asyncio.Event()

    class LateLock:
        """Taking it ignores the cancellation and succeeds once told to."""

        tracks_liveness = False

        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        @contextlib.asynccontextmanager
        async def lock(self, key: str, ttl: float) -> AsyncIterator[None]:
            try:
                await release_taking.wait()
            except asyncio.CancelledError:
                await release_taking.wait()  # ignored: it takes the lock anyway
            async with inner.lock(key, ttl):
                yield

    recorder = Recorder()
    store = ResilientStore(cast(Store, LateLock()), timeout=5.0, observer=recorder, lock_wait=0.05)
    async with asyncio.timeout(10):
        async with store.lock("span", ttl=60):
            pass  # in without the lock
    assert recorder.failed == [("lock", "busy")]

    release_taking.set()  # the abandoned taking now gets the lock …
    async with asyncio.timeout(10), inner.lock("span", ttl=60):
        pass  # … and lets it go at once, so another may take it


async def test_a_lookup_the_backend_knows_at_once_is_no_store_call() -> None:
    faulty = FaultyStore()
    store, recorder = guarded(faulty)
    made = checkpoint()
    await faulty.inner.put(made, ORIGINALS)
    faulty.now = "know"
    faulty.fault = "error"  # the call would fail: it is not made

    assert await store.lookup(["h1", "other"]) == {"h1": made}
    assert faulty.calls == [] and recorder.calls == [] and recorder.failed == []
    assert recorder.at_once == ["lookup"]  # counted apart from the calls' latency


async def test_a_backend_that_fails_to_answer_at_once_is_asked_the_usual_way() -> None:
    faulty = FaultyStore()
    store, recorder = guarded(faulty)
    made = checkpoint()
    await faulty.inner.put(made, ORIGINALS)
    faulty.now = "raise"

    assert store.lookup_now(["h1"]) is None
    assert await store.lookup(["h1"]) == {"h1": made}
    assert faulty.calls == ["lookup"] and recorder.calls == ["lookup"] and recorder.at_once == []
