from __future__ import annotations

import copy
import re

import pytest

from compaction.chat.own import SUMMARY_MARKER, is_summary
from compaction.summary.checks import echo_problem
from compaction.summary.files import FileLists
from compaction.summary.format import summary_body, summary_message
from compaction.summary.prompts import (
    PROMPT_TAGS,
    ROLE_LABELS,
    SUMMARY_SECTIONS,
    SUMMARY_SYSTEM_PROMPT,
    TURN_PREFIX_SYSTEM_PROMPT,
    serialize_message,
    serialize_messages,
    summary_problem,
    summary_prompt,
    turn_prefix_prompt,
)
from tests.conftest import assistant, tool_group, user


def test_serialization_labels_every_kind_of_message() -> None:
    group = tool_group("bash", {"command": "ls -la"}, "total 0")
    text = serialize_messages(
        [
            {"role": "system", "content": "be brief"},
            user("Fix the bug"),
            assistant("Looking at it."),
            *group,
            {"role": "function", "name": "f", "content": "legacy result"},
        ],
        2_000,
    )
    assert text.splitlines() == [
        "[System]:",
        "> be brief",
        "",
        "[User]:",
        "> Fix the bug",
        "",
        "[Assistant]:",
        "> Looking at it.",
        "",
        "[Assistant tool calls]:",
        '> bash({"command": "ls -la"})',
        "",
        "[Tool result]:",
        "> total 0",
        "",
        "[Tool result]:",
        "> legacy result",
    ]


def test_assistant_text_and_calls_share_one_block() -> None:
    message = {**tool_group("read_file", {"path": "a.py"})[0], "content": "Reading."}
    assert serialize_message(message, 2_000) == (
        '[Assistant]:\n> Reading.\n[Assistant tool calls]:\n> read_file({"path": "a.py"})'
    )


def test_tool_results_are_cut_keeping_start_and_end() -> None:
    output = "START" + "x" * 10_000 + "Traceback: ValueError: boom END"
    text = serialize_message({"role": "tool", "tool_call_id": "c", "content": output}, 2_000)
    body = text.removeprefix("[Tool result]:\n> ")
    assert body.startswith("START")
    assert body.endswith("ValueError: boom END")
    assert "characters cut" in body
    assert len(body) <= 2_000 + 40


def test_long_arguments_are_cut_too() -> None:
    message = tool_group("write_file", {"path": "a.py", "content": "y" * 9_000})[0]
    assert len(serialize_message(message, 500)) < 700


def test_images_are_mentioned_not_inlined() -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
    assert serialize_message(message, 2_000) == "[User]:\n> what is this\n> [image]"


def test_summary_prompt_shape() -> None:
    prompt = summary_prompt("[User]:\n> hi", budget=700)
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert all(set(m) == {"role", "content"} for m in prompt)
    assert prompt[0]["content"] == SUMMARY_SYSTEM_PROMPT
    assert "<conversation>\n[User]:\n> hi\n</conversation>" in prompt[1]["content"]
    assert "700" in prompt[1]["content"]
    assert "<previous-summary>" not in prompt[1]["content"]
    assert "<focus>" not in prompt[1]["content"]


def test_system_prompt_asks_for_sections_in_order() -> None:
    positions = [SUMMARY_SYSTEM_PROMPT.index(f"## {s}\n") for s in SUMMARY_SECTIONS]
    assert positions == sorted(positions)
    for sub in ("### Done", "### In Progress", "### Blocked"):
        assert sub in SUMMARY_SYSTEM_PROMPT
    assert "file paths" in SUMMARY_SYSTEM_PROMPT and "error messages" in SUMMARY_SYSTEM_PROMPT


@pytest.mark.parametrize("prompt", [SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT])
def test_the_prompts_show_headings_and_no_sample_line_to_copy(prompt: str) -> None:
    lines = prompt.splitlines()
    assert not [ln for ln in lines if ln.lstrip().startswith(("-", "*", "•"))]
    headings = [ln for ln in lines if ln.startswith("#")]
    # The headings stand together, one after the other, with nothing under them.
    first = lines.index(headings[0])
    assert lines[first : first + len(headings)] == headings
    # Each is described in the prose above them, by name.
    prose = " ".join(lines[:first])
    for heading in headings:
        assert heading.lstrip("# ") in prose
    # The prompt's own text is what a reply may not repeat.
    assert echo_problem(prompt) is not None


