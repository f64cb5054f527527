"""proxy.session.conversation: checkpoints applied, single flight, and the progress guard."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest

import proxy.session.compacting
from compaction import SUMMARY_MARKER, Checkpoint, TokenCounter, encoding_for_model, execute
from compaction.chat.groups import group_messages
from compaction.conversation.checkpoints import chain_hashes, session_key
from config import load_settings
from proxy.session.conversation import BareRequest, compact_if_needed, identify
from proxy.session.service import Conversations
from proxy.state.observability import Observability
from proxy.state.stores import MemoryStore
from proxy.upstream.service import Upstream
from tests.conftest import RecordingSummarizer
from tests.proxy.inprocess import asking_the_model
from tests.synthetic import agent_session


class PilingUp(RecordingSummarizer):
    """The shared fake, answering after a pause long enough for concurrent
    requests to pile up behind the first one's lock."""

    async def __call__(self, messages: list[dict[str, Any]], max_tokens: int) -> str:
        reply = await super().__call__(messages, max_tokens)
        await asyncio.sleep(0.05)
        return reply


def _state() -> tuple[Conversations, Any]:
    settings = load_settings(
        None,
        **asking_the_model(
            {"store": {"url": "memory://"}, "models": {"m": {"context_window": 8192}}}
        ),
    )
    state = Conversations(settings, MemoryStore(), Upstream(settings), Observability())
    return state, state.model_config("m")


def test_concurrent_requests_for_one_compaction_make_one_summarizer_call() -> None:
    messages = agent_session(seed=51, steps=120)
    body = {"model": "m", "messages": messages}

    async def run(concurrent: int) -> tuple[int, set[str]]:
        state, config = _state()
        summarizer = PilingUp()
        results = await asyncio.gather(
            *(
                compact_if_needed(state, BareRequest(body, messages, config), summarizer)
                for _ in range(concurrent)
            )
        )
        await state.upstream.aclose()
        return summarizer.calls, {r.checkpoint.id for r in results if r.checkpoint}

    alone, _ = asyncio.run(run(1))
    together, ids = asyncio.run(run(6))
    assert alone >= 1
    assert together == alone  # one compaction's calls (chunks, turn prefix), not six
    assert len(ids) == 1


def _poor_checkpoint(messages: list[dict[str, Any]], covered: int, session: str = "s") -> Any:
    summary = {"role": "user", "content": f"{SUMMARY_MARKER}\n## Goal\nstill big"}
    return Checkpoint(
        session=session,
        end_hash=chain_hashes(messages, 2)[covered - 1],
        covered=covered,
        replacement=(summary,),
        stage="condensed",
        reason="threshold",
        tokens_before=100,
        tokens_after=95,
        progress_ok=False,
        id="poor",
        created_at=0.0,
    )


def test_a_span_that_barely_shrank_is_not_summarized_again() -> None:
    async def run(extra_steps: int, output_chars: int) -> tuple[int, str, int, int]:
        state, config = _state()
        big_task = "Follow these rules carefully. " * 800  # a head of ~4,000 tokens
        messages = agent_session(seed=52, steps=30, task=big_task, output_chars=600)
        starts = [g.start for g in group_messages(messages) if g.start <= len(messages) - 8]
        checkpoint = _poor_checkpoint(messages, covered=starts[-1] - 2)
        assert checkpoint is not None
        await state.store.put(checkpoint)
        new = agent_session(seed=53, steps=extra_steps, output_chars=output_chars)[2:-1]
        later = [*messages, *new]
        summarizer = RecordingSummarizer()
        body = {"model": "m", "messages": later}
        resolved = await compact_if_needed(state, BareRequest(body, later, config), summarizer)
        await state.upstream.aclose()
        return (
            summarizer.calls,
            resolved.stage,
            resolved.result.tokens_after,
            (resolved.result.input_limit),
        )

    # A little new material (beyond the tail, but not by 10 % of the limit):
    # the middle is not summarized again, and the request still fits.
    calls, stage, after, limit = asyncio.run(run(extra_steps=1, output_chars=16_000))
    assert calls == 0 and stage == "truncated" and after <= limit
    # Plenty of new material: summarizing can make progress again.
    calls, stage, after, limit = asyncio.run(run(extra_steps=6, output_chars=6_000))
    assert calls >= 1 and after <= limit


