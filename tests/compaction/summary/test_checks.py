from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from compaction.budget.profile import Profile
from compaction.chat.messages import message_text
from compaction.chat.own import SUMMARY_MARKER, is_summary, recorded
from compaction.stages.condenser import condense, find_middle, summary_budget
from compaction.summary.checks import (
    Anchors,
    anchor_problem,
    echo_problem,
    markup_problem,
    span_anchors,
    unchanged_problem,
)
from compaction.summary.extractive import extractive_summary
from compaction.summary.files import collect_files
from compaction.summary.format import summary_body
from compaction.summary.prompts import PROMPT_TAGS, TURN_PREFIX_SYSTEM_PROMPT, summary_problem
from compaction.tokens.counter import TokenCounter
from tests.compaction.summary import small_model_replies as replies
from tests.compaction.summary.small_model_replies import condensed
from tests.conftest import RecordingSummarizer, assistant, tool_group, user
from tests.synthetic import agent_session, conversations

Message = dict[str, Any]
COUNTER = TokenCounter("gpt-4o")
PROFILE = Profile(summarizer="llm")


# --- the small models' replies, through condense --------------------------------


@pytest.mark.parametrize("name", sorted(replies.BAD))
def test_a_small_models_bad_reply_is_replaced_by_the_extractive_summary_with_the_reason(
    name: str,
) -> None:
    reply, reason = replies.BAD[name]
    assert summary_problem(reply) is None  # the headings alone let every one through
    result = condensed(reply)
    assert result.summarizer_used == "extractive"
    assert len(result.notes) == 1
    note = result.notes[0]
    assert note.startswith("llm summary unusable (not a summary: ") and reason in note, note
    assert note.endswith("used extractive")
    body = summary_body(message_text(result.summary))
    assert body != summary_body(reply)
    assert "Error seen: `E KeyError: 'timeout'`" in body  # the line as pytest printed it


@pytest.mark.parametrize("name", sorted(replies.GOOD))
def test_a_small_models_good_reply_is_taken(name: str) -> None:
    reply = replies.GOOD[name]
    result = condensed(reply)
    assert result.notes == ()
    assert result.summarizer_used == "llm"
    assert summary_body(message_text(result.summary)) == reply.strip()


def test_the_wrong_goal_names_what_the_span_held_in_its_note() -> None:
    note = condensed(replies.WRONG_GOAL).notes[0]
    assert "(such as `KeyError`, `test_config.py`, `pytest`)" in note


def test_an_echo_in_a_chunks_reply_stops_the_fold_before_the_next_call() -> None:
    """The next call would read the echo as the previous summary and keep it."""
    messages = agent_session(seed=3, steps=30)
    fake = RecordingSummarizer(
        lambda n: replies.ECHOED_TEMPLATE if n == 1 else replies.GOOD_TERSE + "\n- `pytest -q`"
    )
    result = asyncio.run(
        condense(
            messages,
            find_middle(messages, 2, len(messages) - 1),
            profile=Profile(summarizer="llm", summarizer_context_window=4_000),
            counter=COUNTER,
            summarizer=fake,
        )
    )
    assert len(fake.history) == 1
    assert result.summarizer_used == "extractive"
    assert "repeats the prompt's instructions" in result.notes[0]


def test_a_turn_prefix_note_naming_nothing_of_its_steps_is_replaced_too() -> None:
    steps = replies.span()[:-2]
    # A new request after the read: the tail starts inside its turn, at the last result.
    messages = [*steps[:8], user("Now make the loader strict too."), *steps[8:]]
    tail = len(messages) - 2
    note = "## Done So Far\n- Looked into things.\n\n## Context Needed Next\n- Nothing special."
    # The summary of the steps before the request: they read the loader, not yet edited it.
    main = replies.GOOD_TERSE.replace(
        "Added the `timeout` default to `DEFAULTS` in `config/loader.py`; the test passes.",
        "Read `config/loader.py`: `DEFAULTS` has no `timeout`.",
    )

    async def scripted(messages: list[Message], max_tokens: int) -> str:
        prefix = messages[0]["content"] == TURN_PREFIX_SYSTEM_PROMPT
        return note if prefix else main

    plan = find_middle(messages, 2, tail)
    assert plan.turn_start == 8
    result = asyncio.run(
        condense(messages, plan, profile=PROFILE, counter=COUNTER, summarizer=scripted)
    )
    assert len(result.notes) == 1
    assert result.notes[0].startswith("turn prefix: llm summary unusable (not a summary: names")
    assert summary_body(message_text(result.summary)) == main.strip()


