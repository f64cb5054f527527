from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from typing import Any

import pytest

import compaction.stages.summarizing as summarizing_module
import compaction.summary.contradictions as contradictions_module
import compaction.summary.extractive as extractive_module
from compaction.budget.profile import Profile
from compaction.chat.groups import validate_tool_pairing
from compaction.chat.messages import OPAQUE_KEY, message_text
from compaction.chat.own import SUMMARY_MARKER, is_summary
from compaction.chat.typed import first_typed
from compaction.errors import SummarizationError
from compaction.stages.condenser import (
    CondenseResult,
    Middle,
    condense,
    find_middle,
    summary_budget,
)
from compaction.stages.pruner import prune
from compaction.summary.files import FileLists, parse_file_lists
from compaction.summary.format import summary_message
from compaction.summary.ledger import parse_ledger
from compaction.summary.prompts import SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT
from compaction.tokens.counter import TokenCounter
from compaction.types import SummarizerMode
from tests.conftest import (
    SUMMARY_REPLY,
    RecordingSummarizer,
    assistant,
    system,
    tool_group,
    user,
)

Message = dict[str, Any]
COUNTER = TokenCounter("gpt-4o")
#: The suite's reply, naming files the span of :func:`conversation` read: a
#: summary that names none of its span's paths is not taken.
REPLY = SUMMARY_REPLY.replace("- Read the modules", "- Read `src/mod0.py` to `src/mod11.py`")


