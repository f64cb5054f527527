"""compaction.stages.strategies: masking, and what summary / mask / hybrid do to a request."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Any

import pytest

from compaction import Profile, TokenCounter, compact
from compaction.budget.calibrated import calibrated_budget
from compaction.chat.messages import message_text
from compaction.chat.own import is_summary
from compaction.conversation.reading import read_conversation
from compaction.stages.decide import decide
from compaction.stages.execute import execute
from compaction.stages.results import new_checkpoint
from compaction.stages.strategies import MASK_MIN_CHARS, PLACEHOLDER_PREFIX, mask, placeholder
from tests.conftest import RecordingSummarizer, assistant, system, tool_group, user
from tests.synthetic import agent_session

COUNTER = TokenCounter("gpt-4o")


SHIP_IT = "## Goal\nShip it.\n## Next Steps\n- test"


def _run(messages: list[dict[str, Any]], profile: Profile, summarizer: Any = None) -> Any:
    request = {"model": "gpt-4o", "messages": messages}
    return asyncio.run(compact(request, profile, summarizer, counter=COUNTER))


def test_placeholder_keeps_the_name_and_size_and_says_it_was_hidden() -> None:
    text = "line\n" * 99 + "last"
    assert placeholder("bash", text) == (
        "[output hidden to save context: bash, 100 lines, 499 chars; repeat the call to see it]"
    )
    assert placeholder("", "x").startswith(PLACEHOLDER_PREFIX + "tool, 1 line,")


def test_mask_hides_long_tool_outputs_only_and_leaves_the_rest_as_they_were() -> None:
    long_args = {"command": "grep -rn " + "needle " * 100}
    messages = [
        system(),
        user("task"),
        assistant("I will look. " * 300),
        *tool_group("bash", long_args, "hay\n" * 500),
        *tool_group("read_file", {"path": "a.py"}, "short output"),
        user("go on"),
    ]
    snapshot = copy.deepcopy(messages)
    out = mask(messages, 2, len(messages))
    assert messages == snapshot
    assert out.changed == 1 and out.stage == "masked"
    hidden = [i for i, (a, b) in enumerate(zip(messages, out.messages, strict=True)) if a is not b]
    assert hidden == [4]
    assert out.messages[4]["content"] == placeholder("bash", "hay\n" * 500)
    assert out.messages[4]["tool_call_id"] == messages[4]["tool_call_id"]
    # The long assistant text and the long arguments are the model's own: kept.
    assert out.messages[2] is messages[2] and out.messages[3] is messages[3]


def test_mask_leaves_outputs_outside_the_range_alone() -> None:
    messages = [system(), user("task"), *tool_group("bash", {"command": "ls"}, "y " * 500)]
    assert mask(messages, 0, 2).changed == 0
    assert len(message_text(messages[3])) > MASK_MIN_CHARS


def test_mask_never_calls_the_summarizer_and_truncates_when_masking_is_not_enough() -> None:
    # Assistant text is never masked: 60 long reasoning steps cannot fit in 8k.
    messages = [system(), user("task")]
    for i in range(60):
        messages += [
            assistant(f"step {i} " + "thinking " * 200),
            *tool_group("bash", {"command": f"ls {i}"}, "y " * 2_000),
        ]
    summarizer = RecordingSummarizer(SHIP_IT)
    profile = Profile(context_window=8_192, strategy="mask", summarizer="llm")
    result = _run(messages, profile, summarizer)
    assert summarizer.calls == 0 and result.summary is None
    assert result.stage == "truncated"
    assert result.tokens_after <= result.input_limit
    assert not any(is_summary(m) for m in result.messages)


def test_hybrid_stops_after_masking_when_that_is_enough() -> None:
    messages = agent_session(seed=3, steps=60, output_chars=4_000)
    # A plan that may fill up to prune_target: the masked request is enough.
    profile = Profile(
        context_window=32_768,
        strategy="hybrid",
        summarizer="llm",
        plan_slack=10,
        plan_working_set=0,
    )
    summarizer = RecordingSummarizer(SHIP_IT)
    result = _run(messages, profile, summarizer)
    assert result.stage == "masked" and summarizer.calls == 0
    assert result.tokens_after <= result.trigger * profile.prune_target
    assert any(
        message_text(m).startswith(PLACEHOLDER_PREFIX)
        for m in result.messages
        if m.get("role") == "tool"
    )


def test_hybrid_condenses_the_masked_middle_when_masking_is_not_enough() -> None:
    messages = [system(), user("task")]
    for i in range(40):
        messages += [
            assistant(f"step {i} " + "thinking " * 150),
            *tool_group("bash", {"command": f"ls {i}"}, "y " * 1_000),
        ]
    summarizer = RecordingSummarizer(SHIP_IT)
    # Every summary asked of the model: what is tested is that hybrid condenses.
    profile = Profile(
        context_window=16_384, strategy="hybrid", summarizer="llm", summary_must_pay=False
    )
    result = _run(messages, profile, summarizer)
    assert result.stage == "condensed" and summarizer.calls >= 1
    # Summary on the same request: its first stage pruned instead of masking.
    summary = _run(
        messages, dataclasses.replace(profile, strategy="summary"), RecordingSummarizer(SHIP_IT)
    )
    assert summary.stage == "condensed"


@pytest.mark.parametrize("strategy", ["mask", "hybrid"])
def test_a_masked_result_is_checkpointed_and_reused_byte_for_byte(strategy: str) -> None:
    messages = agent_session(seed=5, steps=60, output_chars=4_000)
    profile = Profile(
        context_window=32_768,
        strategy=strategy,  # type: ignore[arg-type]
        summarizer="extractive",
        plan_slack=10,  # a fill up to prune_target: masking is enough
        plan_working_set=0,
    )
    request = {"model": "gpt-4o", "messages": messages}
    conversation = read_conversation(request, messages, COUNTER, profile.head_count)
    result = asyncio.run(
        execute(conversation, decide(conversation, profile, calibrated_budget(profile)))
    )
    assert result.stage == "masked" and result.span is not None
    made = new_checkpoint(conversation, result, id="c", created_at=0.0, progress_ok=True)
    assert made is not None
    later = [*messages, user("and then?")]
    again = read_conversation({**request, "messages": later}, later, COUNTER, profile.head_count)
    applied = decide(again, profile, calibrated_budget(profile), stored={made.end_hash: made})
    assert applied.checkpoint is made
    assert applied.messages == [*result.messages, later[-1]]


def test_the_strategy_is_checked() -> None:
    with pytest.raises(ValueError, match="strategy must be summary, mask or hybrid"):
        Profile(strategy="fold")  # type: ignore[arg-type]
