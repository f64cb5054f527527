"""A model's summary that contradicts what the engine computed from its span is replaced.

The facts: the files the span read and modified (``collect_files``), and the task
(the head's first user message, or the Goal of the summary folded in). The
extractive summary, the fallback, never contradicts them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction.budget.profile import Profile
from compaction.chat.messages import message_text
from compaction.chat.own import is_summary
from compaction.stages.condenser import summary_budget
from compaction.summary.contradictions import (
    SpanFacts,
    contradiction_problem,
    credited_request_problem,
    goal_problem,
    modified_claim_problem,
    requests_of,
    summary_section,
    task_of,
    untouched_claim_problem,
)
from compaction.summary.extractive import extractive_summary
from compaction.summary.files import FileLists, collect_files
from compaction.summary.format import summary_body
from compaction.tokens.counter import TokenCounter
from tests.compaction.summary import small_model_replies as replies
from tests.compaction.summary.small_model_replies import condensed
from tests.conftest import assistant, user
from tests.synthetic import agent_session, conversations

Message = dict[str, Any]
COUNTER = TokenCounter("gpt-4o")
PROFILE = Profile(summarizer="llm")
#: The span of ``replies.span()`` without its edit: the loader was only read.
READ_ONLY = FileLists(read=("config/loader.py", "tests/test_config.py"))
EDITED = FileLists(read=("tests/test_config.py",), modified=("config/loader.py",))


def read_only_span() -> list[Message]:
    """The small models' span with the edit left out: ``config/loader.py`` is only read."""
    messages = replies.span()
    edit = next(
        i
        for i, m in enumerate(messages)
        if m["role"] == "assistant" and "edit_file" in str(m.get("tool_calls"))
    )
    return [*messages[:edit], *messages[edit + 2 :]]


# --- through condense -------------------------------------------------------------


def test_a_summary_naming_a_file_the_span_only_read_as_modified_is_replaced_with_the_reason() -> (
    None
):
    messages = read_only_span()
    assert collect_files(messages[2:], PROFILE).modified == ()
    result = condensed(replies.GOOD_TERSE, messages)  # it says it added the default
    assert result.summarizer_used == "extractive"
    assert result.notes == (
        "llm summary unusable (not a summary: names `config/loader.py` as modified, "
        "but the span only read it); used extractive",
    )


def test_the_same_summary_over_the_span_that_edited_the_file_is_taken() -> None:
    result = condensed(replies.GOOD_TERSE, replies.span())
    assert result.summarizer_used == "llm" and result.notes == ()


def test_a_summary_with_an_empty_goal_is_replaced_with_the_reason() -> None:
    reply = replies.GOOD_TERSE.replace(
        "- Make `tests/test_config.py::test_load_defaults` pass without changing the test.\n", ""
    )
    assert summary_section(reply, "goal") == [""]
    result = condensed(reply, replies.span())
    assert result.summarizer_used == "extractive"
    assert "drops the goal (its Goal section is empty)" in result.notes[0]


def test_a_summary_whose_goal_shares_no_word_of_the_task_is_replaced_with_the_reason() -> None:
    messages = replies.span()
    messages[1] = user("The loader ignores configured timeouts; repair the defaults handling.")
    reply = replies.GOOD_TERSE.replace(
        "- Make `tests/test_config.py::test_load_defaults` pass without changing the test.",
        "- Build a web application for managing user accounts.",
    )
    result = condensed(reply, messages)
    assert result.summarizer_used == "extractive"
    assert (
        "drops the goal (its Goal section shares no word of the task, such as " in (result.notes[0])
    )


@pytest.mark.parametrize("name", sorted(replies.GOOD))
def test_the_small_models_good_replies_contradict_nothing_of_their_span(name: str) -> None:
    messages = replies.span()
    facts = SpanFacts(collect_files(messages[2:], PROFILE), task_of(messages[:2], []))
    assert contradiction_problem(replies.GOOD[name], facts) is None
    assert condensed(replies.GOOD[name], messages).summarizer_used == "llm"


def test_a_folded_summary_is_checked_against_the_previous_summarys_goal() -> None:
    previous = "## Goal\n- Migrate the billing exporter to the streaming writer.\n"
    task = task_of([], [previous])
    assert "billing exporter" in task
    kept = "## Goal\n- Finish migrating the exporter.\n## Progress\n- ok"
    lost = "## Goal\n- Tidy things up.\n## Progress\n- ok"
    assert goal_problem(kept, task) is None
    assert goal_problem(lost, task) is not None