def output(i: int, chars: int = 3_000) -> str:
    body = "\n".join(f"line {n} of output {i}: some text here" for n in range(chars // 40))
    return f"<returncode>0</returncode>\n<output>\n{body}\n</output>"


def conversation(steps: int = 12, chars: int = 3_000) -> list[Message]:
    messages = [system(), user("Fix the parser in src/parser.py.")]
    for i in range(steps):
        messages.append(assistant(f"Step {i}: looking further."))
        messages.extend(tool_group("bash", {"command": f"cat src/mod{i}.py"}, output(i, chars)))
    messages.append(user("Now also update the docs."))
    messages.append(assistant("Sure."))
    return messages


def run(
    messages: Sequence[Message],
    plan: Middle,
    *,
    fake: RecordingSummarizer | None = None,
    instructions: str | None = None,
    mode: SummarizerMode = "llm",
    kept_after: Sequence[Message] = (),
    **profile: Any,
) -> CondenseResult:
    return asyncio.run(
        condense(
            messages,
            plan,
            profile=Profile(summarizer=mode, **profile),
            counter=COUNTER,
            summarizer=fake,
            instructions=instructions,
            kept_after=kept_after,
        )
    )


def last_user(messages: Sequence[Message]) -> int:
    return max(i for i, m in enumerate(messages) if m["role"] == "user")


# --- find_middle -------------------------------------------------------------


def test_plan_without_split_when_the_tail_starts_at_a_user_message() -> None:
    messages = conversation(3)
    tail = last_user(messages)
    plan = find_middle(messages, 2, tail)
    assert plan == Middle(2, tail, None, ())
    assert plan.turn_start is None
    assert plan.main_end == tail


def test_plan_split_turn_finds_the_opener_in_the_middle() -> None:
    messages = [
        system(),
        user("task"),
        assistant("a"),
        user("second request"),  # 3: opens the turn the tail starts inside
        *tool_group("bash", {"command": "ls"}),  # 4, 5
        *tool_group("bash", {"command": "pwd"}),  # 6, 7: tail
    ]
    plan = find_middle(messages, 2, 6)
    assert plan.turn_start == 3
    assert plan.turn_start is not None
    assert plan.main_end == 3


def test_plan_turn_opened_in_the_head_is_no_split() -> None:
    messages = [system(), user("task"), *tool_group("bash", {"command": "ls"}), assistant("x")]
    assert find_middle(messages, 2, 4).turn_start is None


def test_plan_looks_past_earlier_summaries_for_the_opener() -> None:
    old = summary_message("## Goal\n- g", condensed=4, files=FileLists(), turn_prefix=False)
    messages = [
        system(),
        user("task"),
        old,  # 2
        user("request"),  # 3
        summary_message("- steps", condensed=2, files=FileLists(), turn_prefix=True),  # 4
        *tool_group("bash", {"command": "ls"}),  # 5, 6
        assistant("tail"),  # 7
    ]
    plan = find_middle(messages, 2, 7)
    assert plan.turn_start == 3
    assert plan.previous_summaries == (2, 4)
    only_summary = [system(), user("task"), old, assistant("tail")]
    assert find_middle(only_summary, 2, 3).turn_start is None


def test_plan_rejects_bad_bounds() -> None:
    messages = conversation(1)
    with pytest.raises(ValueError):
        find_middle(messages, 3, 2)
    with pytest.raises(ValueError):
        find_middle(messages, 0, len(messages) + 1)


# --- budget ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [(0, 500), (1_000, 500), (10_000, 2_000), (20_000, 4_000), (1_000_000, 4_000)],
)
def test_summary_budget_is_clamped(tokens: int, expected: int) -> None:
    assert summary_budget(tokens, Profile()) == expected


def test_turn_prefix_budget_has_half_the_ceiling() -> None:
    assert summary_budget(1_000_000, Profile(), turn_prefix=True) == 2_000
    assert summary_budget(1_000, Profile(), turn_prefix=True) == 500
    tight = Profile(summary_min_tokens=800, summary_max_tokens=1_000)
    assert summary_budget(1_000_000, tight, turn_prefix=True) == 800


# --- the llm path --------------------------------------------------------------


def test_llm_summary_replaces_the_middle() -> None:
    messages = conversation()
    before = copy.deepcopy(messages)
    tail = last_user(messages)
    fake = RecordingSummarizer(REPLY)
    result = run(messages, find_middle(messages, 2, tail), fake=fake)

    assert messages == before
    assert result.summarizer_used == "llm"
    assert result.summarizer_calls == 1 == len(fake.history)
    assert result.notes == ()
    # head + summary + tail, with head and tail the very same objects
    assert len(result.messages) == 2 + 1 + (len(messages) - tail)
    assert all(a is b for a, b in zip(result.messages[:2], messages[:2], strict=True))
    assert all(a is b for a, b in zip(result.messages[3:], messages[tail:], strict=True))
    summary = result.messages[2]
    assert summary is result.summary
    assert summary["role"] == "user" and is_summary(summary)
    content = message_text(summary)
    assert content.startswith(SUMMARY_MARKER + "\n")
    assert f"Summary of {tail - 2} earlier messages" in content
    assert REPLY in content
    assert "<read-files>\nsrc/mod0.py\nsrc/mod1.py" in content
    assert result.summary_tokens == COUNTER.count_message(summary)
    assert result.replaced_tokens == sum(COUNTER.count_messages(messages[2:tail]))
    assert result.summary_tokens < result.replaced_tokens
    assert validate_tool_pairing(result.messages) == []


def test_llm_prompt_has_no_tools_and_the_budget_as_max_tokens() -> None:
    messages = conversation()
    tail = last_user(messages)
    fake = RecordingSummarizer()
    run(messages, find_middle(messages, 2, tail), fake=fake)
    prompt, max_tokens = fake.history[0]
    middle_tokens = sum(COUNTER.count_messages(messages[2:tail]))
    # The budget is a fifth of the middle; the ledger takes at most its share of it.
    budget = summary_budget(middle_tokens, Profile())
    assert budget == round(middle_tokens * 0.2)
    assert budget * (1 - Profile().ledger_share) <= max_tokens <= budget
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert all(set(m) == {"role", "content"} for m in prompt)
    assert prompt[0]["content"] == SUMMARY_SYSTEM_PROMPT
    text = prompt[1]["content"]
    assert "[Assistant]:\n> Step 0: looking further." in text
    assert '[Assistant tool calls]:\n> bash({"command": "cat src/mod0.py"})' in text
    assert "[Tool result]:\n> <returncode>0</returncode>" in text
    assert "characters cut" in text  # 3,000-char outputs cut to 2,000
    assert "<previous-summary>" not in text


def test_rolling_summary_is_passed_as_previous_summary() -> None:
    old_body = "## Goal\n- Port the lexer\n\n## Progress\n### Done\n- Wrote `lexer.c`"
    old = summary_message(
        old_body,
        condensed=30,
        files=FileLists(("a/read.py",), ("a/changed.py",)),
        turn_prefix=False,
    )
    messages = conversation()
    messages.insert(2, old)
    tail = last_user(messages)
    plan = find_middle(messages, 2, tail)
    assert plan.previous_summaries == (2,)
    fake = RecordingSummarizer()
    result = run(messages, plan, fake=fake)
    text = fake.prompt_text()
    assert f"<previous-summary>\n{old_body}\n</previous-summary>" in text
    assert "Update the previous summary" in text
    conversation_part = text.split("<conversation>")[1]
    assert SUMMARY_MARKER not in conversation_part and "Port the lexer" not in conversation_part
    lists = parse_file_lists(message_text(result.summary))
    assert lists.read[0] == "a/read.py" and "src/mod0.py" in lists.read
    assert lists.modified == ("a/changed.py",)


def test_instructions_reach_the_prompt() -> None:
    messages = conversation()
    fake = RecordingSummarizer()
    run(
        messages,
        find_middle(messages, 2, last_user(messages)),
        fake=fake,
        instructions="keep the parser errors",
    )
    assert "<focus>\n> keep the parser errors\n</focus>" in fake.prompt_text()


# --- fallbacks -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fake", "note"),
    [
        (RecordingSummarizer(error=TimeoutError("read timed out")), "TimeoutError: read timed out"),
        (RecordingSummarizer(error=RuntimeError("429 rate limited")), "RuntimeError: 429"),
        (RecordingSummarizer(reply="   \n"), "empty reply"),
        (RecordingSummarizer(reply="<think>hmm</think>"), "empty reply"),
        (RecordingSummarizer(reply=REPLY + " word" * 40_000), "not shorter"),
    ],
)
def test_llm_failure_falls_back_to_extractive(fake: RecordingSummarizer, note: str) -> None:
    messages = conversation()
    tail = last_user(messages)
    result = run(messages, find_middle(messages, 2, tail), fake=fake)
    assert result.summarizer_used == "extractive"
    assert result.summarizer_calls == len(fake.history) == 1
    assert len(result.notes) == 1
    assert note in result.notes[0] and result.notes[0].endswith("used extractive")
    content = message_text(result.summary)
    assert content.startswith(SUMMARY_MARKER)
    assert "## Goal" in content and "`cat src/mod11.py`" in content
    assert result.summary_tokens < result.replaced_tokens