# --- echo -----------------------------------------------------------------------


def test_a_line_copied_whole_from_the_prompt_is_an_echo() -> None:
    line = "Keep exact file paths, function and class names, commands, identifiers and error "
    problem = echo_problem(f"## Goal\n- Fix `a.py`.\n\n## Critical Context\n- {line}messages.")
    assert problem is not None and problem.startswith("repeats the prompt's instructions")


def test_a_prompt_clause_inside_a_longer_line_is_an_echo() -> None:
    assert echo_problem("- Done: completed steps and their outcomes, see above") is not None


def test_a_long_enough_part_of_a_prompt_clause_is_an_echo() -> None:
    assert echo_problem("- the work that was started and is not finished") is not None


def test_numbers_do_not_hide_an_echo_of_the_budget_sentence() -> None:
    assert echo_problem("Stay under about 1,234 tokens.") is not None


@pytest.mark.parametrize(
    "line",
    [
        "- None stated",
        "- None stated.",
        "- None",
        "- The user stated none.",
        "- Nothing is blocked.",
        "## Constraints & Preferences",
        "### In Progress",
        "- Run the whole suite, in order.",
        "- Facts needed to continue: the port is 8080.",
    ],
)
def test_a_summarys_own_short_line_sharing_the_prompts_words_is_no_echo(line: str) -> None:
    assert echo_problem(f"## Goal\n- Fix `a.py`.\n\n{line}") is None


def test_most_bullets_worded_from_the_prompt_is_an_echo() -> None:
    reply = (
        "## Progress\n- Steps completed and how each turned out.\n"
        "- Work started, is not finished.\n- Fixed `a.py`."
    )
    problem = echo_problem(reply)
    assert problem == "repeats the prompt's instructions (2 of 3 bullets)"


def test_one_bullet_worded_from_the_prompt_among_others_is_no_echo() -> None:
    reply = (
        "## Progress\n- Steps completed and how each turned out.\n"
        "- Fixed `a.py`.\n- Ran `pytest -q`: 3 passed."
    )
    assert echo_problem(reply) is None


# --- markup ---------------------------------------------------------------------


@pytest.mark.parametrize("tag", PROMPT_TAGS)
@pytest.mark.parametrize("form", ["<{}>", "</{}>", "<{}>".upper()])
def test_a_tag_of_the_prompt_opening_or_closing_is_markup(tag: str, form: str) -> None:
    text = form.replace("{}", tag.upper() if form.isupper() else tag)
    assert markup_problem(f"## Goal\n- Fix it. {text}") == (
        f"holds the prompt's markup ({text.lower()})"
    )


@pytest.mark.parametrize(
    "line",
    [
        "[User]: run it again",
        "- [Assistant]: I ran it.",
        "[Tool result]: exit 0",
        "[Assistant tool calls]: bash({})",
        "User: thanks",
        "**Assistant:** Running it.",
        "  assistant: next",
    ],
)
def test_a_line_starting_with_a_speaker_label_continues_the_transcript(line: str) -> None:
    problem = markup_problem(f"## Next Steps\n- Run it.\n{line}")
    assert problem is not None and problem.startswith("continues the transcript")


@pytest.mark.parametrize(
    "text",
    [
        "- User: asked for the timeout fix",
        "- User, 3 times: use tabs",
        "* Assistant: edited `a.py`",
        "- The conversation covered the loader; the focus was the timeout.",
        "- Read the `<read-files>` list.",
        "- Users: two admins",
    ],
)
def test_a_summarys_own_line_naming_a_speaker_or_a_word_of_the_markup_passes(text: str) -> None:
    assert markup_problem(f"## Goal\n{text}") is None


# --- anchors --------------------------------------------------------------------


