"""One decision per request: ``compaction.decide`` runs once for each request
the proxy answers, whatever the request needs, with the store asked once
before it; under the single-flight lock the decision stands unless the
store's answer changed. The count is taken at the seam: the ``decide`` that
proxy.session.compacting calls, wrapped by a recorder."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

import proxy.session.compacting
from compaction import (
    Checkpoint,
    Decision,
    Steering,
    TokenCounter,
    calibrated_budget,
    decide,
    session_key,
)
from config import load_settings
from proxy.session.compacting import Job, Ruling, look_up
from proxy.session.conversation import BareRequest, compact_if_needed, identify
from proxy.session.service import Conversations
from proxy.state.observability import Observability
from proxy.state.stores import MemoryStore
from proxy.upstream.service import Upstream
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.session.conftest import figures_written
from tests.synthetic import agent_session

#: No compaction is prepared in the background here: what is counted is the
#: request's own decision (a background job decides on its own input).
MODELS = {"gpt-4o": {"context_window": 8192, "precompute_share": 0}}
KEY = {"authorization": "Bearer sk-alice-0123456789"}


class RecordingDecide:
    """``compaction.decide``, recording the reason of each call."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Decision:
        decision = decide(*args, **kwargs)
        self.reasons.append(decision.reason)
        return decision

    def taken(self) -> list[str]:
        """The reasons decided on since the last call, and forget them."""
        taken, self.reasons = self.reasons, []
        return taken


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingDecide]:
    recording = RecordingDecide()
    monkeypatch.setattr(proxy.session.compacting, "decide", recording)
    yield recording


def _chat(proxy: InProcessProxy, messages: list[dict[str, Any]]) -> dict[str, str]:
    body = {"model": "gpt-4o", "messages": messages}
    response = proxy.http.post("/v1/chat/completions", json=body, headers=KEY)
    assert response.status_code == 200, response.text
    return dict(response.headers)


def _next_turn(messages: list[dict[str, Any]], text: str = "Next?") -> list[dict[str, Any]]:
    return [*messages, {"role": "assistant", "content": "Done."}, {"role": "user", "content": text}]