def _fresh_counter(config: Any) -> TokenCounter:
    return TokenCounter(
        encoding=encoding_for_model(config.model), image_tokens=config.profile.image_tokens
    )


def test_identify_works_out_what_resolve_needs_and_resolve_reuses_it() -> None:
    async def run() -> None:
        state, config = _state()
        messages = agent_session(seed=54, steps=4, output_chars=400)
        body = {"model": "m", "messages": messages}
        identified = identify(state, config, body, messages)
        assert identified.counts == _fresh_counter(config).count_messages(messages)
        assert identified.head == 2
        assert identified.chain == chain_hashes(messages, 2)
        assert identified.session == session_key(messages)

        counter = state.counter(config)
        hits, misses = counter.hits, counter.misses
        reused = await compact_if_needed(
            state, BareRequest(body, messages, config, identified=identified), None
        )
        assert (counter.hits, counter.misses) == (hits, misses)  # nothing counted again
        worked_out = await compact_if_needed(state, BareRequest(body, messages, config), None)
        assert counter.hits > hits
        assert reused.stage == "none" and reused.untouched
        assert reused.headers() == worked_out.headers()
        # What identifies other messages is not used for these.
        other_messages = agent_session(seed=55, steps=2, output_chars=400)
        other = identify(state, config, {"model": "m"}, other_messages)
        mismatched = await compact_if_needed(
            state, BareRequest(body, messages, config, identified=other), None
        )
        assert mismatched.headers() == worked_out.headers()
        await state.upstream.aclose()

    asyncio.run(run())


def test_under_the_trigger_a_stored_checkpoint_applies_with_exact_figures() -> None:
    async def run() -> None:
        state, config = _state()
        messages = agent_session(seed=56, steps=6, output_chars=400)
        starts = [g.start for g in group_messages(messages) if 2 < g.start < len(messages) - 2]
        # Of the conversation's own session, as every checkpoint the proxy makes:
        # a small request is looked up by its session first (proxy.session.untouched).
        session = session_key(messages)
        checkpoint = _poor_checkpoint(messages, covered=starts[-1] - 2, session=session)
        assert checkpoint is not None
        await state.store.put(checkpoint)
        later = [*messages, {"role": "user", "content": "and now?"}]
        body = {"model": "m", "messages": later}
        for _ in range(2):  # cold, then warm
            resolved = await compact_if_needed(state, BareRequest(body, later, config), None)
            assert resolved.stage == "reused" and not resolved.untouched
            assert resolved.checkpoint is not None and resolved.checkpoint.id == checkpoint.id
            assert resolved.messages == [*later[:2], *checkpoint.replacement, *later[starts[-1] :]]
            counter = _fresh_counter(config)
            assert resolved.tokens_before == counter.count_request(body)
            forwarded = {**body, "messages": resolved.messages}
            assert resolved.result.tokens_after == counter.count_request(forwarded)
        await state.upstream.aclose()

    asyncio.run(run())


@dataclasses.dataclass
class _Compacted:
    resolved: Any
    loop: asyncio.AbstractEventLoop
    loop_thread: int  #: the thread the event loop runs in
    compacted_in: list[int]  #: the threads the compaction ran in


