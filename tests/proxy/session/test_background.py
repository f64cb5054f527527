"""Compactions prepared in the background (proxy/session/background.py).

The proxy runs in-process in front of the fake upstream, and the model's
time is counted in the agent's turns rather than in seconds: a summary asked
for by a preparation is answered once the client has made ``pace`` more
turns (the bench's 4 s summarizer with turns 1 s apart is a pace of 4), or
as soon as a request waits for that preparation. Each turn ends with the
agent's pause: every preparation started has either finished or is waiting
at the summarizer for its answer. What a request waited for is recorded
where it happens (the request path awaiting a running preparation, or
asking the summarizer itself), so the tests count waits and say which
request waited on which preparation, whatever the machine's speed. The
100-turn sessions run on simulated time (:class:`SimulatedClock`): the
session's pace and the summarizer's measured time, which say how far ahead a
preparation starts, are read from it, never from the machine's clock.

The target: over a 100-turn tool session at a 16k window that condenses
several times, at most one turn waits for the summarizer, and the
summarizer is asked at most once per compaction plus one prepared for a
compaction the session ends before needing. A client leaving mid-stream is
about the network, and stays on real servers.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from compaction.summary.prompts import SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT
from proxy.session.background import Background, Start
from proxy.state.prompts import LastPrompts
from proxy.upstream.pace import Paces
from tests.proxy.conftest import AppFactory, ProxyFactory
from tests.proxy.inprocess import InProcessProxy, RecordingTransport
from tests.proxy.servers import FakeUpstream
from tests.proxy.session.conftest import figures_written
from tests.synthetic import shell_step

WINDOW = 16_384
MODEL = "agent-model"
#: No pruning: every compaction of this session condenses, so each needs a summary.
PROFILE = {"context_window": WINDOW, "tool_result_chars": 1_000_000}
#: The agent's turns a summary takes (the bench: a 4 s summarizer, turns 1 s apart).
SUMMARY_TURNS = 4
#: A summary that never comes by the turns alone: only a request waiting for it answers it.
NEVER = 1_000_000
COMPACTED = ("pruned", "condensed", "truncated")

#: The span of the preparation a piece of work belongs to (None: the request path).
_preparing: contextvars.ContextVar[str | None] = contextvars.ContextVar("preparing", default=None)
_SUMMARY_PROMPTS = tuple(
    p.split("\n", 1)[0] for p in (SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT)
)


def _asks_for_a_summary(body: bytes) -> bool:
    try:
        first = orjson.loads(body)["messages"][0]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return False
    return isinstance(first, str) and first.startswith(_SUMMARY_PROMPTS)


@dataclass(frozen=True)
class Wait:
    """A request that awaited a running preparation: its turn, and the preparation's span."""

    turn: int
    span: str


@dataclass
class _Preparation:
    span: str
    #: The turn whose request started it.
    started: int
    #: Set when its summaries may be answered.
    answer: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when it asks the summarizer (it may finish without asking).
    asked: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when it is over, whatever its outcome.
    finished: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Session:
    """The record of a session's turns: what was prepared, waited for and summarized when."""

    #: Turns a preparation's summary takes to answer.
    pace: int = 0
    #: The turn the client is on (0, 1, …).
    turn: int = 0
    preparations: list[_Preparation] = field(default_factory=list)
    #: Requests that awaited a running preparation.
    waits: list[Wait] = field(default_factory=list)
    #: The turns whose request asked the summarizer itself (and waited for it).
    summarized_on_the_path: list[int] = field(default_factory=list)
    #: The spans of the preparations that asked the summarizer.
    summarized_ahead: list[str] = field(default_factory=list)

    def of(self, span: str) -> _Preparation | None:
        found = [p for p in self.preparations if p.span == span]
        return found[-1] if found else None

    @property
    def waited(self) -> list[int]:
        """The turns that waited for the summarizer, one way or the other."""
        return sorted({w.turn for w in self.waits} | set(self.summarized_on_the_path))

    @property
    def summarizations(self) -> int:
        """How many times a summary was asked for: a compaction whose tail starts
        inside a turn asks for two at once (the summary, and a note on the
        turn's first steps), and counts once."""
        return len(set(self.summarized_ahead)) + len(set(self.summarized_on_the_path))