def test_the_turn_prefix_prompt_shows_its_two_headings() -> None:
    headings = [ln for ln in TURN_PREFIX_SYSTEM_PROMPT.splitlines() if ln.startswith("#")]
    assert headings == ["## Done So Far", "## Context Needed Next"]


def test_every_tag_and_label_the_prompt_uses_is_one_the_checks_know() -> None:
    message = tool_group("bash", {"command": "ls"}, "ok")
    transcript = serialize_messages(
        [{"role": "system", "content": "s"}, user("u"), assistant("a"), *message], 2_000
    )
    texts = [
        m["content"]
        for prompt in (
            summary_prompt(transcript, previous=["p"], instructions="f", budget=9),
            turn_prefix_prompt(transcript, request="r", previous=["p"], instructions="f", budget=9),
        )
        for m in prompt
    ]
    tags = {t for text in texts for t in re.findall(r"</?([a-z-]+)>", text)}
    assert tags == set(PROMPT_TAGS)
    labels = {ln.split(":")[0] for ln in transcript.splitlines() if ln and ln[0] != ">"}
    assert labels <= set(ROLE_LABELS)


def test_summary_prompt_rolls_previous_summaries_and_focus() -> None:
    prompt = summary_prompt(
        "[User]: more", previous=["## Goal\n- old goal"], instructions="the auth bug", budget=500
    )
    content = prompt[1]["content"]
    assert "<previous-summary>\n## Goal\n- old goal\n</previous-summary>" in content
    assert "Update the previous summary" in content
    assert "<focus>\n> the auth bug\n</focus>" in content
    assert content.index("<previous-summary>") < content.index("<conversation>")


def test_turn_prefix_prompt() -> None:
    prompt = turn_prefix_prompt("[Assistant]: step", request="Add a flag", budget=500)
    assert prompt[0]["content"] == TURN_PREFIX_SYSTEM_PROMPT
    content = prompt[1]["content"]
    assert "<current-request>\n> Add a flag\n</current-request>" in content
    assert "<turn-steps>\n[Assistant]: step\n</turn-steps>" in content


def test_summary_message_shape() -> None:
    message = summary_message(
        "## Goal\n- g", condensed=12, files=FileLists(("a.py",), ("b.py",)), turn_prefix=False
    )
    assert message["role"] == "user"
    assert is_summary(message)
    lines = message["content"].splitlines()
    assert lines[0] == SUMMARY_MARKER
    assert "12 earlier messages" in lines[1]
    assert message["content"].endswith(
        "<read-files>\na.py\n</read-files>\n<modified-files>\nb.py\n</modified-files>"
    )
    prefix = summary_message("x", condensed=1, files=FileLists(), turn_prefix=True)
    assert "first 1 message of the current turn" in prefix["content"]
    assert "<read-files>" not in prefix["content"]


def test_summary_body_round_trips_a_summary_message() -> None:
    body = "## Goal\n- g\n\n## Next Steps\n- n"
    message = summary_message(body, condensed=3, files=FileLists(("a",)), turn_prefix=False)
    before = copy.deepcopy(message)
    assert summary_body(message["content"]) == body
    assert message == before


def test_summary_body_cleans_replies() -> None:
    reply = "<think>let me think</think>\n## Goal\n- g\n<read-files>\nx.py\n</read-files>"
    assert summary_body(reply) == "## Goal\n- g"
    assert summary_body("   \n") == ""


# --- what the summarizer sees of a tool result ---------------------------------


def test_a_clipped_tool_result_keeps_its_error_lines_exit_code_and_paths() -> None:
    noise = "".join(f"test_case_{i} PASSED\n" for i in range(500))
    output = (
        "<returncode>1</returncode>\n<output>\n"
        + noise
        + 'Traceback (most recent call last):\n  File "/repo/src/loader.py", line 88, in load\n'
        + "KeyError: 'migrations'\n"
        + noise
        + "FAILED (failures=1)\n</output>"
    )
    group = tool_group("bash", {"command": "python -m pytest tests/"}, output)
    text = serialize_messages(group, 2_000)
    quoted_result = text.split("[Tool result]:\n")[1]
    result = "\n".join(line.removeprefix("> ") for line in quoted_result.splitlines())
    assert len(result) <= 2_000
    assert "<returncode>1</returncode>" in result
    assert "KeyError: 'migrations'" in result and "FAILED (failures=1)" in result
    assert '/repo/src/loader.py", line 88' in result
    assert "characters cut …]" in result
    assert '[Assistant tool calls]:\n> bash({"command": "python -m pytest tests/"})' in text


