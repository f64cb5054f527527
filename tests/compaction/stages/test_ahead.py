"""Compactions prepared ahead of need: when the engine asks for one, how it is
planned, and how a prepared one is applied at the trigger (compaction.stages.decide)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from compaction import Profile, TokenCounter, ahead, execute
from compaction.budget.calibrated import calibrated_budget
from compaction.budget.plan import Pace, growth_of, lead_turns
from compaction.chat.groups import validate_tool_pairing
from compaction.conversation.checkpoints import Checkpoint
from compaction.conversation.reading import Conversation, read_conversation
from compaction.stages.decide import Decision, decide
from compaction.stages.results import CompactionResult, new_checkpoint
from compaction.summary.format import summary_body
from tests.conftest import RecordingSummarizer, system, tool_group, user

COUNTER = TokenCounter("gpt-4o")
#: No pruning: a compaction of these sessions condenses.
#: A model asked for every summary: these tests are about preparing its summary.
PROFILE = Profile(context_window=16_384, tool_result_chars=1_000_000, summary_must_pay=False)
BUDGET = calibrated_budget(PROFILE)
SUMMARY = "\n".join(
    [
        "## Goal\n- Fix the bug.",
        "## Constraints & Preferences\n- None.",
        "## Progress\n- Listed the files.",
        "## Key Decisions\n- None yet.",
        "## Next Steps\n- Keep going.",
        "## Critical Context\n- None.",
    ]
)


def _conversation(messages: list[dict[str, Any]]) -> Conversation:
    return read_conversation({"model": "gpt-4o", "messages": messages}, messages, COUNTER, 2)


def _step(i: int) -> list[dict[str, Any]]:
    return tool_group("bash", {"command": f"ls {i}"}, f"file_{i}.py " * 60)


def _grown_to(
    share: float,
    start: list[dict[str, Any]] | None = None,
    stored: dict[str, Checkpoint] | None = None,
) -> list[dict[str, Any]]:
    """A session grown step by step to just past ``share`` of the trigger (with
    ``stored`` applied)."""
    messages = start or [system(), user("Fix the bug.")]
    while decide(_conversation(messages), PROFILE, BUDGET, stored=stored).tokens <= (
        share * BUDGET.trigger
    ):
        messages = [*messages, *_step(len(messages))]
    return messages


def _prepare(
    messages: list[dict[str, Any]], model: RecordingSummarizer
) -> tuple[Checkpoint, CompactionResult]:
    """What the proxy does in the background: plan ahead, run it, keep it as precomputed."""
    conversation = _conversation(messages)
    decision = decide(conversation, PROFILE, BUDGET)
    assert decision.action == "forward" and decision.prepare
    result = asyncio.run(execute(conversation, ahead(conversation, decision), model))
    made = new_checkpoint(
        conversation, result, id="p", created_at=0.0, progress_ok=True, precomputed=True
    )
    assert made is not None
    return made, result


def _stored(checkpoint: Checkpoint) -> dict[str, Checkpoint]:
    return {checkpoint.end_hash: checkpoint}


def test_preparing_is_asked_past_the_share_with_the_llm_summarizer_only() -> None:
    below, past = _grown_to(0.5), _grown_to(0.85)
    assert not decide(_conversation(below), PROFILE, BUDGET).prepare
    decision = decide(_conversation(past), PROFILE, BUDGET)
    assert decision.action == "forward" and decision.prepare
    for other in (
        dataclasses.replace(PROFILE, summarizer="extractive"),
        dataclasses.replace(PROFILE, precompute_share=0.0),
        dataclasses.replace(PROFILE, precompute_share=0.9),
        dataclasses.replace(PROFILE, strategy="mask"),
    ):
        assert not decide(_conversation(past), other, BUDGET).prepare, other


def _crossing(
    messages: list[dict[str, Any]], stored: dict[str, Checkpoint] | None = None
) -> list[dict[str, Any]]:
    """``messages`` grown step by step until just past the trigger."""
    return _grown_to(1.0, messages, stored)


def test_a_prepared_compaction_applied_leaves_what_one_made_at_the_trigger_would() -> None:
    messages = _grown_to(0.8)
    conversation = _conversation(messages)
    plan = ahead(conversation, decide(conversation, PROFILE, BUDGET))
    assert plan.action == "compact" and plan.growth >= BUDGET.trigger - plan.tokens
    prepared, _ = _prepare(messages, RecordingSummarizer(SUMMARY))

    crossing = _conversation(_crossing(messages))
    applied = asyncio.run(
        execute(
            crossing,
            decide(crossing, PROFILE, BUDGET, stored=_stored(prepared)),
            RecordingSummarizer(SUMMARY),
        )
    )
    at_the_trigger = asyncio.run(
        execute(crossing, decide(crossing, PROFILE, BUDGET), RecordingSummarizer(SUMMARY))
    )
    assert applied.precomputed == "p" and at_the_trigger.precomputed is None
    # Had the tail not been planned shorter, the growth would sit on top.
    slack = abs(applied.tokens_after - at_the_trigger.tokens_after)
    assert slack <= BUDGET.tail_budget // 4, (applied.tokens_after, at_the_trigger.tokens_after)


def test_a_prepared_compaction_changes_nothing_under_the_trigger() -> None:
    messages = _grown_to(0.85)
    prepared, _ = _prepare(messages, RecordingSummarizer(SUMMARY))
    later = [*messages, *_step(1000)]
    decision = decide(_conversation(later), PROFILE, BUDGET, stored=_stored(prepared))
    if decision.tokens <= BUDGET.trigger:
        assert decision.action == "forward" and decision.messages is later
        assert not decision.prepare  # one is ready: nothing more to prepare


def test_at_the_trigger_the_prepared_compaction_is_applied_without_asking_the_model() -> None:
    messages = _grown_to(0.85)
    prepared, _ = _prepare(messages, RecordingSummarizer(SUMMARY))
    crossing = _crossing(messages)
    conversation = _conversation(crossing)
    decision = decide(conversation, PROFILE, BUDGET, stored=_stored(prepared))
    assert decision.action == "compact" and decision.checkpoint is prepared
    model = RecordingSummarizer(SUMMARY)
    result = asyncio.run(execute(conversation, decision, model))
    assert model.calls == 0
    assert result.stage == "condensed" and result.precomputed == "p"
    assert result.tokens_after <= BUDGET.trigger
    head = conversation.head
    assert result.messages[head : head + len(prepared.replacement)] == list(prepared.replacement)
    # The tail is the client's own messages, verbatim.
    assert result.messages[-1] is crossing[-1]
    # Stored again, it covers the same span: the prepared one, now in use.
    made = new_checkpoint(conversation, result, id="c", created_at=1.0, progress_ok=True)
    assert made is not None and made.covered == prepared.covered and not made.precomputed


def test_what_arrived_since_is_compacted_behind_the_prepared_summary_without_a_model() -> None:
    messages = _grown_to(0.8)
    prepared, _ = _prepare(messages, RecordingSummarizer(SUMMARY))
    # Far more arrives than the preparation expected (huge tool outputs).
    crossing = [*messages, *(m for i in range(80) for m in _step(2000 + i))]
    conversation = _conversation(crossing)
    decision = decide(conversation, PROFILE, BUDGET, stored=_stored(prepared))
    assert decision.fixed == len(prepared.replacement)
    assert decision.profile.summarizer == "extractive"
    model = RecordingSummarizer(SUMMARY)
    result = asyncio.run(execute(conversation, decision, model))
    assert model.calls == 0
    assert result.tokens_after <= BUDGET.input_limit
    assert not validate_tool_pairing(result.messages)
    head = conversation.head
    # The model's summary is kept word for word; the newer steps get a digest behind it.
    assert result.messages[head : head + len(prepared.replacement)] == list(prepared.replacement)
    assert result.stage in ("condensed", "truncated")


def test_a_prepared_compaction_off_the_conversation_is_never_applied() -> None:
    messages = _grown_to(0.85)
    prepared, _ = _prepare(messages, RecordingSummarizer(SUMMARY))
    # The history was edited (a rewind, a changed tool output), then grew past the trigger.
    edited = [*messages[:3], {**messages[3], "content": "redone"}, *messages[4:]]
    while _conversation(edited).tokens <= BUDGET.trigger:
        edited = [*edited, *_step(len(edited))]
    decision = decide(_conversation(edited), PROFILE, BUDGET, stored=_stored(prepared))
    assert decision.checkpoint is None and decision.action == "compact"
    assert decision.profile.summarizer == "llm"


def test_a_prepared_compaction_for_another_window_is_not_applied() -> None:
    messages = _grown_to(0.85)
    prepared, _ = _prepare(messages, RecordingSummarizer(SUMMARY))
    other = dataclasses.replace(prepared, window=8_192)
    crossing = _crossing(messages)
    decision: Decision = decide(_conversation(crossing), PROFILE, BUDGET, stored=_stored(other))
    assert decision.checkpoint is None
    assert any("another context window" in note for note in decision.notes)


def test_the_prepared_summary_is_the_models() -> None:
    messages = _grown_to(0.85)
    model = RecordingSummarizer(SUMMARY)
    prepared, result = _prepare(messages, model)
    assert model.calls == 1 and result.summarizer_used == "llm"
    texts = [m.get("content") for m in prepared.replacement]
    assert any(isinstance(t, str) and summary_body(t).startswith("## Goal") for t in texts)


def test_a_preparation_over_a_summary_since_edited_is_never_applied() -> None:
    # A first compaction, in use; then a preparation over it.
    messages = _grown_to(0.85)
    first, _ = _prepare(messages, RecordingSummarizer(SUMMARY))
    in_use = dataclasses.replace(first, precomputed=False, prepared_over="", id="c")
    grown = _grown_to(0.85, messages, _stored(in_use))
    conversation = _conversation(grown)
    decision = decide(conversation, PROFILE, BUDGET, stored=_stored(in_use))
    assert decision.checkpoint is in_use and decision.prepare
    result = asyncio.run(
        execute(conversation, ahead(conversation, decision), RecordingSummarizer(SUMMARY))
    )
    second = new_checkpoint(
        conversation,
        result,
        id="p2",
        created_at=1.0,
        progress_ok=True,
        precomputed=True,
        base=in_use,
    )
    assert second is not None and second.covered > in_use.covered
    # The user edits the summary in use (the dashboard's PUT).
    edited = dataclasses.replace(
        in_use, replacement=({"role": "user", "content": "edited by hand"},)
    )
    crossing = _conversation(_crossing(grown, _stored(in_use)))
    for base, applied in ((in_use, True), (edited, False)):
        stored = {**_stored(base), **_stored(second)}
        decision = decide(crossing, PROFILE, BUDGET, stored=stored)
        assert (decision.checkpoint is second) is applied
    under = decide(conversation, PROFILE, BUDGET, stored={**_stored(edited), **_stored(second)})
    assert under.prepare, "a stale preparation does not stop a new one"


def test_a_slow_summary_at_a_fast_pace_is_prepared_as_many_turns_ahead_as_it_takes() -> None:
    # Short of precompute_share, some turns from the trigger: a summary that
    # takes more turns than are left at the session's pace is prepared now;
    # one that takes fewer is not yet. Unmeasured, the share alone decides.
    messages = _grown_to(0.6)
    conversation = _conversation(messages)
    tokens = decide(conversation, PROFILE, BUDGET).tokens
    growth = growth_of(conversation.messages, conversation.counts, conversation.head)
    left = (BUDGET.trigger - tokens) / growth
    assert left > 5 and tokens < PROFILE.precompute_share * BUDGET.trigger

    def prepares(pace: Pace | None) -> bool:
        return decide(conversation, PROFILE, BUDGET, pace=pace).prepare

    turn = 0.4  # seconds
    assert prepares(Pace(0, idle=turn, summary=turn * (left + 1)))
    assert not prepares(Pace(0, idle=turn, summary=turn * (left - 3)))
    assert not prepares(Pace(0, idle=turn)) and not prepares(None)
    assert lead_turns(Pace(0, idle=0.4, summary=4.0)) == 11  # ten turns, and the one it starts in
    assert lead_turns(Pace(0, idle=None, summary=4.0)) is None


def test_a_measured_pace_prepares_no_earlier_than_the_summary_needs() -> None:
    # Past precompute_share but many turns from the trigger: with the summary's
    # time and the session's pace measured, a summary that takes one turn is
    # not prepared yet (the session may end before it is needed); one turn
    # before the trigger it is. Unmeasured, the share alone decides.
    messages = _grown_to(0.8)
    conversation = _conversation(messages)
    tokens = decide(conversation, PROFILE, BUDGET).tokens
    growth = growth_of(conversation.messages, conversation.counts, conversation.head)
    assert (BUDGET.trigger - tokens) / growth > 3

    def prepares(messages: list[dict[str, Any]], pace: Pace | None) -> bool:
        return decide(_conversation(messages), PROFILE, BUDGET, pace=pace).prepare

    quick = Pace(0, idle=30.0, summary=4.0)  # a summary within the turn: two turns ahead
    assert lead_turns(quick) == 2
    assert prepares(messages, None) and prepares(messages, Pace(0, idle=30.0))
    assert not prepares(messages, quick)
    while decide(_conversation(messages), PROFILE, BUDGET).tokens + 2 * growth < BUDGET.trigger:
        messages = [*messages, *_step(len(messages))]
    assert prepares(messages, quick)
