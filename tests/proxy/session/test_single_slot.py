"""Background preparation against a server that serves one request at a time
(proxy/session/ahead.py, proxy/upstream/traffic.py: ``Traffic``).

llama.cpp's server has one slot by default: a summary asked ahead of need
there makes the user's next request queue behind it. The proxy runs
in-process in front of a fake upstream that counts the requests it is
serving at once and holds what the test says (the summaries, or one chat
request), so the tests count overlaps and read the event log — never time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import httpx
import pytest

from proxy.session.service import Conversations
from proxy.state.models import calibration_key
from proxy.upstream.discovery import ServerFacts
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy, RecordingTransport
from tests.proxy.servers import FakeUpstream
from tests.proxy.session.conftest import proxy_state
from tests.proxy.summary_upstream import is_summary_request
from tests.synthetic import agent_session

MODEL = "gpt-4o"
#: Past the precompute share of this window's trigger, short of the trigger:
#: each request of ``agent_session(steps=20)`` is forwarded and starts a
#: preparation that asks for a summary.
PROFILE = {"context_window": 32_768, "precompute_share": 0.3, "tool_result_chars": 1_000_000}
DEADLINE = 20.0


class OneSlot(RecordingTransport):
    """The fake upstream, counting the user requests it is asked beside a
    summary (a one-slot server would queue one behind the other); summaries
    are held until ``summaries`` is set, and a chat request while ``chats`` is clear."""

    def __init__(self, upstream: FakeUpstream) -> None:
        super().__init__(app=upstream.app())
        #: Requests that reached it while the other kind was being served:
        #: a user's chat beside a background summary, or the other way round.
        self.beside = 0
        self.summaries_asked = 0
        self.summaries_open = 0
        self.summaries_cancelled = 0
        self.chats_open = 0
        self.summaries: asyncio.Event | None = None
        self.chats: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        #: While clear, a chat answer's body stops after its first chunk.
        self.bodies = asyncio.Event()
        #: Chat answers whose body has not ended, and those held by ``bodies``.
        self.streaming = 0
        self.held = 0

    def gates(self) -> tuple[asyncio.Event, asyncio.Event]:
        """The two gates, made on the app's loop (summaries held, chats open)."""
        if self.summaries is None or self.chats is None:
            self.summaries, self.chats = asyncio.Event(), asyncio.Event()
            self.chats.set()
            self.bodies.set()
            self.loop = asyncio.get_running_loop()
        return self.summaries, self.chats

    def open_all(self) -> None:
        """From the test's thread: let everything held go (so the app can stop)."""
        if self.loop is not None and self.summaries is not None and self.chats is not None:
            self.loop.call_soon_threadsafe(self.summaries.set)
            self.loop.call_soon_threadsafe(self.chats.set)
            self.loop.call_soon_threadsafe(self.bodies.set)

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | AsyncIterator[bytes] | None,
    ) -> Any:
        summaries, chats = self.gates()
        summary = isinstance(body, bytes) and is_summary_request(body)
        if not summary and not url.endswith("/chat/completions"):
            return await super().request(method, url, headers, body)
        if (self.chats_open or self.streaming) if summary else self.summaries_open:
            self.beside += 1
        if summary:
            self.summaries_asked += 1
            self.summaries_open += 1
        else:
            self.chats_open += 1
        try:
            await (summaries if summary else chats).wait()
            response = await super().request(method, url, headers, body)
            if not summary:
                self._hold_body(response)
            return response
        except asyncio.CancelledError:
            self.summaries_cancelled += summary
            raise
        finally:
            if summary:
                self.summaries_open -= 1
            else:
                self.chats_open -= 1

    def _hold_body(self, response: Any) -> None:
        """Count the answer's body as being served until it ends, and hold it
        after its first chunk while ``bodies`` is clear."""
        self.streaming += 1
        inner, chunks = response.next_chunk, 0

        async def next_chunk() -> bytes | None:
            nonlocal chunks
            if chunks and not self.bodies.is_set():
                self.held += 1
                try:
                    await self.bodies.wait()
                finally:
                    self.held -= 1
            try:
                chunk = await inner()
            except BaseException:
                self.streaming -= 1
                raise
            chunks += 1
            if chunk is None:
                self.streaming -= 1
            return chunk

        response.next_chunk = next_chunk


def _state(proxy: InProcessProxy) -> Conversations:
    return proxy_state(proxy)


def _key(proxy: InProcessProxy) -> str:
    return calibration_key(_state(proxy).model_config(MODEL))


def _on_loop(proxy: InProcessProxy, work: Callable[[], Any]) -> Any:
    async def run() -> Any:
        return work()

    return proxy.http.portal.call(run)


def _until(proxy: InProcessProxy, condition: Callable[[], bool], what: str) -> None:
    """Let the app's loop run until ``condition`` holds (a deadline, not a measure)."""

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        while not condition():
            assert loop.time() < deadline, f"never: {what}"
            await asyncio.sleep(0.005)

    proxy.http.portal.call(wait)