def test_a_span_without_tool_calls_has_no_anchors_and_any_summary_passes() -> None:
    anchors = span_anchors([user("Tell me a story"), assistant("Once upon a time.")])
    assert not anchors
    assert anchor_problem("## Goal\n- A story.", anchors) is None


def test_the_anchors_are_file_names_programs_and_error_names() -> None:
    anchors = span_anchors(replies.span()[2:-2])
    assert set(anchors.paths) == {"test_config.py", "loader.py"}
    assert anchors.commands == ("pytest",)  # python -m pytest runs pytest
    assert set(anchors.errors) == {"KeyError", "test_config.py"}


def test_generic_programs_are_no_anchors() -> None:
    group = tool_group("bash", {"command": "cd build && ls -la && echo done"}, "ok")
    assert not span_anchors(group)


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        ("- edited `src/loader.py`", True),
        ("- KEYERROR raised", True),
        ("- `pytest` passed", True),
        ("- loader.pyc removed", False),
        ("- pytesting later", False),
        ("- a keyerrors list", False),
    ],
)
def test_an_anchor_is_named_only_apart_from_the_letters_around_it(reply: str, named: bool) -> None:
    anchors = Anchors(paths=("loader.py",), commands=("pytest",), errors=("KeyError",))
    assert (anchor_problem(reply, anchors) is None) is named


def test_an_error_line_without_a_name_anchors_on_its_first_words() -> None:
    result = "<returncode>1</returncode>\n<output>\nerror: linker command failed with exit code 1 (use -v)\n</output>"  # noqa: E501
    anchors = span_anchors(tool_group("shell_tool", {"query": "link it"}, result))
    assert anchors.errors == ("linker command failed with exit code 1",)
    assert anchor_problem("- `linker command failed with exit code 1 (use -v)`", anchors) is None


def test_earlier_summaries_in_the_span_lend_it_no_anchors() -> None:
    earlier = recorded(user(f"{SUMMARY_MARKER}\n## Goal\n- ran `pytest` on `old.py`"))
    assert not span_anchors([earlier])


# --- the previous summary copied back -------------------------------------------

PREVIOUS = (
    "## Goal\n- Fix the config tests.\n\n## Progress\n### Done\n- Ran `pytest -q`.\n\n"
    "## Key Decisions\n- Keep the test as it is.\n\n## Next Steps\n- Read the loader."
)


def _with_previous() -> list[Message]:
    """The span of the fixtures, with an earlier summary at its start."""
    steps = replies.span()
    return [
        *steps[:2],
        recorded(user(f"{SUMMARY_MARKER}\nSummary of 9 earlier messages.\n\n{PREVIOUS}")),
        *steps[2:],
    ]


def test_the_previous_summary_copied_back_over_a_span_with_news_is_replaced() -> None:
    result = condensed(PREVIOUS.replace("\n\n", "\n\n\n"), _with_previous())
    assert result.summarizer_used == "extractive"
    assert "repeats the previous summary and adds nothing of the span" in result.notes[0]


def test_the_previous_summary_with_one_line_of_news_is_taken() -> None:
    reply = PREVIOUS.replace(
        "- Ran `pytest -q`.", "- Ran `pytest -q`.\n- Fixed `config/loader.py`."
    )
    result = condensed(reply, _with_previous())
    assert result.notes == () and result.summarizer_used == "llm"


def test_the_previous_summary_unchanged_is_no_problem_when_the_span_named_nothing_new() -> None:
    anchors = Anchors(commands=("pytest",))
    assert unchanged_problem(PREVIOUS, [PREVIOUS], anchors) is None
    assert unchanged_problem(PREVIOUS, [], Anchors(paths=("loader.py",))) is None
    problem = unchanged_problem(
        "- ran `PYTEST -q`.\n* Fix the config tests.",
        [PREVIOUS],
        Anchors(commands=("pytest",), paths=("loader.py",)),
    )
    assert problem == (
        "repeats the previous summary and adds nothing of the span (such as `loader.py`)"
    )


# --- the fallback passes the same checks -----------------------------------------