class PacedTransport(RecordingTransport):
    """The recording transport, with a preparation's summaries held until due."""

    def __init__(self, session: Session, upstream: FakeUpstream) -> None:
        super().__init__(app=upstream.app())
        self.session = session

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: Any,
    ) -> Any:
        if isinstance(body, bytes) and _asks_for_a_summary(body):
            span = _preparing.get()
            preparation = self.session.of(span) if span is not None else None
            if preparation is None:
                self.session.summarized_on_the_path.append(self.session.turn)
            else:
                self.session.summarized_ahead.append(preparation.span)
                preparation.asked.set()
                await preparation.answer.wait()
        return await super().request(method, url, headers, body)


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[Session]:
    """The record, kept where preparations start and where requests wait for them."""
    record = Session()
    start, wait = Background.start, Background.wait

    def starting(
        self: Background, key: str, work: Coroutine[Any, Any, None], *, owner: str = ""
    ) -> Start:
        if self.running(key):  # refused: the one running is the preparation
            return start(self, key, work, owner=owner)

        preparation = _Preparation(key, record.turn)

        async def marked() -> None:
            _preparing.set(key)
            try:
                await work
            finally:
                preparation.finished.set()

        started = start(self, key, marked(), owner=owner)
        if started == "started":
            record.preparations.append(preparation)
        else:  # refused for a cap: never run
            work.close()
        return started

    async def waiting(self: Background, key: str) -> None:
        if self.running(key):
            record.waits.append(Wait(record.turn, key))
            preparation = record.of(key)
            if preparation is not None:
                preparation.answer.set()  # the model answers while the request waits
        await wait(self, key)

    monkeypatch.setattr(Background, "start", starting)
    monkeypatch.setattr(Background, "wait", waiting)
    yield record


def _pause(proxy: InProcessProxy, session: Session) -> None:
    """The agent's pause after a turn: the summaries due are answered and their
    preparations finish; every other preparation reaches the summarizer (or
    finishes without it)."""

    async def settle() -> None:
        session.turn += 1
        for preparation in session.preparations:
            if session.turn >= preparation.started + session.pace:
                preparation.answer.set()
            if preparation.answer.is_set():
                await preparation.finished.wait()
                continue
            finished = asyncio.ensure_future(preparation.finished.wait())
            asked = asyncio.ensure_future(preparation.asked.wait())
            await asyncio.wait({finished, asked}, return_when=asyncio.FIRST_COMPLETED)
            for task in (finished, asked):
                task.cancel()

    proxy.http.portal.call(settle)


def _start(task: str = "Make the test suite pass.") -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": task},
    ]