def _post(
    proxy: InProcessProxy, seed: int, steps: int = 20, stream: bool = False, task: str | None = None
) -> httpx.Response:
    messages = agent_session(seed=seed, steps=steps, task=task)
    body = {"model": MODEL, "messages": messages, "stream": stream}
    return proxy.http.post("/v1/chat/completions", json=body)


def _posting(
    proxy: InProcessProxy, seed: int, steps: int = 20, stream: bool = False
) -> tuple[threading.Thread, list[httpx.Response]]:
    """:func:`_post` in a thread of its own (the test goes on while it is
    held), and the list its answer will be in."""
    answered: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answered.append(_post(proxy, seed, steps, stream)))
    thread.start()
    return thread, answered


def _events(proxy: InProcessProxy) -> list[dict[str, Any]]:
    response = proxy.http.get("/v1/compaction/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["data"]
    return sorted(events, key=lambda event: event["created_at"])


def _lifecycles(proxy: InProcessProxy) -> list[list[str]]:
    """The event types of each compaction, in order."""
    by_id: dict[str, list[str]] = {}
    for event in _events(proxy):
        by_id.setdefault(event["compaction_id"], []).append(event["type"])
    return list(by_id.values())


def _finish(proxy: InProcessProxy, transport: OneSlot) -> None:
    """Answer the summaries held, and let the preparations end."""
    _on_loop(proxy, lambda: transport.gates()[0].set())
    _until(proxy, lambda: len(_state(proxy).background) == 0, "the preparations end")


@pytest.fixture
def one_slot(fake_upstream: FakeUpstream) -> Iterator[OneSlot]:
    transport = OneSlot(fake_upstream)
    yield transport
    transport.open_all()  # a test that failed holding a request lets it go


def _one_slot_app(start_app: AppFactory, transport: OneSlot, **background: Any) -> InProcessProxy:
    proxy = start_app(transport=transport, models={MODEL: PROFILE}, background=background)
    _on_loop(proxy, transport.gates)
    state = _state(proxy)  # as its /props total_slots says:
    proxy.http.portal.call(
        state.models.server_stated, state.model_config(MODEL), ServerFacts(None, 1)
    )
    return proxy


def test_on_a_one_slot_server_no_background_summary_starts_while_a_user_request_is_in_flight(
    start_app: AppFactory, one_slot: OneSlot
) -> None:
    proxy = _one_slot_app(start_app, one_slot)
    _on_loop(proxy, lambda: one_slot.gates()[1].clear())  # the server is busy with the chat
    sending, answered = _posting(proxy, seed=1)
    key = _key(proxy)
    # The forward started a preparation; it reaches its summary's turn and waits
    # (with the note on the turn's first steps, when that is asked too: one or two wait).
    _until(
        proxy,
        lambda: (
            one_slot.summaries_asked > 0
            or (one_slot.chats_open == 1 and _state(proxy).upstream.traffic.waiting(key) >= 1)
        ),
        "the preparation reaches its summary",
    )
    assert one_slot.summaries_asked == 0, "a summary was asked beside the user's request"

    _on_loop(proxy, lambda: one_slot.gates()[1].set())
    sending.join(DEADLINE)
    assert [a.status_code for a in answered] == [200]
    assert answered[0].headers["x-compaction-stage"] == "none"
    # Once the server is free, the preparation asks.
    _until(proxy, lambda: one_slot.summaries_open >= 1, "the summary is asked once free")
    _finish(proxy, one_slot)

    assert one_slot.beside == 0
    assert ["compaction.queued", "compaction.started", "context.compacted"] in _lifecycles(proxy)


def test_on_a_one_slot_server_a_streamed_answer_holds_back_the_summary_until_its_last_byte(
    start_app: AppFactory, one_slot: OneSlot
) -> None:
    proxy = _one_slot_app(start_app, one_slot)
    _on_loop(proxy, one_slot.bodies.clear)  # the server is still writing the answer
    sending, answered = _posting(proxy, seed=1, stream=True)
    key = _key(proxy)
    # As above: one or two of the preparation's summaries wait for the stream's end.
    _until(
        proxy,
        lambda: (
            one_slot.summaries_asked > 0
            or (one_slot.held == 1 and _state(proxy).upstream.traffic.waiting(key) >= 1)
        ),
        "the preparation reaches its summary",
    )
    assert one_slot.summaries_asked == 0, "a summary was asked beside the streamed answer"

    _on_loop(proxy, one_slot.bodies.set)
    sending.join(DEADLINE)
    assert [a.status_code for a in answered] == [200]
    assert answered[0].text.rstrip().endswith("data: [DONE]")
    _until(proxy, lambda: one_slot.summaries_open >= 1, "the summary is asked once free")
    _finish(proxy, one_slot)
    assert one_slot.beside == 0


def test_on_a_one_slot_server_a_user_request_cancels_the_background_summary_in_flight(
    start_app: AppFactory, one_slot: OneSlot
) -> None:
    proxy = _one_slot_app(start_app, one_slot)
    assert _post(proxy, seed=1).status_code == 200
    _until(proxy, lambda: one_slot.summaries_open >= 1, "the preparation asks its summary")

    # The user's next request is not queued behind the summary: the summary gives way.
    other = _post(proxy, seed=2, steps=3)
    assert other.status_code == 200, other.text
    # The summary, and the note on the turn's first steps asked beside it.
    assert one_slot.summaries_cancelled == one_slot.summaries_asked >= 1
    assert one_slot.beside == 0
    _finish(proxy, one_slot)

    [first, *_] = _lifecycles(proxy)
    assert first == ["compaction.queued", "compaction.started", "compaction.superseded"]
    gave_way = [e for e in _events(proxy) if e["type"] == "compaction.superseded"]
    assert gave_way[0]["background"] and "gave way" in gave_way[0]["error"]
    assert not [e for e in _events(proxy) if e["type"] == "compaction.failed"]


def test_with_single_slot_off_nothing_is_prepared_for_a_one_slot_server(
    start_app: AppFactory, one_slot: OneSlot, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = _one_slot_app(start_app, one_slot, single_slot="off")
    for seed in (1, 2, 3):
        assert _post(proxy, seed=seed).status_code == 200
    _finish(proxy, one_slot)

    assert one_slot.summaries_asked == 0
    assert _events(proxy) == []
    metrics = proxy.http.get("/metrics").text
    assert 'compaction_proxy_background_jobs_total{outcome="single_slot"} 3.0' in metrics
    said = [r for r in caplog.records if "serves one request at a time" in r.getMessage()]
    assert len(said) == 1  # once per upstream, not per request


def test_a_server_seen_queueing_requests_behind_summaries_is_treated_as_one_slot(
    start_app: AppFactory, one_slot: OneSlot
) -> None:
    from proxy.upstream.traffic import SINGLE_SLOT_OVERLAPS

    proxy = start_app(transport=one_slot, models={MODEL: PROFILE})
    _on_loop(proxy, one_slot.gates)
    traffic, key = _state(proxy).upstream.traffic, _key(proxy)
    assert _state(proxy).models.get(key).slots is None  # the server states nothing
    for n in range(SINGLE_SLOT_OVERLAPS):
        assert not traffic.single_slot(key, None)
        # A session of its own each time: one whose pace is measured is
        # prepared only as many turns before its trigger as a summary takes.
        assert _post(proxy, seed=10 + n, task=f"Fix test {n}.").status_code == 200
        _until(proxy, lambda: one_slot.summaries_open >= 1, "a preparation asks its summary")
        # A user request sent while the summary is in flight, answered only
        # after it ended: it queued behind the summary.
        _on_loop(proxy, lambda: one_slot.gates()[1].clear())
        sending, answered = _posting(proxy, seed=50 + n, steps=2)
        _until(proxy, lambda: one_slot.chats_open == 1, "the user's request is sent")
        _finish(proxy, one_slot)
        _on_loop(proxy, lambda: one_slot.gates()[1].set())
        sending.join(DEADLINE)
        assert [a.status_code for a in answered] == [200]
        _until(proxy, lambda: len(_state(proxy).background) == 0, "the preparations end")
        _on_loop(proxy, lambda: one_slot.gates()[0].clear())
    assert traffic.single_slot(key, None)
    assert traffic.overlaps(key) == SINGLE_SLOT_OVERLAPS


class SummariesAtOnce(RecordingTransport):
    """The fake upstream, counting the summaries it is asked at once (each
    held a moment, so two asked together overlap)."""

    def __init__(self, upstream: FakeUpstream) -> None:
        super().__init__(app=upstream.app())
        self.open = 0
        self.most = 0
        self.asked = 0

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | AsyncIterator[bytes] | None,
    ) -> Any:
        if not (isinstance(body, bytes) and is_summary_request(body)):
            return await super().request(method, url, headers, body)
        self.asked += 1
        self.open += 1
        self.most = max(self.most, self.open)
        try:
            await asyncio.sleep(0.05)
            return await super().request(method, url, headers, body)
        finally:
            self.open -= 1


@pytest.mark.parametrize("slots", [1, None], ids=["one slot", "slots unknown"])
def test_on_a_one_slot_server_a_split_turns_two_summaries_are_asked_one_after_the_other(
    start_app: AppFactory, fake_upstream: FakeUpstream, slots: int | None
) -> None:
    # One long turn of tool steps: its compaction asks for the summary and
    # for a note on the turn's first steps, together where the server serves
    # several requests; a one-slot server would queue one behind the other,
    # the second's deadline running out while the first is served.
    transport = SummariesAtOnce(fake_upstream)
    profile = {"context_window": 16_384, "precompute_share": 0, "tool_result_chars": 1_000_000}
    proxy = start_app(transport=transport, models={MODEL: profile})
    if slots is not None:
        state = _state(proxy)
        facts = ServerFacts(None, slots)
        proxy.http.portal.call(state.models.server_stated, state.model_config(MODEL), facts)
    # A first task, then a second one whose long turn the cut lands in.
    second = agent_session(seed=4, steps=40, task="Now make the linter pass.")[1:]
    body = {"model": MODEL, "messages": [*agent_session(seed=3, steps=3), *second]}
    response = proxy.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-stage"] == "condensed"
    assert transport.asked == 2  # the summary, and the turn prefix's note
    assert transport.most == (1 if slots == 1 else 2)
