"""The README's invariants, held by hypothesis on random conversations."""

from __future__ import annotations

import asyncio
import copy
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction import CannotFitError, Profile, TokenCounter, compact, validate_tool_pairing
from compaction.budget.calibrated import calibrated_budget
from compaction.chat.groups import group_messages
from compaction.conversation.reading import read_conversation
from compaction.conversation.regions import head_end, tail_start
from compaction.stages.decide import decide
from compaction.stages.execute import NOTE_ROOM, TAIL_SHARE_OF_FILL, execute
from compaction.stages.pruner import prune
from compaction.stages.results import new_checkpoint
from compaction.stages.strategies import PLACEHOLDER_PREFIX, condenses, mask
from tests.synthetic import conversations

COUNTER = TokenCounter("gpt-4o")


@st.composite
def with_pinned(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A conversation with system and developer messages inserted after the task,
    anywhere: between turns, and between a call and its results."""
    messages = draw(conversations())
    for k in range(draw(st.integers(0, 3))):
        at = draw(st.integers(2, len(messages)))
        role = draw(st.sampled_from(["system", "developer"]))
        size = draw(st.sampled_from([1, 1, 1, 40, 400]))
        messages.insert(at, {"role": role, "content": f"pinned {k}: " + "keep this " * size})
    return messages


def _pinned(messages: list[dict[str, Any]], head: int) -> list[dict[str, Any]]:
    return [m for m in messages[head:] if m["role"] in ("system", "developer")]


profiles = st.builds(
    Profile,
    context_window=st.sampled_from([2_048, 4_096, 8_192, 16_000, 32_000]),
    head_count=st.integers(0, 3),
    keep_recent_tokens=st.sampled_from([500, 2_000, 20_000]),
    summarizer=st.sampled_from(["extractive", "off"]),
    threshold=st.one_of(st.none(), st.sampled_from([1_000, 3_000])),
    strategy=st.sampled_from(["summary", "mask", "hybrid"]),
)


def _run(request: dict[str, Any], profile: Profile, reason: Any) -> Any:
    return asyncio.run(compact(request, profile, reason=reason, counter=COUNTER))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.one_of(conversations(), with_pinned()),
    profile=profiles,
    reason=st.sampled_from(["threshold", "overflow", "manual"]),
    max_tokens=st.one_of(st.none(), st.integers(1, 3_000)),
)
def test_compaction_invariants(
    messages: list[dict[str, Any]], profile: Profile, reason: str, max_tokens: int | None
) -> None:
    request: dict[str, Any] = {"model": "gpt-4o", "messages": messages}
    if max_tokens is not None:
        request["max_tokens"] = max_tokens
    snapshot = copy.deepcopy(messages)
    counts = COUNTER.count_messages(messages)
    overhead = COUNTER.request_overhead(request)
    groups = group_messages(messages)
    head = head_end(messages, groups, profile.head_count)
    budget = calibrated_budget(profile, max_tokens or 0)

    try:
        result = _run(request, profile, reason)
    except CannotFitError as exc:
        # Only what is never dropped may be too large: the head and the
        # system messages after it, or the newest group.
        head_tokens = sum(counts[:head]) + overhead
        head_tokens += sum(COUNTER.count_messages(_pinned(messages, head)))
        assert exc.part == "newest group" or head_tokens > budget.input_limit, exc
        assert messages == snapshot
        return

    assert messages == snapshot, "the input was mutated"
    out = result.messages
    assert validate_tool_pairing(out) == []
    assert result.tokens_after <= result.input_limit
    assert result.tokens_after == COUNTER.count_request({**request, "messages": out})
    assert result.tokens_after <= result.tokens_before, "a stage grew the request"
    assert all(a is b for a, b in zip(out[:head], messages[:head], strict=True)), "head changed"
    # Every system message after the head is forwarded as it came, in its order.
    pinned = _pinned(messages, head)
    assert [m for m in _pinned(out, head) if any(m is p for p in pinned)] == pinned
    assert all(any(m is p for m in out) for p in pinned), "a pinned message was lost"

    if reason == "threshold" and result.tokens_before <= budget.trigger:
        assert out is messages and result.stage == "none" and not result.changed
    if profile.strategy == "mask":
        assert result.summarizer_calls == 0 and result.summary is None
        assert result.stage in ("none", "masked", "truncated")
    if result.stage != "truncated":
        tail_budget = budget.tail_budget
        if reason == "manual":  # /compact condenses at least half of what follows the head
            tail_budget = min(tail_budget, sum(counts[head:]) // 2)
        if reason == "threshold" and condenses(profile):  # its share of the plan's fill
            conversation = read_conversation(request, messages, COUNTER, profile.head_count)
            target = decide(conversation, profile, budget).target
            beside = target - sum(counts[:head]) - overhead
            tail_budget = min(tail_budget, max(math.floor(beside * TAIL_SHARE_OF_FILL), 0))
        # The verbatim tail gives way to the minimum summary only when both
        # cannot fit beside the head; the newest group is kept in any case.
        room = budget.input_limit - sum(counts[:head]) - overhead - NOTE_ROOM
        if result.stage == "condensed":  # a condensing plan keeps half the room for growth
            tail_budget = min(tail_budget, max(room, 0) // 2)
        tail = tail_start(groups, counts, tail_budget, head)
        kept_before = sum(COUNTER.count_messages(_pinned(messages[:tail], head)))
        if room - sum(counts[tail:]) - kept_before < profile.summary_min_tokens and groups:
            tail = max(tail, groups[-1].start)
        kept = len(messages) - tail
        if kept:
            assert all(a is b for a, b in zip(out[-kept:], messages[tail:], strict=True))
    elif not any("shrunk" in note or "cut" in note for note in result.notes):
        assert out[-1] is messages[-1], "the newest message was lost"


@settings(max_examples=80, deadline=None)
@given(messages=conversations(), data=st.data())
def test_pruning_is_idempotent_and_never_grows(messages: list[dict[str, Any]], data: Any) -> None:
    profile = Profile()
    start = data.draw(st.integers(0, len(messages)))
    end = data.draw(st.integers(start, len(messages)))
    once = prune(messages, start, end, profile)
    twice = prune(once.messages, start, end, profile)
    assert twice.messages == once.messages and twice.pruned == 0
    assert validate_tool_pairing(once.messages) == []
    for before, after in zip(messages, once.messages, strict=True):
        assert len(str(after)) <= len(str(before))


@settings(max_examples=80, deadline=None)
@given(messages=conversations(), data=st.data())
def test_masking_is_idempotent_and_never_grows(messages: list[dict[str, Any]], data: Any) -> None:
    start = data.draw(st.integers(0, len(messages)))
    end = data.draw(st.integers(start, len(messages)))
    once = mask(messages, start, end)
    twice = mask(once.messages, start, end)
    assert twice.messages == once.messages and twice.changed == 0
    assert validate_tool_pairing(once.messages) == []
    counts = COUNTER.count_messages(messages)
    for before, after, tokens in zip(messages, once.messages, counts, strict=True):
        if after is not before:
            assert before["role"] == "tool" and after["content"].startswith(PLACEHOLDER_PREFIX)
            assert COUNTER.count_messages([after])[0] < tokens


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.one_of(conversations(), with_pinned()), profile=profiles)
def test_a_checkpoint_of_a_result_gives_the_next_request_the_same_bytes(
    messages: list[dict[str, Any]], profile: Profile
) -> None:
    """Cache stability: the checkpoint stored for a compaction, applied to the
    next request (the same history and one new message), forwards exactly what
    the compaction forwarded, followed by the new message."""
    request: dict[str, Any] = {"model": "gpt-4o", "messages": messages}
    conversation = read_conversation(request, messages, COUNTER, profile.head_count)
    decision = decide(conversation, profile, calibrated_budget(profile))
    try:
        result = asyncio.run(execute(conversation, decision))
    except CannotFitError:
        return
    made = new_checkpoint(conversation, result, id="c", created_at=0.0, progress_ok=True)
    if made is None:
        return
    later = [*messages, {"role": "user", "content": "and then?"}]
    again = read_conversation({**request, "messages": later}, later, COUNTER, profile.head_count)
    applied = decide(again, profile, calibrated_budget(profile), stored={made.end_hash: made})
    assert applied.checkpoint is made
    if any("cut" in note for note in result.notes):
        # The newest group was cut to fit: that cut is redone on each request;
        # everything before it comes from the checkpoint as it was sent.
        kept = len(result.messages) - (len(messages) - (made.covered + conversation.head))
        assert applied.messages[:kept] == result.messages[:kept]
    else:
        assert applied.messages == [*result.messages, later[-1]]