# --- checking a reply -----------------------------------------------------------

GOOD_SUMMARY = """## Goal
- Fix the division bug in `src/calc.py`.

## Constraints & Preferences
- Do not change the function signature.

## Progress
### Done
- Reproduced `ZeroDivisionError: division by zero` with `python -c 'calc.division(1, 0)'`.
### In Progress
- Adding a guard in `division`.
### Blocked
- None

## Key Decisions
- Raise `ValueError` instead of returning `None`.

## Next Steps
- Run `pytest -q`.

## Critical Context
- Tests live in `tests/test_calc.py`.
"""


def test_a_summary_with_every_heading_is_usable() -> None:
    assert summary_problem(GOOD_SUMMARY) is None
    assert summary_problem("Here is the summary.\n\n" + GOOD_SUMMARY) is None
    assert summary_problem("<think>ok, let me see</think>\n" + GOOD_SUMMARY) is None


def test_headings_are_matched_leniently() -> None:
    bold = (
        "**Goal:** fix the bug\n**Constraints and Preferences:** none\n"
        "**Progress**\n- reproduced it\n**NEXT STEPS**: run the tests\n"
    )
    assert summary_problem(bold) is None
    plain = "Goal: fix it\nProgress: reproduced\nKey decisions: guard it\nNext steps: test"
    assert summary_problem(plain) is None
    levels = "# GOAL\nx\n### Progress (so far)\nx\n#### key decisions\nx\n## Next Steps:\nx"
    assert summary_problem(levels) is None


def test_one_dropped_section_is_tolerated_but_not_a_required_one() -> None:
    without_context = GOOD_SUMMARY.split("## Critical Context")[0]
    assert summary_problem(without_context) is None
    without_two = without_context.split("## Key Decisions")[0] + "## Next Steps\n- test\n"
    without_two = without_two.replace("## Constraints & Preferences", "Notes")
    assert summary_problem(without_two) is not None  # Goal, Progress, Next Steps: 3 of 6
    without_next = GOOD_SUMMARY.replace("## Next Steps", "Then")
    problem = summary_problem(without_next)
    assert problem is not None and "Next Steps" in problem
    without_goal = GOOD_SUMMARY.replace("## Goal", "## Aim")
    assert "Goal" in (summary_problem(without_goal) or "")


def test_a_heading_word_inside_a_sentence_is_not_a_heading() -> None:
    prose = (
        "Goal was unclear at first.\nProgress is slow.\nNext steps are obvious to the user.\n"
        "Key decisions were made.\n"
    )
    assert summary_problem(prose) is not None


def test_replies_that_continue_the_conversation_are_rejected() -> None:
    for reply in (
        "I'm ready to help. What's the next step?",
        "Sure, I can help you change your flight. Could you please provide your "
        "reservation ID and the new date you would like to travel?",
        "The tests pass now and the division is guarded. Would you like me to also "
        "update the documentation?",
        "Thank you for the details! I have cancelled reservation ZFA04Y.",
    ):
        problem = summary_problem(reply)
        assert problem is not None and "continues the conversation" in problem, reply


def test_a_question_before_the_headings_is_a_reply() -> None:
    problem = summary_problem("Do you want me to summarize this?\n\n" + GOOD_SUMMARY)
    assert problem is not None and "continues the conversation" in problem


def test_prose_without_headings_is_missing_them_and_empty_is_empty() -> None:
    problem = summary_problem("The user asked to fix a bug. The assistant ran the tests.")
    assert problem is not None and problem.startswith("missing section headings")
    assert summary_problem("  \n") == "the reply is empty"


def test_a_turn_prefix_note_needs_its_own_headings() -> None:
    note = "## Done So Far\n- Ran `pytest`.\n\n## Context Needed Next\n- `src/a.py` fails."
    assert summary_problem(note, turn_prefix=True) is None
    assert summary_problem("## Context Needed Next\n- x", turn_prefix=True) is None
    assert summary_problem(note) is not None  # not a full summary
    assert summary_problem(GOOD_SUMMARY, turn_prefix=True) is not None
