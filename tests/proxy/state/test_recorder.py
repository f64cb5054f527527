"""Per-request figures are queued, never awaited: a slow store never delays an answer."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from proxy.state.recorder import Recorder
from proxy.state.stores import MemoryStore, RequestRecord
from tests.proxy.inprocess import RecordingTransport, running, settings_for
from tests.proxy.servers import FakeUpstream
from tests.synthetic import agent_session

pytestmark = pytest.mark.anyio


def record(n: int) -> RequestRecord:
    return RequestRecord(
        session=f"s{n}",
        model="gpt-4o",
        stage="none",
        reason="threshold",
        tokens_before=10,
        tokens_after=10,
        input_limit=100,
        trigger=80,
        status=200,
        ms=1.0,
    )


class BlockedStore(MemoryStore):
    """A store whose figure writes wait until the test lets them through."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()  #: set from the test's thread or loop alike
        self.started = 0
        self.batches: list[list[RequestRecord]] = []

    async def record_requests(self, records: Sequence[RequestRecord]) -> None:
        self.started += 1
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        self.batches.append(list(records))
        await super().record_requests(records)


async def test_a_full_queue_drops_and_counts_instead_of_waiting() -> None:
    store = BlockedStore()
    recorder = Recorder(store, queue_size=2, gather=0)
    for n in range(5):
        recorder.record(record(n))  # synchronous: nothing here can wait
    assert recorder.dropped == 3
    recorder.start()
    store.gate.set()
    await recorder.flush()
    assert [[r.session for r in batch] for batch in store.batches] == [["s0", "s1"]]
    await recorder.stop()


async def test_the_writer_batches_what_queued_while_it_wrote() -> None:
    store = BlockedStore()
    recorder = Recorder(store, gather=0)
    recorder.start()
    recorder.record(record(0))
    while store.started == 0:  # the writer took the first one and is blocked in the store
        await asyncio.sleep(0)
    for n in range(1, 4):
        recorder.record(record(n))
    store.gate.set()
    await recorder.flush()
    assert [len(batch) for batch in store.batches] == [1, 3]
    assert recorder.written == 4
    await recorder.stop()


async def test_figures_gather_into_one_write_until_stop() -> None:
    store = BlockedStore()
    store.gate.set()
    recorder = Recorder(store, gather=3600)  # a pause no test outlives: stop cuts it short
    recorder.start()
    recorder.record(record(0))
    while recorder._queue.qsize():  # the writer took the first and is gathering
        await asyncio.sleep(0)
    for n in range(1, 5):
        recorder.record(record(n))
        await asyncio.sleep(0)
    await recorder.stop()
    assert [len(batch) for batch in store.batches] == [5]


async def test_stop_writes_what_is_queued() -> None:
    store = MemoryStore()
    recorder = Recorder(store)
    recorder.start()
    for n in range(3):
        recorder.record(record(n))
    await recorder.stop()
    assert len(await store.sessions()) == 3


async def test_stop_ends_within_its_grace_when_the_write_ignores_its_cancellation() -> None:
    store = BlockedStore()
    ignored = []

    async def stubborn(records: Sequence[RequestRecord]) -> None:
        # A write that outlives one cancellation (a Redis command on Python 3.11).
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ignored.append(len(records))
            while not store.gate.is_set():
                await asyncio.sleep(0.01)

    store.record_requests = stubborn  # type: ignore[method-assign]
    recorder = Recorder(store, gather=0)
    task = recorder.start()
    recorder.record(record(1))
    async with asyncio.timeout(10):  # a deadline for "it ended", not a measure
        await recorder.stop(grace=0.05)
    assert ignored == [1] and not task.done()  # left behind, not waited on
    store.gate.set()
    task.cancel()  # what the closing loop does to it
    async with asyncio.timeout(10):
        await asyncio.wait({task})


def test_chat_requests_are_answered_while_the_store_is_blocked() -> None:
    # Figures go through a queue: a store stuck writing them holds up no request.
    upstream = FakeUpstream()
    store = BlockedStore()
    settings_sections: dict[str, Any] = {
        "models": {"gpt-4o": {"context_window": 8192}},
        "store": {"url": "memory://", "timeout_seconds": 600},
    }
    settings = settings_for(**settings_sections)
    with running(settings, RecordingTransport(app=upstream.app()), store=store) as proxy:
        messages = agent_session(seed=9, steps=3, task="Recorder test.")

        def chat() -> None:
            response = proxy.http.post(
                f"{proxy.url}/chat/completions",
                json={"model": "gpt-4o", "messages": messages},
            )
            assert response.status_code == 200

        chat()
        deadline = time.monotonic() + 10
        while store.started == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the writer gathers for a second, then writes
        assert store.started == 1  # the writer is inside the store, blocked
        for _ in range(3):
            chat()
        assert store.batches == []  # nothing written yet: no request waited for it
        store.gate.set()


async def test_the_sessions_remembered_as_labelled_are_bounded() -> None:
    store = MemoryStore()
    recorder = Recorder(store, gather=0, labelled_sessions=2)
    recorder.start()
    for n in range(3):
        recorder.record(dataclasses.replace(record(n), task=f"Task {n}."))
    recorder.record(dataclasses.replace(record(3), background=True, task="Ahead."))
    recorder.record(record(4))  # no task: nothing to remember
    await recorder.stop()
    # The oldest went past the bound; a background figure labels nothing.
    assert list(recorder.labelled) == [("", "s1"), ("", "s2")]


def test_a_labelled_sessions_later_requests_are_recorded_without_reading_its_task() -> None:
    # A session keeps the task of its first request (stores.fold): once the
    # store was handed it, a later request of the session is recorded without
    # its first words read again, and the session's label stays the same.
    upstream = FakeUpstream()
    store = BlockedStore()
    store.gate.set()
    settings = settings_for(models={"gpt-4o": {"context_window": 8192}})
    with running(settings, RecordingTransport(app=upstream.app()), store=store) as proxy:
        messages = agent_session(seed=9, steps=3, task="Recorder test: the label.")
        for written in (1, 2):
            response = proxy.http.post(
                f"{proxy.url}/chat/completions", json={"model": "gpt-4o", "messages": messages}
            )
            assert response.status_code == 200
            deadline = time.monotonic() + 10
            while len(store.batches) < written and time.monotonic() < deadline:
                time.sleep(0.05)  # the writer gathers for a second, then writes
        sessions = proxy.http.portal.call(store.sessions)  # type: ignore[union-attr]
    first, later = (batch[0] for batch in store.batches)
    assert first.session == later.session
    assert (first.task, later.task) == ("Recorder test: the label.", "")
    assert [s.label for s in sessions] == ["Recorder test: the label."]
