"""compaction.stages.execute: room planned before the summarizer, summaries kept, spans
for checkpoints."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from compaction import CannotFitError, Profile, TokenCounter, compact
from compaction.budget.calibrated import calibrated_budget
from compaction.chat.groups import validate_tool_pairing
from compaction.chat.messages import message_text
from compaction.chat.own import SUMMARY_MARKER, is_summary
from compaction.conversation.reading import read_conversation
from compaction.stages.decide import decide
from compaction.stages.execute import NOTE_ROOM, execute
from compaction.stages.results import new_checkpoint
from tests.client_bodies import aider_body
from tests.conftest import RecordingSummarizer, assistant, system, tool_group, user

COUNTER = TokenCounter("gpt-4o")
GOOD = (
    "## Goal\nShip it.\n## Progress\n### Done\n- {filler}\n## Key Decisions\n- keep it\n"
    "## Next Steps\n- test"
)


def _run(
    messages: list[dict[str, Any]], profile: Profile, summarizer: Any = None, reason: Any = None
) -> Any:
    request = {"model": "gpt-4o", "messages": messages}
    conversation = read_conversation(request, messages, COUNTER, profile.head_count)
    decision = decide(
        conversation, profile, calibrated_budget(profile), reason=reason or "threshold"
    )
    result = asyncio.run(execute(conversation, decision, summarizer))
    return conversation, result


def _steps(count: int, chars: int = 3_000) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(count):
        out += [assistant(f"step {i}"), *tool_group("bash", {"command": f"ls {i}"}, "y " * chars)]
    return out


def _tokens(messages: list[dict[str, Any]]) -> int:
    return sum(COUNTER.count_messages(messages))


def test_a_newest_turn_that_fits_alone_is_not_cut_for_a_digest() -> None:
    profile = Profile(context_window=8_192, summarizer="llm", summary_must_pay=False)
    head = [system(), user("task")]
    room = calibrated_budget(profile).input_limit - _tokens(head) - NOTE_ROOM
    words = room - 300  # the newest turn fits, and leaves 300: less than the 500 minimum
    newest = user("z " * words)
    while _tokens([newest]) > room - 300:
        words -= 10
        newest = user("z " * words)
    messages = [*head, *_steps(10), newest]
    summarizer = RecordingSummarizer(GOOD.format(filler="x"))
    _, result = _run(messages, profile, summarizer)
    assert summarizer.budgets == []  # no room for the minimum summary: no model asked
    assert result.messages[-1] is newest  # whole, not cut
    assert result.tokens_after <= result.input_limit
    assert validate_tool_pairing(result.messages) == []


def test_a_summary_larger_than_its_room_is_cut_to_fit_not_thrown_away() -> None:
    profile = Profile(context_window=16_384, summarizer="llm", summary_must_pay=False)
    chat = [m for i in range(30) for m in (user(f"part {i}: " + "w " * 900), assistant("noted"))]
    messages = [system(), user("task"), *chat, user("go on")]
    summarizer = RecordingSummarizer(GOOD.format(filler="detail " * 6_000))  # far over its budget
    _, result = _run(messages, profile, summarizer)
    assert result.stage == "condensed" and result.summarizer_used == "llm"
    summary = next(m for m in result.messages if is_summary(m))
    assert "Ship it." in message_text(summary) and message_text(summary).startswith(SUMMARY_MARKER)
    assert result.tokens_after <= result.input_limit
    assert result.messages[-1] is messages[-1]


def test_a_result_whose_newest_group_was_cut_still_yields_a_checkpoint() -> None:
    profile = Profile(context_window=8_192, summarizer="extractive")
    huge = user("diff:\n" + "+ a line of the diff\n" * 6_000)
    messages = [system(), user("task"), *_steps(6), huge]
    conversation, result = _run(messages, profile)
    assert result.stage == "truncated" and result.tokens_after <= result.input_limit
    assert any(is_summary(m) for m in result.messages)  # the digest was kept beside it
    made = new_checkpoint(conversation, result, id="c", created_at=0.0, progress_ok=True)
    assert made is not None and made.covered == len(messages) - 1 - conversation.head


# --- aider: no tools, a large message of files right before the request ----------


def _aider_body() -> dict[str, Any]:
    words = "the parser reads each header and returns a window value callers compare".split()

    def prose(count: int, seed: int) -> str:
        return " ".join(words[(i * 7 + seed) % len(words)] for i in range(count))

    history: list[dict[str, Any]] = []
    for turn in range(5):
        history.append({"role": "user", "content": f"Please change step {turn}: {prose(60, turn)}"})
        history.append(
            {"role": "assistant", "content": f"src/app.py\n```\n{prose(300, turn)}\n```"}
        )
    body = aider_body("Now add a changelog entry.", history)
    body["messages"][-4]["content"] += "\n" + prose(1_500, 1)  # the files in the chat
    return body


def test_an_aider_conversation_cut_to_fit_says_what_it_removed() -> None:
    # The newest turns leave no room for a summary's text: the span is removed
    # with a note saying so, not replaced by an empty "Summary of N earlier
    # messages" whose note says "removed 0 earlier messages".
    body = _aider_body()
    result = asyncio.run(
        compact(body, Profile(context_window=2_400, summarizer="extractive"), counter=COUNTER)
    )
    assert result.stage == "truncated"
    assert not any(is_summary(m) for m in result.messages)
    removed = len(body["messages"]) - len(result.messages) + 1  # the note stands for them
    notes = [
        m
        for m in result.messages
        if message_text(m).endswith("removed to fit the context window.]")
    ]
    assert [message_text(m) for m in notes] == [
        f"[{removed} earlier messages were removed to fit the context window.]"
    ]
    assert f"removed {removed} earlier messages to fit" in " ".join(result.notes)
    assert not any("removed 0 " in note for note in result.notes)
    # The head holds aider's canned messages and the first request typed.
    assert message_text(result.messages[7]).startswith("Please change step 0")


def test_an_output_that_takes_the_window_is_refused_as_the_output_not_the_head() -> None:
    """A short request asking for the whole window as output cannot fit: the
    refusal names the output (its tokens and the window), not a head above a
    negative limit; a head too large under a small output is still the head."""
    profile = Profile(context_window=4_096, summarizer="extractive")
    hi = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    with pytest.raises(CannotFitError) as refused:
        asyncio.run(compact({"messages": hi, "max_tokens": 4_096}, profile))
    assert (refused.value.part, refused.value.tokens, refused.value.window) == (
        "output",
        4_096,
        4_096,
    )
    assert "4,096 output tokens of a 4,096-token window" in str(refused.value)
    long_head = [{"role": "system", "content": "rule " * 5_000}, hi[1]]
    with pytest.raises(CannotFitError) as head:
        asyncio.run(compact({"messages": long_head, "max_tokens": 100}, profile))
    assert head.value.part == "head"
