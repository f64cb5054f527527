"""Every summary heading and removal note states how many of the client's
messages it stands for, counting those an earlier summary or note stood for."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from compaction.budget.profile import Profile
from compaction.chat.messages import message_text, truncation_note
from compaction.stages.condenser import condense, find_middle
from compaction.stages.truncate import truncate
from compaction.summary.files import FileLists
from compaction.summary.format import summary_count, summary_message
from compaction.summary.prompts import stands_for
from compaction.tokens.counter import TokenCounter
from tests.conftest import assistant, system, tool_group, user

COUNTER = TokenCounter("gpt-4o")


def _earlier_summary(count: int) -> dict[str, Any]:
    return summary_message(
        "## Goal\n- Fix the parser\n\n## Progress\n- Read it\n\n## Next Steps\n- Test it",
        condensed=count,
        files=FileLists(),
        turn_prefix=False,
    )


def _steps(count: int, chars: int = 2_000) -> list[dict[str, Any]]:
    """``count`` messages: an assistant step and a tool group, alternately."""
    out: list[dict[str, Any]] = []
    i = 0
    while len(out) < count:
        out.append(assistant(f"Step {i}: reading on."))
        out.extend(tool_group("bash", {"command": f"cat src/mod{i}.py"}, f"{i} " * chars))
        i += 1
    return out[:count] if len(out) == count else out


def test_a_summary_stands_for_its_headings_count_and_a_note_for_its_own() -> None:
    assert summary_count(_earlier_summary(27)) == 27
    assert summary_count(user("Summary of 27 earlier messages")) is None  # not the proxy's
    assert stands_for([_earlier_summary(27), *_steps(12)]) == 27 + len(_steps(12))
    assert stands_for([truncation_note(30), user("a"), _earlier_summary(5)]) == 36


def test_a_summary_folding_an_earlier_one_is_headed_with_the_whole_span() -> None:
    steps = _steps(12)
    messages = [system(), user("Fix the parser."), _earlier_summary(27), *steps, user("Go on.")]
    tail = len(messages) - 1
    result = asyncio.run(
        condense(
            messages,
            find_middle(messages, 2, tail),
            profile=Profile(summarizer="extractive"),
            counter=COUNTER,
            summarizer=None,
        )
    )
    heading = message_text(result.summary).splitlines()[1]
    # 27 the earlier summary stood for, and the new ones: not the 13 messages it read.
    assert heading.startswith(f"Summary of {27 + len(steps)} earlier messages")


@pytest.mark.parametrize("newest_words", [200, 8_000], ids=["older-groups", "newest-cut"])
def test_the_removal_note_and_its_report_count_what_a_dropped_summary_stood_for(
    newest_words: int,
) -> None:
    head = [system(), user("Fix the parser.")]
    kept_summary = _earlier_summary(3)
    newest = user("Now this: " + "word " * newest_words)
    messages = [*head, _earlier_summary(23), *_steps(6), kept_summary, *_steps(4), newest]
    room = sum(COUNTER.count_messages([*head, kept_summary])) + 200
    limit = room + min(COUNTER.count_message(newest), 1_000)
    result = truncate(messages, head_end=2, limit=limit, counter=COUNTER, overhead=0)
    kept = {id(m) for m in result.messages}
    # The newest message is kept (cut, when it must be: another object then).
    dropped = [m for m in messages[:-1] if id(m) not in kept]
    assert any(summary_count(m) == 23 for m in dropped), "precondition: the older summary went"
    [note] = [m for m in result.messages if message_text(m).endswith("the context window.]")]
    # The note the model reads, and the report, both count the client's messages.
    assert message_text(note) == message_text(truncation_note(stands_for(dropped)))
    assert f"removed {stands_for(dropped)} earlier messages" in " ".join(result.notes)