def test_the_heads_task_comes_before_a_previous_summarys_goal() -> None:
    head = [{"role": "system", "content": "sys"}, user("Speed up the nightly report job.")]
    assert task_of(head, ["## Goal\n- Something else entirely."]) == (
        "Speed up the nightly report job."
    )


def test_a_turn_prefix_note_has_no_goal_to_check() -> None:
    note = "## Done So Far\n- Ran `pytest`.\n\n## Context Needed Next\n- The loader."
    facts = SpanFacts(READ_ONLY, "Repair the configuration loader defaults", check_goal=False)
    assert contradiction_problem(note, facts) is None
    assert contradiction_problem(note, SpanFacts(READ_ONLY, facts.task)) is not None


# --- which path a verb is said of -------------------------------------------------


@pytest.mark.parametrize(
    ("line", "claimed"),
    [
        # The verb nearest before the path, within its clause.
        ("- Read `config/loader.py` and fixed the bug in `src/util.py`.", None),
        ("- Fixed the bug in `src/util.py` and read `config/loader.py`.", None),
        ("- Fixed the bug in `config/loader.py`.", "config/loader.py"),
        ("- Edited `src/util.py`, `config/loader.py` and `b.py`.", "config/loader.py"),
        ("- Fixed the bug after reading `config/loader.py`.", None),
        ("- Fixed `src/util.py`. Read `config/loader.py`.", None),
        ("- Changed `src/util.py`; `config/loader.py` holds the defaults.", None),
        # A passive verb after the path is its own.
        ("- `config/loader.py` was read, not modified.", None),
        ("- `config/loader.py` was modified to add the default.", "config/loader.py"),
        ("- `config/loader.py` has been updated.", "config/loader.py"),
        ("- `config/loader.py` was not changed.", None),
        # Negations, conditions and plans take the claim away.
        ("- Did not modify `config/loader.py`.", None),
        ("- Modified nothing in `config/loader.py`.", None),
        ("- Edited `src/util.py` but not `config/loader.py`.", None),
        ("- Once `config/loader.py` is updated, rerun the tests.", None),
        ("- Will need `config/loader.py` edited.", None),
        ("- `config/loader.py` hasn't been modified.", None),
        # Only past forms claim: a bare verb is a plan.
        ("- Fix the default in `config/loader.py`.", None),
        # A verb inside backticks is a quoted command.
        ("- Ran `git commit -m 'fixed' && cat config/loader.py`.", None),
        # A bare name stands for the listed path ending in it.
        ("- Updated `loader.py` with the default.", "config/loader.py"),
        ("- Updated /testbed/config/loader.py with the default.", "config/loader.py"),
        ("- Updated `other/loader.py` with the default.", None),
    ],
)
def test_a_modify_verb_is_said_of_the_path_nearest_after_it_in_its_clause(
    line: str, claimed: str | None
) -> None:
    problem = modified_claim_problem(f"## Progress\n{line}\n", READ_ONLY)
    if claimed is None:
        assert problem is None
    else:
        assert problem == f"names `{claimed}` as modified, but the span only read it"


def test_a_file_listed_as_modified_may_be_said_to_be_modified() -> None:
    assert modified_claim_problem("- Fixed `config/loader.py`.", EDITED) is None


def test_a_bare_name_a_modified_file_shares_claims_nothing() -> None:
    files = FileLists(read=("tests/loader.py",), modified=("config/loader.py",))
    assert modified_claim_problem("- Fixed `loader.py`.", files) is None
    assert modified_claim_problem("- Fixed `tests/loader.py`.", files) is not None


@pytest.mark.parametrize(
    "heading", ["## Modified files", "**Files modified:**", "### Changed files", "Modified:"]
)
def test_a_path_listed_under_a_modified_heading_is_claimed_modified(heading: str) -> None:
    reply = f"## Progress\n- ok\n{heading}\n- `config/loader.py`\n"
    assert modified_claim_problem(reply, READ_ONLY) is not None


def test_a_path_under_a_later_heading_is_no_longer_under_the_modified_one() -> None:
    reply = "## Modified files\n- `src/util.py`\n## Critical Context\n- `config/loader.py`\n"
    assert modified_claim_problem(reply, READ_ONLY) is None


def test_next_steps_are_plans_and_claim_nothing() -> None:
    reply = "## Next Steps\n- Edited `config/loader.py` is what it should look like.\n"
    assert modified_claim_problem(reply, READ_ONLY) is None
    assert modified_claim_problem(reply.replace("Next Steps", "Progress"), READ_ONLY) is not None