def _compact_recording_threads(
    summarizer: Any, mode: str, monkeypatch: pytest.MonkeyPatch
) -> _Compacted:
    """compact_if_needed() of a ~340k-token session over the trigger, recording which
    thread ran the compaction (habit 15: structure, not the wall clock)."""
    messages = agent_session(seed=7, steps=600, output_chars=4_000)
    body = {"model": "m", "messages": messages}
    compacted_in: list[int] = []

    async def recording_execute(*args: Any, **kwargs: Any) -> Any:
        compacted_in.append(threading.get_ident())
        return await execute(*args, **kwargs)

    monkeypatch.setattr(proxy.session.compacting, "execute", recording_execute)

    async def run() -> _Compacted:
        state, config = _state()
        profile = dataclasses.replace(config.profile, summarizer=mode)
        configured = dataclasses.replace(config, profile=profile)
        resolved = await compact_if_needed(
            state, BareRequest(body, messages, configured), summarizer
        )
        await state.upstream.aclose()
        return _Compacted(resolved, asyncio.get_running_loop(), threading.get_ident(), compacted_in)

    return asyncio.run(run())


def test_a_large_compaction_leaves_the_event_loop_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """The extractive summary never awaits: on the loop, pruning and condensing
    a few hundred thousand tokens would stall every other request."""
    done = _compact_recording_threads(None, "extractive", monkeypatch)
    assert done.resolved.stage == "condensed"
    assert len(done.compacted_in) == 1 and done.compacted_in[0] != done.loop_thread


def test_a_large_compaction_still_summarizes_on_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Off the loop, the llm summarizer's calls come back to the loop its HTTP client lives on."""

    summarizer = RecordingSummarizer()
    done = _compact_recording_threads(summarizer, "llm", monkeypatch)
    assert done.resolved.stage == "condensed" and done.resolved.result.summarizer_used == "llm"
    assert done.compacted_in[0] != done.loop_thread  # compacted in a worker thread…
    assert summarizer.calls >= 1 and set(summarizer.loops) == {done.loop}  # …summarized on the loop


def test_a_conversation_with_a_call_left_unanswered_is_summarized_once() -> None:
    """A client that sends a tool call without its result (an interrupted
    command) is repaired on every request; its compaction is still stored and
    reused, so the summarizer is not asked again for the same span."""

    async def run() -> tuple[list[int], list[str]]:
        state, config = _state()
        messages = agent_session(seed=57, steps=60)
        unanswered = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_interrupted",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "sleep 999"}'},
                }
            ],
        }
        broken = [*messages[:6], unanswered, *messages[6:]]
        summarizer = RecordingSummarizer()
        stages, calls = [], []
        for turn in range(3):
            broken = [*broken, {"role": "user", "content": f"and now {turn}?"}]
            body = {"model": "m", "messages": broken}
            resolved = await compact_if_needed(state, BareRequest(body, broken, config), summarizer)
            stages.append(resolved.stage)
            calls.append(summarizer.calls)
        await state.upstream.aclose()
        return calls, stages

    calls, stages = asyncio.run(run())
    assert stages[0] == "condensed" and stages[1:] == ["reused", "reused"], stages
    assert calls[0] >= 1 and calls[1:] == [calls[0], calls[0]]  # none after the first


def test_the_counters_remembered_by_model_name_are_bounded() -> None:
    # A model's name is the client's to invent: each is remembered with its
    # counter, the oldest forgotten past store.max_model_rows; the counters
    # themselves are one per encoding.
    async def run() -> None:
        settings = load_settings(None, store={"url": "memory://", "max_model_rows": 2})
        upstream = Upstream(settings)
        state = Conversations(settings, MemoryStore(), upstream, Observability())
        await upstream.aclose()  # no request is sent: its pools are not needed
        counters = [state.counter(state.model_config(f"gpt-4o-{n}")) for n in range(5)]
        assert len({id(counter) for counter in counters}) == 1
        assert [model for model, _ in state._model_counters] == ["gpt-4o-3", "gpt-4o-4"]
        assert state.counter(state.model_config("gpt-4o-0")) is counters[0]

    asyncio.run(run())