def _post(proxy: InProcessProxy, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": MODEL, "messages": messages}
    response = proxy.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def _turn(
    proxy: InProcessProxy, session: Session, messages: list[dict[str, Any]]
) -> httpx.Response:
    """One turn of the agent: its request, then its pause."""
    response = _post(proxy, messages)
    _pause(proxy, session)
    return response


def _prefix(body: bytes) -> bytes:
    return orjson.dumps(orjson.loads(body)["messages"])[:-1]


def _events(proxy: InProcessProxy) -> list[dict[str, Any]]:
    response = proxy.http.get("/v1/compaction/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["data"]
    return sorted(events, key=lambda event: event["created_at"])


def _paced(
    start_app: AppFactory, upstream: FakeUpstream, session: Session, **profile: Any
) -> InProcessProxy:
    return start_app(
        transport=PacedTransport(session, upstream), models={MODEL: {**PROFILE, **profile}}
    )


def test_a_100_turn_session_waits_for_the_summarizer_at_most_once(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
    session: Session,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream = fake_upstream
    proxy, _ = _simulated(
        start_app, upstream, session, monkeypatch, turn_seconds=SUMMARY_SECONDS / SUMMARY_TURNS
    )
    rng = random.Random(12)
    history = _start()
    stages: list[str] = []
    precomputed: list[str | None] = []
    for i in range(100):
        history.extend(shell_step(rng, i))
        response = _turn(proxy, session, history)
        stages.append(response.headers["x-compaction-stage"])
        precomputed.append(response.headers.get("x-compaction-precomputed"))

    compactions = [i for i, stage in enumerate(stages) if stage in COMPACTED]
    calls = len(upstream.summary_requests)
    prepared = [i for i in compactions if precomputed[i]]
    print(
        f"\n100 turns, summaries {SUMMARY_TURNS} turns long: {len(compactions)} compactions "
        f"at {compactions} ({len(prepared)} prepared ahead), {session.summarizations} "
        f"summarizations ({calls} summarizer calls), turns that waited: {session.waited} "
        f"(on preparations: {session.waits}; summarized on the path: "
        f"{session.summarized_on_the_path})"
    )
    assert len(compactions) >= 4, stages
    assert all(stages[i] == "condensed" for i in compactions), stages
    assert len(session.waited) <= 1, f"turns {session.waited} waited for the summarizer"
    # A request that waited is one that compacted, over what it waited for.
    for wait in session.waits:
        assert wait.turn in compactions
        assert precomputed[wait.turn], f"turn {wait.turn} waited and then summarized again"
    assert session.summarizations <= len(compactions) + 1
    assert calls <= 2 * (len(compactions) + 1)
    assert len(prepared) >= len(compactions) - 1

    # Between compactions the forwarded requests extend each other byte for
    # byte: a prepared compaction changes nothing until it is applied.
    sent = [r.body for r in upstream.chat_requests]
    between = [i for i in range(1, len(sent)) if stages[i] not in COMPACTED]
    broken = [i for i in between if not _prefix(sent[i]).startswith(_prefix(sent[i - 1]))]
    assert not broken, f"requests {broken} changed bytes already forwarded"


#: The seconds a summary takes (the bench's summarizer).
SUMMARY_SECONDS = 4.0


@dataclass
class SimulatedClock:
    """Seconds as the session lives them: ``turn_seconds`` a turn, and the
    rest of a summary's time for a request that waits for one. The proxy's
    clocks — the session's pace, the summarizer's measured time — read it,
    so a preparation's lead is the same on every machine."""

    session: Session
    turn_seconds: float
    waited: float = 0.0
    #: (turn, seconds) of each request that waited for a preparation.
    waits: list[tuple[int, float]] = field(default_factory=list)

    def __call__(self) -> float:
        return self.session.turn * self.turn_seconds + self.waited

    def wait(self, turn: int, seconds: float) -> None:
        self.waits.append((turn, seconds))
        self.waited += seconds

    @property
    def long_waits(self) -> list[int]:
        """The turns that waited a second or more, a summary asked on the
        request path included (the whole summary's time)."""
        waited = [turn for turn, seconds in self.waits if seconds >= 1.0]
        return sorted(waited + self.session.summarized_on_the_path)


class _TimedTransport(PacedTransport):
    """A summary asked on the request path takes its time on the simulated clock too."""

    def __init__(self, session: Session, upstream: FakeUpstream, clock: SimulatedClock) -> None:
        super().__init__(session, upstream)
        self.clock = clock

    async def request(self, method: str, url: str, headers: Mapping[str, str], body: Any) -> Any:
        on_the_path = _preparing.get() is None and isinstance(body, bytes)
        if on_the_path and _asks_for_a_summary(body):
            self.clock.wait(self.session.turn, SUMMARY_SECONDS)
        return await super().request(method, url, headers, body)


def _state(proxy: InProcessProxy) -> Any:
    app = proxy.app
    while not hasattr(app, "state"):
        app = app.app
    return app.state.services


def _simulated(
    start_app: AppFactory,
    upstream: FakeUpstream,
    session: Session,
    monkeypatch: pytest.MonkeyPatch,
    turn_seconds: float,
) -> tuple[InProcessProxy, SimulatedClock]:
    """The paced proxy on a :class:`SimulatedClock` of ``turn_seconds`` a turn,
    summaries of :data:`SUMMARY_SECONDS`."""
    session.pace = round(SUMMARY_SECONDS / turn_seconds)
    clock = SimulatedClock(session, turn_seconds)
    waiting = Background.wait

    async def waited(self: Background, key: str) -> None:
        preparation = session.of(key)
        if self.running(key) and preparation is not None and not preparation.answer.is_set():
            turns_left = max(preparation.started + session.pace - session.turn, 0)
            clock.wait(session.turn, turns_left * turn_seconds)
        await waiting(self, key)

    monkeypatch.setattr(Background, "wait", waited)
    proxy = start_app(transport=_TimedTransport(session, upstream, clock), models={MODEL: PROFILE})
    state = _state(proxy)
    state.conversations.prompts = LastPrompts(clock=clock)
    state.upstream.paces = Paces(clock=clock)
    return proxy, clock


def test_preparations_start_as_early_as_the_measured_summary_time_needs(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
    session: Session,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A summary of 4 s at an agent's 0.4 s a turn is ten turns: preparations
    # started at a fixed share of the trigger (about seven turns before it)
    # had every crossing turn wait about a second. Started from the
    # summarizer's measured time and the session's pace, only the first one
    # waits that long (nothing is measured before it).
    upstream = fake_upstream
    proxy, clock = _simulated(start_app, upstream, session, monkeypatch, turn_seconds=0.4)
    rng = random.Random(12)
    history = _start()
    stages: list[str] = []
    for i in range(100):
        history.extend(shell_step(rng, i))
        stages.append(_turn(proxy, session, history).headers["x-compaction-stage"])

    compactions = [i for i, stage in enumerate(stages) if stage in COMPACTED]
    print(
        f"\n{len(compactions)} compactions at {compactions}; waits (turn, s): {clock.waits}; "
        f"{session.summarizations} summarizations; preparations started at "
        f"{[p.started for p in session.preparations]}"
    )
    assert len(compactions) >= 4, stages
    assert len(clock.long_waits) <= 1, f"turns {clock.waits} waited for the summarizer"
    # A summary made is used: one per compaction, and at most one more, made
    # for a compaction the session ends before needing.
    assert session.summarizations <= len(compactions) + 1


def _into_the_zone(
    proxy: InProcessProxy,
    session: Session,
    rng: random.Random,
    history: list[dict[str, Any]],
) -> None:
    """Grow ``history`` a turn at a time until a preparation asks the
    summarizer (one more than before)."""
    asked = len(set(session.summarized_ahead))
    for i in range(200):
        history.extend(shell_step(rng, len(history) + i))
        _turn(proxy, session, history)
        if len(set(session.summarized_ahead)) > asked:
            return
    raise AssertionError("the conversation never came near its trigger")


def _over_the_trigger(
    proxy: InProcessProxy, session: Session, rng: random.Random, history: list[dict[str, Any]]
) -> httpx.Response:
    for i in range(200):
        history.extend(shell_step(rng, len(history) + i))
        response = _turn(proxy, session, history)
        if response.headers["x-compaction-stage"] in COMPACTED:
            return response
    raise AssertionError("the conversation never crossed its trigger")


def _prepared(proxy: InProcessProxy) -> bool:
    return any(e["type"] == "context.compacted" and e["background"] for e in _events(proxy))


def _prepared_session(
    start_app: AppFactory, upstream: FakeUpstream, session: Session, seed: int
) -> tuple[InProcessProxy, random.Random, list[dict[str, Any]]]:
    """A session grown until the proxy prepared its next compaction (summaries
    numbered: ``(summary #1)`` is the prepared one); summaries answer at once."""
    upstream.summary_text += "\n- (summary #{call})"
    proxy = _paced(start_app, upstream, session)
    rng = random.Random(seed)
    history = _start()
    _into_the_zone(proxy, session, rng, history)
    assert _prepared(proxy)
    return proxy, rng, history


def test_background_work_is_logged_like_foreground_and_applied_at_the_trigger(
    start_app: AppFactory, fake_upstream: FakeUpstream, session: Session
) -> None:
    upstream = fake_upstream
    proxy, rng, history = _prepared_session(start_app, upstream, session, 3)
    background = [e for e in _events(proxy) if e["background"]]
    assert [e["type"] for e in background] == [
        "compaction.queued",
        "compaction.started",
        "context.compacted",
    ]
    assert len(upstream.summary_requests) == 1
    response = _over_the_trigger(proxy, session, rng, history)

    assert response.headers["x-compaction-stage"] == "condensed"
    assert response.headers["x-compaction-precomputed"] == background[-1]["checkpoint_id"]
    assert len(upstream.summary_requests) == 1, "the model was asked twice for one compaction"
    assert session.waits == [] and session.summarized_on_the_path == []  # it was ready
    foreground = [e for e in _events(proxy) if not e["background"]]
    assert [e["type"] for e in foreground][-1] == "context.compacted"
    # The summary prepared ahead is what the upstream received.
    assert "(summary #1)" in upstream.chat_requests[-1].body.decode()


def test_a_prepared_compaction_of_an_edited_history_is_never_applied(
    start_app: AppFactory, fake_upstream: FakeUpstream, session: Session
) -> None:
    upstream = fake_upstream
    proxy, rng, history = _prepared_session(start_app, upstream, session, 4)
    stale = [e for e in _events(proxy) if e["type"] == "context.compacted"][-1]
    # The client rewrites an early step (an edited history, a rewind).
    history[3] = {**history[3], "content": "Step 0 was redone differently."}
    response = _over_the_trigger(proxy, session, rng, history)

    assert response.headers["x-compaction-stage"] == "condensed"
    # What is applied was prepared for the edited history (or made now), never the stale one.
    assert response.headers.get("x-compaction-precomputed") != stale["checkpoint_id"]
    forwarded = upstream.chat_requests[-1].body.decode()
    assert "(summary #1)" not in forwarded, "the stale summary was applied"
    assert "(summary #2)" in forwarded
    assert "Step 0 was redone differently." in upstream.summary_prompts[-1]
    assert len(upstream.summary_requests) == 2


def test_the_crossing_turn_waits_for_a_preparation_in_flight_rather_than_asking_twice(
    start_app: AppFactory, fake_upstream: FakeUpstream, session: Session
) -> None:
    upstream = fake_upstream
    session.pace = NEVER  # the preparation's summary comes only once a request waits for it
    proxy = _paced(start_app, upstream, session)
    rng = random.Random(5)
    history = _start()
    _into_the_zone(proxy, session, rng, history)
    assert not _prepared(proxy)
    [in_flight] = [p for p in session.preparations if p.asked.is_set()]
    response = _over_the_trigger(proxy, session, rng, history)

    assert response.headers["x-compaction-stage"] == "condensed"
    assert response.headers.get("x-compaction-precomputed")
    # The crossing turn, and it alone, waited: on the preparation in flight.
    assert session.waits == [Wait(session.turn - 1, in_flight.span)]
    assert session.summarized_on_the_path == []
    assert len(upstream.summary_requests) == 1


def test_a_summary_edited_after_a_preparation_is_not_lost_to_it(
    start_app: AppFactory, fake_upstream: FakeUpstream, session: Session
) -> None:
    upstream = fake_upstream
    proxy, rng, history = _prepared_session(start_app, upstream, session, 9)
    first = _over_the_trigger(proxy, session, rng, history)
    in_use = first.headers["x-compaction-id"]
    # The next compaction is prepared over the summary in use…
    _into_the_zone(proxy, session, rng, history)
    prepared = [e for e in _events(proxy) if e["background"] and e["type"] == "context.compacted"]
    assert len(prepared) == 2
    stale = [e for e in _events(proxy) if e["type"] == "context.compacted"][-1]
    # …then the user corrects that summary.
    edit = proxy.http.put(
        f"/v1/compaction/checkpoints/{in_use}", json={"summary": "EDITED BY HAND"}
    )
    assert edit.status_code == 200, edit.text
    asked = len(upstream.summary_prompts)
    response = _over_the_trigger(proxy, session, rng, history)

    assert response.headers.get("x-compaction-precomputed") != stale["checkpoint_id"]
    # The summary made since folds in the edited text (a turn's note, asked
    # at the same time, may arrive after it).
    assert any("EDITED BY HAND" in prompt for prompt in upstream.summary_prompts[asked:])


@pytest.mark.parametrize("ahead", [True, False], ids=["prepared", "on-the-request-path"])
def test_the_dashboard_counts_what_summaries_cost_and_no_request_for_a_preparation(
    start_app: AppFactory, fake_upstream: FakeUpstream, session: Session, ahead: bool
) -> None:
    upstream = fake_upstream
    if ahead:
        proxy, rng, history = _prepared_session(start_app, upstream, session, 10)
    else:
        proxy = _paced(start_app, upstream, session, precompute_share=0)
        rng, history = random.Random(10), _start()
    _over_the_trigger(proxy, session, rng, history)
    asked = upstream.summary_requests
    # What the fake upstream's usage said each summary cost: its prompt count + 5.
    cost = sum((r.prompt_tokens or 0) + 5 for r in asked)
    sent = len(upstream.chat_requests)

    figures_written(proxy)
    answer = proxy.http.get("/v1/compaction/sessions").json()
    [totals] = answer["data"]
    assert totals["summarizer_calls"] == len(asked) >= 1
    assert totals["summarizer_tokens"] == cost > 0
    assert totals["requests"] == sent  # the preparation is no request
    assert (session.summarized_on_the_path == []) is ahead


# --- a client that leaves: the network is the point -----------------------------------


def _real_events(url: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/compaction/events", params={"limit": 1000}, timeout=10)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["data"]
    return events


def test_a_client_leaving_does_not_cancel_the_preparation(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, _ = fake
    upstream.summary_delay = 0.5
    upstream.chunk_delay = 0.05
    url = start_proxy(models={MODEL: PROFILE})

    def abandon(history: list[dict[str, Any]]) -> None:
        """A streamed turn the client leaves after the first chunk."""
        body = {"model": MODEL, "messages": history, "stream": True}
        with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as stream:
            next(stream.iter_bytes())

    rng, history = random.Random(6), _start()
    for i in range(200):  # until a preparation asks the summarizer
        history.extend(shell_step(rng, len(history) + i))
        abandon(history)
        time.sleep(0.05)  # the agent's own pause; the preparation starts meanwhile
        if upstream.summary_requests:
            break
    else:
        raise AssertionError("the conversation never came near its trigger")

    def prepared() -> bool:
        return any(e["type"] == "context.compacted" and e["background"] for e in _real_events(url))

    deadline = time.monotonic() + 20
    while not prepared():  # the summary answers after its delay, the client long gone
        assert time.monotonic() < deadline, "the preparation never finished"
        time.sleep(0.02)
    assert len(upstream.summary_requests) == 1