# --- the goal ---------------------------------------------------------------------


def test_a_task_of_fewer_than_three_content_words_is_not_checked() -> None:
    assert goal_problem("## Goal\n- Something.\n", "Fix the bug.") is None
    assert goal_problem("## Goal\n\n## Progress\n", "Please do it.") is None


def test_a_goal_restating_an_issue_after_long_harness_boilerplate_keeps_the_goal() -> None:
    boilerplate = "We're currently solving the following issue within our repository. " * 12
    task = f"{boilerplate}\nISSUE:\nMatrix.col_insert() shifts the identity block."
    assert len(boilerplate) > 600
    assert goal_problem("## Goal\n- Make `col_insert` keep the block.\n", task) is None
    assert goal_problem("## Goal\n- Tidy the docs.\n", task) is not None


def test_words_compare_without_their_plural_past_or_ing_endings() -> None:
    task = "Update the failing parser tests in the exporter"
    assert goal_problem("## Goal\n- Updating the parser.\n", task) is None
    assert goal_problem("## Goal\n- The test failed.\n", task) is None
    assert goal_problem("## Goal\n- Nothing relevant here.\n", task) is not None


@pytest.mark.parametrize(
    "reply",
    [
        "**Goal:** repair the exporter\n**Progress:** done",
        "Goal: repair the exporter\nProgress: done",
        "## Goal\n- repair the exporter\n## Progress\n- done",
        "## Goals\nRepair the exporter.\n",
    ],
)
def test_the_goal_is_read_under_any_heading_form(reply: str) -> None:
    assert goal_problem(reply, "Repair the streaming exporter quickly") is None


def test_a_goal_heading_with_text_after_its_colon_and_nothing_more_is_not_empty() -> None:
    assert summary_section("**Goal:** repair it\n**Progress:** ok", "goal") == ["repair it"]


def test_a_reply_without_a_goal_heading_drops_the_goal() -> None:
    assert goal_problem("## Progress\n- repaired the exporter\n", "Repair the streaming exporter")


# --- the extractive summary is never rejected ---------------------------------------


def _extractive(messages: list[Message], turn_prefix: bool) -> tuple[str, SpanFacts]:
    """The extractive summary of ``messages[2:]`` as the condenser writes it, and its facts."""
    span = messages[2:]
    ordinary = [m for m in span if not is_summary(m)]
    previous = [summary_body(message_text(m)) for m in span if is_summary(m)]
    files = collect_files(span, PROFILE)
    budget = summary_budget(sum(COUNTER.count_messages(span)), PROFILE, turn_prefix=turn_prefix)
    body = extractive_summary(
        ordinary,
        head=messages[:2],
        previous=previous,
        budget=budget,
        counter=COUNTER,
        files=files,
        turn_prefix=turn_prefix,
    )
    return body, SpanFacts(files, task_of(messages[:2], previous), not turn_prefix)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(max_items=12), st.booleans())
def test_the_extractive_summary_of_any_conversation_contradicts_none_of_its_facts(
    messages: list[Message], turn_prefix: bool
) -> None:
    body, facts = _extractive(messages, turn_prefix)
    assert contradiction_problem(body, facts) is None


@pytest.mark.parametrize("seed", range(6))
def test_the_extractive_summary_of_an_agent_session_that_read_files_it_never_edited_passes(
    seed: int,
) -> None:
    messages = agent_session(seed=seed, steps=8)
    body, facts = _extractive(messages, False)
    assert [p for p in facts.files.read if p not in facts.files.modified]
    assert contradiction_problem(body, facts) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(1, 30), st.booleans())
def test_the_extractive_summary_of_any_agent_session_contradicts_none_of_its_facts(
    seed: int, steps: int, turn_prefix: bool
) -> None:
    body, facts = _extractive(agent_session(seed=seed, steps=steps, output_chars=600), turn_prefix)
    assert contradiction_problem(body, facts) is None


FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures"


@pytest.mark.corpus
def test_the_extractive_summary_of_every_real_session_contradicts_none_of_its_facts() -> None:
    paths = sorted(FIXTURES.glob("*/*.json")) if FIXTURES.is_dir() else []
    if not paths:
        pytest.skip(f"contradiction corpus test skipped: no fixtures at {FIXTURES}")
    checked = read_only = 0
    for path in paths:
        body = json.loads(path.read_text())
        messages = body.get("messages") if isinstance(body, dict) else None
        if not messages or len(messages) < 6:
            continue  # a list of tool schemas, or too short to compact
        summary, facts = _extractive(messages[:-2], False)  # the tail stays
        checked += 1
        read_only += any(p not in facts.files.modified for p in facts.files.read)
        assert contradiction_problem(summary, facts) is None, path.name
    assert checked >= 100 and read_only >= 10, "too few sessions to show anything"