def _crowded() -> list[Message]:
    """Text passed where paths were expected (hundreds of characters), after the
    one step that names the span's anchor: a conversation hypothesis found."""
    image: Message = {
        "role": "user",
        "content": [
            {"type": "text", "text": ""},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
    reads = tool_group("read_file", {"path": "", "extra": ""}, "", "")
    reads[0]["tool_calls"][1]["function"]["arguments"] = '{"path": "0", "extra": ""}'
    writes = tool_group("write_file", {"path": ""}, "", "")
    paths = ("lorem " * 100, ('{"k": 1} ' * 278)[:2500])
    for call, path in zip(writes[0]["tool_calls"], paths, strict=True):
        call["function"]["arguments"] = json.dumps({"path": path, "extra": ""})
    return [
        {"role": "system", "content": ""},
        user(""),
        image,
        image,
        user(""),
        user(""),
        user(""),
        *tool_group("read_file", {"path": "0:0a0", "extra": ""}, ""),
        *reads,
        image,
        {**writes[0], "content": "0000"},
        *writes[1:],
        image,
        image,
    ]


def _middle(messages: list[Message]) -> list[Message]:
    return [m for m in messages[2:] if not is_summary(m)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(max_items=12), st.booleans())
@example(_crowded(), True)  # the modified paths took the room of the step naming the anchor
def test_the_extractive_summary_passes_every_check_it_falls_back_from(
    messages: list[Message], turn_prefix: bool
) -> None:
    middle = _middle(messages)
    budget = summary_budget(sum(COUNTER.count_messages(middle)), PROFILE, turn_prefix=turn_prefix)
    body = extractive_summary(
        middle,
        head=messages[:2],
        budget=budget,
        counter=COUNTER,
        files=collect_files(middle, PROFILE),
        turn_prefix=turn_prefix,
    )
    assert echo_problem(body) is None
    assert markup_problem(body) is None
    assert anchor_problem(body, span_anchors(middle)) is None


@pytest.mark.parametrize("seed", range(6))
def test_the_extractive_summary_of_an_agent_session_names_its_anchors(seed: int) -> None:
    messages = agent_session(seed=seed, steps=40)
    result = condensed("not a summary", messages)
    assert result.summarizer_used == "extractive"
    body = summary_body(message_text(result.summary))
    anchors = span_anchors(_middle(messages))
    assert anchors and anchor_problem(body, anchors) is None
    assert echo_problem(body) is None and markup_problem(body) is None


# --- cost -----------------------------------------------------------------------


def _calls(check: Any, *args: Any) -> int:
    """The Python and C calls ``check(*args)`` makes: doubling the input about doubles
    them when the checks loop over lines and anchors as they should, and more than
    that when a loop nests over the input. Work inside one C call (a substring
    search of one line) is not counted; each reads a line or an anchor's matches."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        check(*args)
    finally:
        sys.setprofile(None)
    return count


def _hostile_reply(lines: int) -> str:
    """Lines made of what each check looks for, none of them making it stop early."""
    pieces = [
        "- the work that was started and",  # a part of a clause, one word short
        "- Steps completed and how each",
        "[User",
        "  Assistant",
        "- `loader.p` and keyerrors, pytesting",
        "< conversation> </ previous-summary",
    ]
    return "\n".join(pieces[i % len(pieces)] + f" {i}" for i in range(lines))


def _hostile_span(steps: int) -> list[Message]:
    messages: list[Message] = []
    for i in range(steps):
        command = f"prog{i} --flag `x` : `y` tests/test_{i}.py && other{i}"
        result = f"<returncode>1</returncode>\n<output>\nE   Error{i}Error: bad `{i}`\n</output>"
        messages.extend(tool_group("bash", {"command": command}, result))
    return messages


@pytest.mark.parametrize(
    "check",
    [echo_problem, markup_problem, lambda r: anchor_problem(r, span_anchors(_hostile_span(60)))],
    ids=["echo", "markup", "anchors"],
)
def test_a_reply_is_checked_in_work_linear_in_its_length(check: Any) -> None:
    small, large = _calls(check, _hostile_reply(500)), _calls(check, _hostile_reply(1_000))
    assert large <= 2.3 * small


def test_a_spans_anchors_are_found_in_work_linear_in_its_steps() -> None:
    small = _calls(span_anchors, _hostile_span(100))
    assert _calls(span_anchors, _hostile_span(200)) <= 2.3 * small