class CountingLookups(MemoryStore):
    """A memory store counting the lookups of checkpoint chains."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        self.lookups += 1
        return await super().lookup(hashes)

    def lookup_now(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        self.lookups += 1
        return super().lookup_now(hashes)


def test_a_forwarded_request_is_decided_once(
    start_app: AppFactory, decisions: RecordingDecide
) -> None:
    proxy = start_app(models=MODELS)
    # Under its trigger (about 6,000 tokens), but past the third of it below
    # which the decision cannot be anything but a forward (proxy.session.untouched).
    messages = agent_session(seed=1, steps=6, task="Decide once: forward.")
    headers = _chat(proxy, messages)
    assert headers["x-compaction-stage"] == "none"
    assert 2_100 < int(headers["x-compaction-tokens-before"]) < 6_000
    assert decisions.taken() == ["threshold"]


def test_a_small_request_is_forwarded_with_no_decision_and_no_lookup_of_its_chain(
    start_app: AppFactory, decisions: RecordingDecide
) -> None:
    store = CountingLookups()
    proxy = start_app(models=MODELS, store=store)
    messages = agent_session(seed=1, steps=3, task="Decide never: forward.")
    for turn in range(2):  # its first request, then its next turn
        headers = _chat(proxy, messages)
        assert headers["x-compaction-stage"] == "none"
        assert headers["x-compaction-reason"] == "none"
        counted = TokenCounter("gpt-4o").count_request({"messages": messages})
        assert int(headers["x-compaction-tokens-before"]) == counted
        assert int(headers["x-compaction-tokens-after"]) == counted
        messages = _next_turn(messages, f"Turn {turn}?")
    assert decisions.taken() == []
    assert store.lookups == 0


def test_a_compacted_request_and_the_next_over_its_checkpoint_are_decided_once_each(
    start_app: AppFactory, decisions: RecordingDecide
) -> None:
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=2, steps=60, task="Decide once: compact.")
    compacted = _chat(proxy, messages)
    assert compacted["x-compaction-stage"] not in ("none", "reused")
    assert decisions.taken() == ["threshold"]  # the recheck under the lock found no change

    reused = _chat(proxy, _next_turn(messages))
    assert reused["x-compaction-stage"] == "reused"
    assert reused["x-compaction-id"] == compacted["x-compaction-id"]
    assert decisions.taken() == ["threshold"]


def test_a_manual_compact_is_decided_once(
    start_app: AppFactory, decisions: RecordingDecide
) -> None:
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=3, steps=8, task="Decide once: /compact.")
    headers = _chat(proxy, [*messages, {"role": "user", "content": "/compact keep the paths"}])
    assert headers["x-compaction-reason"] == "manual"
    assert decisions.taken() == ["manual"]


def test_a_request_with_session_settings_is_decided_once(
    start_app: AppFactory, decisions: RecordingDecide
) -> None:
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=4, steps=60, task="Decide once: settings.")
    session = session_key(messages)
    _chat(proxy, messages[:2])  # a session is steered once the proxy has seen it
    figures_written(proxy)  # its first figure, written in the background
    assert proxy.http.get(f"/v1/compaction/sessions/{session}", headers=KEY).status_code == 200
    decisions.taken()
    answer = proxy.http.put(
        f"/v1/compaction/sessions/{session}/settings",
        json={"enabled": False, "instructions": "Keep the paths."},
        headers=KEY,
    )
    assert answer.status_code == 200, answer.text
    off = _chat(proxy, messages)  # over the trigger, but switched off
    assert off["x-compaction-stage"] == "none"
    assert decisions.taken() == ["threshold"]

    pending = proxy.http.post(f"/v1/compaction/sessions/{session}/compact", headers=KEY)
    assert pending.status_code == 202
    now = _chat(proxy, _next_turn(messages))  # "compact now" compacts even when off
    assert now["x-compaction-reason"] == "manual"
    assert now["x-compaction-stage"] != "none"
    assert decisions.taken() == ["manual"]


# --- the recheck under the lock ------------------------------------------------


class WaitingSummarizer:
    """Answers once ``count`` decisions were taken: the requests that wait for
    the lock have all asked the store and decided before the first one's
    checkpoint is stored (waiting on the decisions, not on a clock, so a busy
    machine cannot let one of them ask only after the checkpoint is in)."""

    def __init__(self, decisions: RecordingDecide, count: int) -> None:
        self.decisions = decisions
        self.count = count

    async def __call__(self, messages: list[dict[str, Any]], max_tokens: int) -> str:
        for _ in range(10_000):  # bounded: a request that never decides fails the test
            if len(self.decisions.reasons) >= self.count:
                break
            await asyncio.sleep(0.001)
        return (
            "## Goal\nGo on.\n## Progress\n- steps\n## Key Decisions\n- none\n## Next Steps\n- more"
        )


def _state() -> Conversations:
    settings = load_settings(
        None,
        store={"url": "memory://"},
        models={"m": {"context_window": 8192, "precompute_share": 0}},
    )
    return Conversations(settings, MemoryStore(), Upstream(settings), Observability())


def test_concurrent_requests_for_one_compaction_decide_again_only_on_a_changed_answer(
    decisions: RecordingDecide,
) -> None:
    """The first request compacts and stores a checkpoint; the ones that waited
    for its lock find the store's answer changed, a new input: each decides
    once more on it (and forwards over the new checkpoint) — two decisions
    for a waiting request, one for the one that compacted."""
    messages = agent_session(seed=5, steps=60, task="Decide once: concurrent.")
    body = {"model": "m", "messages": messages}

    async def run() -> list[str]:
        state = _state()  # its transport belongs to this loop
        config = state.model_config("m")
        summarizer = WaitingSummarizer(decisions, 3)
        resolved = await asyncio.gather(
            *(
                compact_if_needed(state, BareRequest(body, messages, config), summarizer)
                for _ in range(3)
            )
        )
        await state.upstream.aclose()
        return [r.stage for r in resolved]

    stages = asyncio.run(run())
    assert sorted(stages).count("reused") == 2
    assert len(decisions.taken()) == 3 + 2


def test_an_unchanged_answer_under_the_lock_keeps_the_decision_made_on_it(
    decisions: RecordingDecide,
) -> None:
    messages = agent_session(seed=6, steps=4, task="Decide once: recheck.")

    async def run() -> tuple[Ruling, Ruling]:
        state = _state()  # its transport belongs to this loop
        config = state.model_config("m")
        conversation = identify(state, config, {"model": "m", "messages": messages}, messages)
        job = Job(
            conversations=state,
            conversation=conversation,
            config=config,
            budget=calibrated_budget(config.profile),
            reason="threshold",
            summarizer=None,
            steering=Steering(),
            instructions=None,
            owner="",
        )
        stored = await look_up(state.store, conversation)
        ruling = Ruling(stored, job.decide(stored))
        rechecked = await job.recheck(ruling)
        await state.upstream.aclose()
        return ruling, rechecked

    ruling, rechecked = asyncio.run(run())
    assert rechecked is ruling
    assert len(decisions.taken()) == 1