def test_the_extractive_summary_of_the_read_only_span_passes() -> None:
    body, facts = _extractive(read_only_span(), False)
    assert facts.files.read and not facts.files.modified
    assert contradiction_problem(body, facts) is None


# --- cost -------------------------------------------------------------------------


def _calls(reply: str, facts: SpanFacts) -> int:
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        contradiction_problem(reply, facts)
    finally:
        sys.setprofile(None)
    return count


def test_a_reply_is_checked_for_contradictions_in_work_linear_in_its_length() -> None:
    read = tuple(f"src/m{i}/f{i}.py" for i in range(200))
    facts = SpanFacts(FileLists(read=read), " ".join(f"word{i}x" for i in range(50)))
    line = "## Goal\n- Read `src/m1/f1.py` then was not edited /a/b/c/d/e.py is, `x`"

    def reply(n: int) -> str:
        return "\n".join([line] * n)

    assert _calls(reply(1_000), facts) <= 2.3 * _calls(reply(500), facts)


def test_the_task_is_the_users_words_not_a_clients_reminders() -> None:
    # Claude Code opens its first user message with context blocks; a summary's
    # Goal restates what the user asked, and must not be held to the date.
    first = user(
        "<system-reminder>\nAs you answer the user's questions, you can use the "
        "following context: currentDate Today's date is 2026-12-01.\n</system-reminder>\n"
        "Repair the window header parser returning strings."
    )
    task = task_of([first], [])
    assert "currentDate" not in task and "window header parser" in task
    assert goal_problem("## Goal\n- Repair the header parser.", task) is None


# --- claims of what the span did not do ---------------------------------------------

_READ_ONLY = FileLists(read=("src/app.py",), modified=("src/util.py",))


@pytest.mark.parametrize(
    ("reply", "claimed"),
    [
        ("- Edited `src/new_module.py` to add the parser.", "src/new_module.py"),
        ("- `docs/guide.md` was updated with the new flag.", "docs/guide.md"),
        ("- Fixed the bug in setup.cfg.", "setup.cfg"),
    ],
)
def test_an_edit_of_a_file_no_tool_call_touched_is_refused(reply: str, claimed: str) -> None:
    problem = untouched_claim_problem(reply, _READ_ONLY)
    assert problem == f"names `{claimed}` as modified, but no tool call of the span touched it"


@pytest.mark.parametrize(
    "reply",
    [
        "- Edited `src/util.py` and `util.py` again.",  # modified by the span
        "- Updated `/testbed/src/util.py`.",  # a listed path under a root
        "## Next Steps\n- Edit `src/new_module.py`.",  # a plan
        "- `src/new_module.py` was not modified.",  # negated
        "- Updated `config.DEFAULTS` and the `/testbed` checkout.",  # not files
    ],
)
def test_an_edit_the_span_made_or_a_plan_or_a_name_that_is_no_file_is_no_invention(
    reply: str,
) -> None:
    assert untouched_claim_problem(reply, _READ_ONLY) is None


def test_a_request_credited_to_the_user_that_the_user_never_made_is_refused() -> None:
    typed = "Fix the failing config test, and leave the test as it is."
    reply = "## Key Decisions\n- The user asked to commit the change and push the branch."
    problem = credited_request_problem(reply, typed)
    assert problem is not None and problem.startswith("credits the user with a request")
    # What the user did ask, in other words or in part, is theirs.
    assert credited_request_problem("- The user wants the config test fixed.", typed) is None
    assert credited_request_problem("- The user asked to fix it.", typed) is None  # too short
    assert credited_request_problem("- The user's config loads.", typed) is None  # no asking


def test_requests_are_what_was_typed_in_the_head_the_span_and_the_turn() -> None:
    head = [user("Fix the failing config test.")]
    span = [assistant("ok"), user("Also push the branch when done.")]
    requests = requests_of(head, span, ["## Goal\n- Keep the API stable."], "Open a pull request")
    reply = "- The user asked to push the branch, open a pull request and keep the API stable."
    assert credited_request_problem(reply, requests) is None