def test_llm_mode_without_summarizer_uses_extractive_with_a_note() -> None:
    messages = conversation()
    result = run(messages, find_middle(messages, 2, last_user(messages)))
    assert result.summarizer_used == "extractive"
    assert result.summarizer_calls == 0
    assert result.notes == ("no llm summarizer available; used extractive",)


def test_extractive_mode_never_calls_the_summarizer() -> None:
    messages = conversation()
    fake = RecordingSummarizer()
    result = run(
        messages,
        find_middle(messages, 2, last_user(messages)),
        fake=fake,
        mode="extractive",
        instructions="mind the docs",
    )
    assert fake.history == []
    assert result.summarizer_used == "extractive" and result.notes == ()
    assert "mind the docs" in message_text(result.summary)


def test_cancellation_is_not_swallowed() -> None:
    messages = conversation()
    fake = RecordingSummarizer(error=asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        run(messages, find_middle(messages, 2, last_user(messages)), fake=fake)


# --- refusals --------------------------------------------------------------------


def test_empty_middle_raises() -> None:
    messages = conversation(2)
    with pytest.raises(SummarizationError, match="empty"):
        run(messages, find_middle(messages, 2, 2), fake=RecordingSummarizer())


def test_summary_not_shorter_raises() -> None:
    messages = [system(), user("task"), assistant("ok"), user("next")]
    with pytest.raises(SummarizationError, match="not shorter"):
        run(messages, find_middle(messages, 2, 3), mode="extractive")


def test_only_earlier_summaries_raises() -> None:
    old = summary_message("- g", condensed=3, files=FileLists(), turn_prefix=False)
    messages = [system(), user("task"), old, user("next")]
    with pytest.raises(SummarizationError, match="only earlier summaries"):
        run(messages, find_middle(messages, 2, 3), mode="extractive")


def test_mode_off_raises() -> None:
    messages = conversation()
    with pytest.raises(SummarizationError):
        run(messages, find_middle(messages, 2, last_user(messages)), mode="off")


# --- map → fold ------------------------------------------------------------------


def test_large_middle_is_summarized_in_chunks_that_fit() -> None:
    window = 4_000
    messages = conversation(steps=30)
    tail = last_user(messages)
    fake = RecordingSummarizer(reply=lambda n: f"## Goal\n- running summary {n}\n{REPLY[8:]}")
    result = run(
        messages, find_middle(messages, 2, tail), fake=fake, summarizer_context_window=window
    )
    calls = len(fake.history)
    assert calls > 2
    assert result.summarizer_calls == calls
    assert result.summarizer_used == "llm"
    for i, (prompt, max_tokens) in enumerate(fake.history):
        assert sum(COUNTER.count_messages(prompt)) + max_tokens <= window
        text = prompt[1]["content"]
        if i:
            assert f"<previous-summary>\n## Goal\n- running summary {i}\n" in text
    # Every step reached the summarizer exactly once, in order.
    seen = [
        n
        for prompt, _ in fake.history
        for n in range(30)
        if f'cat src/mod{n}.py"' in prompt[1]["content"]
    ]
    assert seen == list(range(30))
    assert "running summary " + str(calls) in message_text(result.summary)


def test_one_group_too_large_for_a_chunk_is_cut_harder() -> None:
    window = 3_000
    messages = [
        system(),
        user("task"),
        *tool_group("bash", {"command": "cat big.log"}, "x" * 1_900, "y" * 1_900, "z" * 1_900),
        user("next"),
    ]
    fake = RecordingSummarizer()
    run(messages, find_middle(messages, 2, 6), fake=fake, summarizer_context_window=window)
    assert len(fake.history) == 1
    prompt, max_tokens = fake.history[0]
    assert sum(COUNTER.count_messages(prompt)) + max_tokens <= window


# --- split turns -----------------------------------------------------------------


def split_conversation() -> list[Message]:
    return [
        system(),
        user("Fix the parser."),  # 1 (head)
        *tool_group("read_file", {"path": "src/parser.py"}, output(0)),  # 2, 3
        assistant("Parser fixed."),  # 4
        user("Now add tests for it."),  # 5: opens the turn the tail starts inside
        *tool_group("bash", {"command": "cat tests/test_parser.py"}, output(1)),  # 6, 7
        *tool_group("write_file", {"path": "tests/test_new.py"}, output(2)),  # 8, 9
        *tool_group("bash", {"command": "pytest -q"}, "3 passed"),  # 10, 11: tail
        assistant("Done."),  # 12
    ]


def test_split_turn_output_shape() -> None:
    messages = split_conversation()
    before = copy.deepcopy(messages)
    plan = find_middle(messages, 2, 10)
    assert plan.turn_start == 5
    fake = RecordingSummarizer()
    result = run(messages, plan, fake=fake)
    assert messages == before
    out = result.messages
    assert len(out) == 2 + 1 + 1 + 1 + 3
    assert out[0] is messages[0] and out[1] is messages[1]
    assert is_summary(out[2]) and out[2] is result.summary
    assert out[3] is messages[5]
    assert is_summary(out[4])
    assert "first 4 messages of the current turn" in message_text(out[4])
    assert "<modified-files>\ntests/test_new.py\n</modified-files>" in message_text(out[4])
    assert "<read-files>\nsrc/parser.py\n</read-files>" in message_text(out[2])
    assert all(a is b for a, b in zip(out[5:], messages[10:], strict=True))
    assert validate_tool_pairing(out) == []
    # Two calls: the main summary, then the turn prefix with its own prompt.
    assert [p[0]["content"] for p, _ in fake.history] == [
        SUMMARY_SYSTEM_PROMPT,
        TURN_PREFIX_SYSTEM_PROMPT,
    ]
    assert result.summarizer_calls == 2
    prefix_prompt = fake.prompt_text(1)
    assert "<current-request>\n> Now add tests for it.\n</current-request>" in prefix_prompt
    assert "cat tests/test_parser.py" in prefix_prompt and "src/parser.py" not in prefix_prompt
    assert "Now add tests" not in fake.prompt_text(0)
    replaced = sum(COUNTER.count_messages(messages[2:5] + messages[6:10]))
    assert result.replaced_tokens == replaced


def test_split_turn_with_nothing_before_the_turn() -> None:
    messages = split_conversation()
    messages = messages[:2] + messages[5:]  # the turn opens right after the head
    plan = find_middle(messages, 2, 7)
    assert plan.turn_start == 2
    result = run(messages, plan, mode="extractive")
    out = result.messages
    assert out[2] is messages[2]
    assert is_summary(out[3]) and out[3] is result.summary
    assert "current turn" in message_text(out[3])
    assert "## Goal" not in message_text(out[3])
    assert len(out) == 2 + 2 + (len(messages) - 7)


def test_split_turn_fallback_is_reported_per_summary() -> None:
    messages = split_conversation()
    fake = RecordingSummarizer(error=ConnectionError("refused"))
    result = run(messages, find_middle(messages, 2, 10), fake=fake)
    assert result.summarizer_used == "extractive"
    assert len(result.notes) == 2
    assert result.notes[1].startswith("turn prefix: llm summarizer failed (ConnectionError")


@pytest.mark.parametrize("mode", ["llm", "extractive"])
def test_the_heads_task_is_read_once_for_both_summaries_of_a_split_turn(
    monkeypatch: pytest.MonkeyPatch, mode: SummarizerMode
) -> None:
    # Each summary's ledger, extractive Goal and check of a model's Goal want
    # the task; the head is the same for all of them.
    reads: list[int] = []

    def counted(messages: Sequence[Message]) -> str:
        reads.append(len(messages))
        return first_typed(messages)

    for module in (summarizing_module, extractive_module, contradictions_module):
        monkeypatch.setattr(module, "first_typed", counted)
    messages = split_conversation()
    result = run(messages, find_middle(messages, 2, 10), fake=RecordingSummarizer(), mode=mode)
    assert sum(map(is_summary, result.messages)) == 2
    assert result.summarizer_calls == (2 if mode == "llm" else 0)  # each reply checked
    assert reads == [2]


# --- file lists from the arguments before pruning ------------------------------

LONG_SED = "sed -i '" + "s/old_name/new_name/g;" * 20 + "' django/db/models/fields/__init__.py"


def test_file_lists_come_from_the_originals_before_pruning() -> None:
    profile = Profile(summarizer="extractive", tool_args_chars=200)
    originals = conversation(steps=30, chars=400)  # results short enough to stay unpruned
    arguments = {"command": LONG_SED, "description": "Rename old_name to new_name. " * 9}
    originals[4:4] = tool_group("bash", arguments, "<returncode>0</returncode>")
    pruned = prune(originals, 2, last_user(originals), profile).messages
    assert "fields/__init__.py" not in str(pruned[4]["tool_calls"])  # the path was cut
    plan = find_middle(pruned, 2, last_user(pruned))

    def summary(**originals_: Any) -> str:
        result = asyncio.run(
            condense(pruned, plan, profile=profile, counter=COUNTER, summarizer=None, **originals_)
        )
        return message_text(result.summary)

    without = summary()
    assert "django/db/models/fields/__init__.py" not in without
    assert "chars cut]" in without  # the digest quoted the cut command
    with_originals = summary(originals=originals)
    assert parse_file_lists(with_originals).modified == ("django/db/models/fields/__init__.py",)
    assert "chars cut]" not in with_originals
    assert LONG_SED[:60] in with_originals


def test_originals_must_match_the_messages() -> None:
    messages = conversation()
    with pytest.raises(ValueError, match="originals"):
        asyncio.run(
            condense(
                messages,
                find_middle(messages, 2, last_user(messages)),
                profile=Profile(summarizer="extractive"),
                counter=COUNTER,
                summarizer=None,
                originals=messages[:-1],
            )
        )


# --- pinned messages ------------------------------------------------------------


def test_a_system_message_in_the_middle_is_kept_verbatim_right_after_the_summary() -> None:
    messages = conversation()
    agents = {"role": "system", "content": "Available agent types: general, explore, plan."}
    messages.insert(5, agents)
    tail = last_user(messages)
    fake = RecordingSummarizer()
    plan = find_middle(messages, 2, tail)
    assert plan.pinned == (5,)
    result = run(messages, plan, fake=fake)
    out = result.messages
    assert is_summary(out[2]) and out[3] is agents
    assert all(a is b for a, b in zip(out[4:], messages[tail:], strict=True))
    # Not history: the summarizer never reads it, and it is not counted as replaced.
    assert "Available agent types" not in fake.prompt_text()
    assert f"Summary of {tail - 3} earlier messages" in message_text(out[2])
    assert result.replaced_tokens == sum(COUNTER.count_messages(messages[2:tail])) - (
        COUNTER.count_message(agents)
    )


def test_a_condensed_summary_with_its_pinned_message_condenses_to_the_same_layout() -> None:
    """Rolling over the previous summary leaves the pinned message where it was:
    the forwarded bytes change only where the summary does."""
    messages = conversation()
    messages.insert(5, {"role": "developer", "content": "Answer in French."})
    first = run(messages, find_middle(messages, 2, last_user(messages)), mode="extractive")
    later = [*first.messages, *conversation(steps=6)[2:]]
    second = run(later, find_middle(later, 2, last_user(later)), mode="extractive")
    assert [m["role"] for m in second.messages[:4]] == ["system", "user", "user", "developer"]
    assert second.messages[3] is messages[5]


def test_pinned_messages_of_a_split_turn_follow_the_summary_of_their_part() -> None:
    messages = split_conversation()
    before_turn = {"role": "system", "content": "Plan mode is on."}
    inside_turn = {"role": "system", "content": "Plan mode is off."}
    messages.insert(8, inside_turn)  # among the steps of the turn the tail starts inside
    messages.insert(4, before_turn)  # before the turn's opener
    plan = find_middle(messages, 2, 12)
    assert plan.turn_start == 6 and plan.pinned == (4, 9)
    out = run(messages, plan, fake=RecordingSummarizer()).messages
    assert is_summary(out[2]) and out[3] is before_turn
    assert out[4] is messages[6] and is_summary(out[5]) and out[6] is inside_turn
    assert all(a is b for a, b in zip(out[7:], messages[12:], strict=True))
    assert validate_tool_pairing(out) == []


def test_a_middle_of_pinned_messages_only_has_nothing_to_condense() -> None:
    messages = [system(), user("go"), {"role": "system", "content": "x"}, user("now")]
    with pytest.raises(SummarizationError, match="nothing to condense"):
        run(messages, find_middle(messages, 2, 3), mode="extractive")


# --- opaque content -------------------------------------------------------------


def test_a_group_holding_a_part_no_summary_can_stand_for_rides_along_whole() -> None:
    messages = conversation()
    call, result = tool_group("tool_search", {"query": "select:fetch"}, "")
    reference = {"type": "tool_reference", "tool_name": "fetch"}
    result = {**result, "content": [{"type": "text", "text": "loaded"}, reference]}
    messages[5:5] = [call, result]  # between two groups
    tail = last_user(messages)
    plan = find_middle(messages, 2, tail)
    assert plan.pinned == (5, 6)
    fake = RecordingSummarizer()
    out = run(messages, plan, fake=fake).messages
    assert is_summary(out[2]) and out[3] is call and out[4] is result
    assert all(a is b for a, b in zip(out[5:], messages[tail:], strict=True))
    assert "select:fetch" not in fake.prompt_text()
    assert validate_tool_pairing(out) == []


def test_a_caller_marks_what_no_summary_can_stand_for() -> None:
    messages = conversation()
    marked = {"role": "user", "content": "counted", OPAQUE_KEY: True}
    unmarked = {"role": "user", "content": [{"type": "item", "item": {}}], OPAQUE_KEY: False}
    messages[5:5] = [marked, unmarked]
    assert find_middle(messages, 2, last_user(messages)).pinned == (5,)


def test_a_middle_of_opaque_groups_only_is_not_condensed() -> None:
    call, result = tool_group("tool_search", {"query": "q"}, "")
    result = {**result, "content": [{"type": "tool_reference", "tool_name": "fetch"}]}
    messages = [system(), user("go"), call, result, user("now")]
    with pytest.raises(SummarizationError, match="nothing to condense"):
        run(messages, find_middle(messages, 2, 4), mode="extractive")


# --- a summary is never larger than what it stands for ----------------------------


def test_a_span_smaller_than_its_summary_is_kept_as_it_was() -> None:
    # Codex's environment message alone before the turn the tail starts in: a
    # summary of it (its header, its sections) would be several times its size.
    messages = split_conversation()
    messages[2:5] = [user("<environment_context>\n  <cwd>/work/app</cwd>\n</environment_context>")]
    plan = find_middle(messages, 2, 8)
    assert plan.turn_start == 3
    result = run(messages, plan, mode="extractive")
    out = result.messages
    assert out[2] is messages[2]  # kept, not "Summary of 1 earlier message"
    assert out[3] is messages[3]
    assert is_summary(out[4]) and out[4] is result.summary
    assert "current turn" in message_text(out[4])
    assert sum(1 for m in out if is_summary(m)) == 1
    assert COUNTER.count_message(result.summary) < sum(COUNTER.count_messages(messages[4:8]))
    assert result.replaced_tokens == sum(COUNTER.count_messages(messages[4:8]))


def test_a_summary_with_room_for_nothing_is_not_written() -> None:
    # Room for the header alone: a "Summary of N earlier messages" over nothing
    # would say the span was summarized when it was dropped.
    messages = [
        system(),
        user("Fix the parser."),
        *[assistant(f"Thought {i}. " * 40) for i in range(6)],
    ]
    messages.append(user("Next."))
    plan = find_middle(messages, 2, 8)
    profile = Profile(summarizer="extractive")
    header = COUNTER.count_message(summary_message("", condensed=6, turn_prefix=False))
    with pytest.raises(SummarizationError, match="no room for a summary of 6 messages"):
        asyncio.run(
            condense(messages, plan, profile=profile, counter=COUNTER, summarizer=None, cap=header)
        )


def test_the_ledger_names_what_a_cut_turn_kept_after_the_summary_used() -> None:
    # A turn kept after the span only as the pruner left it (its long text
    # cut in the middle) has its names in the summary's ledger.
    messages = conversation()
    reasoning = "I see os.path.basename in _is_ignored_file. " + "Thinking it over. " * 600
    middle = find_middle(messages, 2, last_user(messages))
    condensed = run(messages, middle, mode="extractive", kept_after=[assistant(reasoning)])
    text = message_text(condensed.summary)
    assert "<identifiers>" in text
    assert "os.path.basename" in text and "_is_ignored_file" in text


def test_the_ledger_leaves_out_the_names_the_kept_messages_hold() -> None:
    # A name the messages after the summary still show needs no ledger entry;
    # one only the condensed span used keeps its entry.
    messages = conversation()
    messages[-1] = assistant("Sure: parse_header_value, then src/mod3.py again.")
    messages[2] = assistant("Step 0: parse_header_value and parse_window_size look wrong.")
    middle = find_middle(messages, 2, last_user(messages))
    ledger = parse_ledger(message_text(run(messages, middle, mode="extractive").summary))
    assert "parse_window_size" in ledger.identifiers
    assert "parse_header_value" not in ledger.identifiers
    assert "src/mod3.py" not in ledger.identifiers and "src/mod2.py" in ledger.identifiers
