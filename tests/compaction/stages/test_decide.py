"""compaction.stages.decide: the calibrated budget, the ratio's smoothing, the retry rule,
the choice."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from compaction import Profile, TokenCounter
from compaction.budget.calibrated import calibrated_budget, compute_budget, retry_budget
from compaction.budget.lessons import MAX_RATIO, MIN_RATIO, OverflowReport
from compaction.conversation.checkpoints import Checkpoint, chain_hashes
from compaction.conversation.reading import read_conversation
from compaction.stages.decide import Steering, decide, made_progress, steering_can_matter
from tests.conftest import assistant, system, tool_group, user

COUNTER = TokenCounter("gpt-4o")


def test_the_budget_is_scaled_by_the_ratio_and_the_margin() -> None:
    profile = Profile(context_window=16_384, safety_margin=0.02)
    raw = compute_budget(profile)
    budget = calibrated_budget(profile, 0, 1.15)
    assert budget.input_limit == math.floor(raw.input_limit * 0.98 / 1.15)
    assert budget.trigger == budget.input_limit
    assert budget.tail_budget == min(profile.keep_recent_tokens, budget.input_limit // 2)
    # An absolute threshold is scaled the same way, and never above the limit.
    low = calibrated_budget(Profile(context_window=16_384, threshold=4_000), 0, 1.25)
    assert low.trigger == math.floor(4_000 * 0.98 / 1.25)


def test_a_ratio_is_kept_within_its_bounds() -> None:
    profile = Profile(context_window=16_384, safety_margin=0.0)
    raw = compute_budget(profile).input_limit
    assert calibrated_budget(profile, 0, 50.0).input_limit == math.floor(raw / MAX_RATIO)
    assert calibrated_budget(profile, 0, 0.01).input_limit == math.floor(raw / MIN_RATIO)


@given(
    failed=st.integers(1_000, 400_000),
    window=st.one_of(st.none(), st.integers(2_000, 300_000)),
    factor=st.one_of(st.none(), st.floats(0.5, 4.0)),
    ratio=st.floats(0.8, 2.0),
    requested=st.integers(0, 1_000),
)
def test_a_retry_always_aims_below_what_failed(
    failed: int, window: int | None, factor: float | None, ratio: float, requested: int
) -> None:
    count = int(failed * factor) if factor else None
    report = OverflowReport(window=window, count=count)
    retry = retry_budget(Profile(), requested, ratio, failed, report)
    assert retry.budget.input_limit <= failed * 0.9
    assert retry.budget.trigger == retry.budget.input_limit
    if window and count:
        # Below what the upstream would count as fitting its stated window.
        limit = compute_budget(Profile(context_window=window), requested).input_limit
        assert retry.budget.input_limit * count / failed <= limit
    assert retry.ratio >= min(ratio, MAX_RATIO)


def test_a_retry_without_figures_aims_at_half() -> None:
    retry = retry_budget(Profile(), 0, 1.0, 10_000, OverflowReport())
    assert retry.budget.input_limit == 5_000 and retry.ratio == 1.0


def _conversation(messages: list[dict]) -> object:
    return read_conversation({"model": "gpt-4o", "messages": messages}, messages, COUNTER, 2)


def _session(steps: int) -> list[dict]:
    messages = [system(), user("Fix the bug.")]
    for i in range(steps):
        messages += [assistant(f"step {i}"), *tool_group("bash", {"command": "ls"}, "x " * 400)]
    return messages


def test_under_the_trigger_the_request_is_forwarded_as_it_is() -> None:
    messages = _session(2)
    profile = Profile(context_window=32_000)
    decision = decide(_conversation(messages), profile, calibrated_budget(profile))
    assert decision.action == "forward" and decision.untouched
    assert decision.messages is messages


def test_a_stored_checkpoint_is_applied_and_reused_without_compacting() -> None:
    messages = _session(6)
    chain = chain_hashes(messages, 2)
    summary = user("[CONTEXT CONDENSED — REFERENCE ONLY]\n## Goal\nFix the bug.")
    stored = Checkpoint(
        session="s",
        end_hash=chain[5],
        covered=6,
        replacement=(summary,),
        stage="condensed",
        reason="threshold",
        tokens_before=1,
        tokens_after=1,
        id="c",
        created_at=0.0,
    )
    profile = Profile(context_window=32_000)
    decision = decide(
        _conversation(messages), profile, calibrated_budget(profile), stored={chain[5]: stored}
    )
    assert decision.action == "forward" and decision.checkpoint is stored
    assert decision.messages == [*messages[:2], summary, *messages[8:]]
    assert decision.tokens < decision.tokens_before


def test_over_the_trigger_or_by_command_the_request_is_compacted() -> None:
    messages = _session(30)
    small = Profile(context_window=4_096)
    assert decide(_conversation(messages), small, calibrated_budget(small)).action == "compact"
    roomy = Profile(context_window=128_000)
    manual = decide(_conversation(messages), roomy, calibrated_budget(roomy), reason="manual")
    assert manual.action == "compact"


def test_a_broken_conversation_under_the_trigger_is_repaired_not_compacted() -> None:
    import asyncio

    from compaction import execute

    messages = _session(3)
    orphan = {"role": "tool", "tool_call_id": "nobody", "content": "stray"}
    broken = [*messages[:5], orphan, *messages[5:]]  # after a whole tool group
    profile = Profile(context_window=32_000)
    decision = decide(_conversation(broken), profile, calibrated_budget(profile))
    assert decision.action == "compact"  # the pairing must be repaired before it leaves
    result = asyncio.run(execute(_conversation(broken), decision))
    assert result.stage == "none" and result.changed
    assert result.messages == messages  # the orphan dropped, nothing else touched
    assert any(note.startswith("repaired input:") for note in result.notes)


# --- the progress guard's measure and the session's settings ------------------


def test_a_compaction_made_progress_only_when_it_shrank_the_request_by_the_share() -> None:
    assert made_progress(1_000, 899, 0.1)
    assert not made_progress(1_000, 901, 0.1)
    assert not made_progress(1_000, 1_000, 0.1)
    assert made_progress(0, 0, 0.0)  # nothing to shrink, nothing asked


def test_a_session_switched_off_is_forwarded_and_prepares_nothing() -> None:
    messages = _session(30)
    small = Profile(context_window=4_096)
    conversation, budget = _conversation(messages), calibrated_budget(small)
    off = decide(conversation, small, budget, steering=Steering(enabled=False))
    assert off.action == "forward" and not off.prepare
    assert off.messages is messages  # as the client sent it
    manual = decide(conversation, small, budget, reason="manual", steering=Steering(enabled=False))
    assert manual.action == "compact"  # /compact still compacts


def test_compact_now_makes_the_request_a_manual_compaction() -> None:
    messages = _session(2)
    roomy = Profile(context_window=128_000)
    decision = decide(
        _conversation(messages),
        roomy,
        calibrated_budget(roomy),
        steering=Steering(compact_now=True),
    )
    assert decision.action == "compact" and decision.reason == "manual"


def test_the_sessions_instructions_come_before_the_requests_own() -> None:
    messages = _session(30)
    small = Profile(context_window=4_096)
    conversation, budget = _conversation(messages), calibrated_budget(small)
    steering = Steering(instructions="Keep the paths.")
    both = decide(conversation, small, budget, steering=steering, instructions="Focus on tests.")
    assert both.instructions == "Keep the paths.\nFocus on tests."
    assert decide(conversation, small, budget).instructions is None
    assert decide(conversation, small, budget, instructions="x").instructions == "x"


@given(
    steps=st.integers(0, 12),
    window=st.integers(2_000, 40_000),
    prepares=st.booleans(),
    enabled=st.booleans(),
    instructions=st.sampled_from(["", "Keep the paths."]),
)
def test_settings_that_cannot_matter_change_nothing_decide_does(
    steps: int, window: int, prepares: bool, enabled: bool, instructions: str
) -> None:
    # The proxy skips reading a session's settings when they cannot matter:
    # whatever they are, decide must then forward the same messages and
    # prepare nothing, as with none.
    conversation = _conversation(_session(steps))
    profile = Profile(context_window=window, summarizer="llm" if prepares else "extractive")
    budget = calibrated_budget(profile)
    steering = Steering(enabled=enabled, instructions=instructions)
    plain, steered = (
        decide(conversation, profile, budget),
        decide(conversation, profile, budget, steering=steering),
    )
    if not steering_can_matter(conversation, profile, budget):
        assert plain.action == steered.action == "forward"
        assert not plain.prepare and not steered.prepare
        assert steered.messages is plain.messages
    elif plain.action == "compact" or plain.prepare:
        # Where they can, they do: switched off, nothing is compacted or prepared.
        off = decide(conversation, profile, budget, steering=Steering(enabled=False))
        assert off.action == "forward" and not off.prepare


def test_settings_matter_for_anything_but_a_small_threshold_request() -> None:
    conversation = _conversation(_session(1))
    profile = Profile(context_window=32_000)
    budget = calibrated_budget(profile)
    assert not steering_can_matter(conversation, profile, budget)
    assert steering_can_matter(conversation, profile, budget, reason="manual")
    assert steering_can_matter(conversation, profile, budget, stored={"h": _any_checkpoint()})
    longer = _conversation(_session(6))
    assert not steering_can_matter(longer, profile, budget)
    small = Profile(context_window=2_000)  # past its trigger: compacted unless switched off
    assert steering_can_matter(longer, small, calibrated_budget(small))


def _any_checkpoint() -> Checkpoint:
    return Checkpoint(
        session="s",
        end_hash="h",
        covered=1,
        replacement=(user("summary"),),
        stage="condensed",
        reason="threshold",
        tokens_before=1,
        tokens_after=1,
        id="c",
        created_at=0.0,
    )
