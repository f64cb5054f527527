from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from compaction.chat.groups import group_messages
from compaction.conversation.regions import head_end
from compaction.summary.extractive import extractive_summary
from compaction.summary.files import FileLists
from compaction.summary.prompts import SUMMARY_SECTIONS
from compaction.tokens.counter import TokenCounter
from tests.conftest import assistant, system, tool_group, user

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "mini-swe-agent"
COUNTER = TokenCounter("gpt-4o")

TRACEBACK = (
    "<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\n"
    '  File "calc.py", line 5, in division\n    return a/b\n'
    "ZeroDivisionError: division by zero\n</output>"
)


def session() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    head = [system(), user("Fix the division bug in src/calc.py so that dividing by zero works.")]
    middle = [
        assistant("THOUGHT: I will look at the file first. It is probably small."),
        *tool_group(
            "bash",
            {"command": "cat src/calc.py"},
            "<returncode>0</returncode>\n<output>\ndef division(a, b):\n    return a/b\n</output>",
        ),
        assistant("The function does not guard against zero. Let me reproduce the error."),
        *tool_group("bash", {"command": "python -c 'import calc; calc.division(1, 0)'"}, TRACEBACK),
        user("Please don't change the function signature."),
        assistant("I will add a check that raises ValueError instead."),
        *tool_group(
            "bash",
            {"command": "sed -i 's/return a\\/b/return safe(a, b)/' src/calc.py"},
            "<returncode>0</returncode>\n<output>\n</output>",
        ),
        *tool_group("read_file", {"path": "tests/test_calc.py"}, "def test_div():\n    ..."),
        assistant("Great! Next I will run the test suite with pytest to confirm the fix."),
    ]
    return head, middle


def summarize(middle: list[dict[str, Any]], **kwargs: Any) -> str:
    options: dict[str, Any] = {"head": (), "previous": (), "budget": 800, "instructions": None}
    options.update(kwargs)
    return extractive_summary(middle, counter=COUNTER, **options)


def test_sections_in_order() -> None:
    head, middle = session()
    text = summarize(middle, head=head)
    positions = [text.index(f"## {s}\n") for s in SUMMARY_SECTIONS]
    assert positions == sorted(positions)
    done, in_progress, blocked = (
        text.index(f"### {s}\n") for s in ("Done", "In Progress", "Blocked")
    )
    assert positions[2] < done < in_progress < blocked < positions[3]


def test_digest_of_a_session() -> None:
    head, middle = session()
    before = copy.deepcopy(middle)
    text = summarize(middle, head=head, files=FileLists((), ("src/calc.py",)))
    assert middle == before
    # Goal: the task from the head and the later user request.
    assert "Task: Fix the division bug in src/calc.py" in text
    assert "User: Please don't change the function signature." in text
    # Constraints: the user's rule.
    constraints = text.split("## Constraints & Preferences")[1].split("## Progress")[0]
    assert "don't change the function signature" in constraints
    # Done: commands with their outcomes.
    assert "bash: `cat src/calc.py` → exit 0, 2 lines" in text
    assert "→ exit 1, error: `ZeroDivisionError: division by zero`" in text
    assert "read_file `tests/test_calc.py`" in text
    # Blocked: the exact last error line.
    blocked = text.split("### Blocked")[1].split("## Key Decisions")[0]
    assert "ZeroDivisionError: division by zero" in blocked
    # Key decisions: sentences that decide something, not whatever comes first.
    decisions = text.split("## Key Decisions")[1].split("## Next Steps")[0]
    assert "- I will add a check that raises ValueError instead." in decisions
    assert "look at the file first" not in decisions
    assert "does not guard against zero" not in decisions
    assert "THOUGHT" not in text
    # Next steps: the last assistant plan.
    next_steps = text.split("## Next Steps")[1]
    assert "run the test suite with pytest" in next_steps
    assert "src/calc.py" in text.split("## Critical Context")[1]


def test_is_deterministic() -> None:
    head, middle = session()
    assert summarize(middle, head=head) == summarize(middle, head=head)


def test_instructions_are_kept_as_the_focus() -> None:
    _, middle = session()
    text = summarize(middle, instructions="keep the pytest details")
    assert "Focus requested for this summary: keep the pytest details" in text


def test_budget_keeps_the_newest_steps() -> None:
    middle = [
        m
        for i in range(200)
        for m in tool_group("bash", {"command": f"echo step-{i:03d}"}, f"step-{i:03d}")
    ]
    text = summarize(middle, budget=500)
    assert COUNTER.count_text(text) <= 500
    assert "step-198" in text  # newest Done item
    assert "step-199" in text  # In Progress
    assert "step-000" not in text
    assert "earlier steps not listed" in text


def test_tiny_budget_still_fits() -> None:
    head, middle = session()
    assert COUNTER.count_text(summarize(middle, head=head, budget=60)) <= 60


def test_previous_summary_goal_and_done_are_carried_over() -> None:
    head, middle = session()
    previous = (
        "## Goal\n- Migrate the config loader to TOML\n\n## Progress\n### Done\n"
        "- Rewrote `config/load.py` to use tomllib\n### Blocked\n- None\n\n"
        "## Key Decisions\n- Keep JSON support for one release\n\n"
        "## Critical Context\n- The CI runs Python 3.11"
    )
    text = summarize(middle, head=head, previous=[previous])
    goal = text.split("## Goal")[1].split("## Constraints")[0]
    assert "Migrate the config loader to TOML" in goal
    done = text.split("### Done")[1].split("### In Progress")[0]
    assert "Rewrote `config/load.py` to use tomllib" in done
    assert done.index("Rewrote") < done.index("cat src/calc.py")  # older first
    assert "Keep JSON support for one release" in text
    assert "The CI runs Python 3.11" in text
    assert "- None\n" not in text.split("### Blocked")[1].split("## Key")[0]


def test_rolling_twice_does_not_duplicate_the_task() -> None:
    head, middle = session()
    first = summarize(middle, head=head)
    second = summarize(middle[:3], head=head, previous=[first])
    assert second.count("Task: Fix the division bug") == 1


def test_turn_prefix_leaves_out_goal_and_constraints() -> None:
    _, middle = session()
    text = summarize(middle, turn_prefix=True, instructions="focus")
    assert "## Goal" not in text and "## Constraints" not in text
    assert text.startswith("## Progress")


def test_unstructured_previous_summary_becomes_context() -> None:
    text = summarize([assistant("ok then.")], previous=["We talked about the weather in Paris."])
    assert "We talked about the weather in Paris." in text.split("## Critical Context")[1]


def test_non_shell_tool_results() -> None:
    middle = tool_group(
        "get_reservation_details", {"reservation_id": "ZFA04Y"}, '{"status": "ok", "n": 1}'
    ) + tool_group("cancel", {"reservation_id": "ZFA04Y"}, "Error: reservation is basic economy")
    text = summarize(middle)
    assert 'get_reservation_details(reservation_id=ZFA04Y) → `{"status": "ok", "n": 1}`' in text
    assert "error: `Error: reservation is basic economy`" in text


# --- a real trajectory ---------------------------------------------------------


def _fixture(name: str) -> list[dict[str, Any]]:
    path = FIXTURES / name
    if not path.is_file():
        pytest.skip(f"real fixture {path} absent (standalone clone without ../shared/fixtures)")
    messages: list[dict[str, Any]] = json.loads(path.read_text())["messages"]
    return messages


def test_real_mini_swe_agent_trajectory() -> None:
    messages = _fixture("django__django-11141.json")
    end = head_end(messages, group_messages(messages), 2)
    head, middle = messages[:end], messages[end:-10]
    text = summarize(middle, head=head, budget=1_500)
    assert COUNTER.count_text(text) <= 1_500
    # The task, quoted from the head.
    assert "Allow migrations directories without __init__.py files" in text
    # Commands that were run, with outcomes.
    assert "`sed -i '89,91d' django/db/migrations/loader.py` → exit 0" in text
    assert "`python3 run_reproduction.py`" in text
    # The files modified with sed -i and cat <<EOF > …, via the condenser's lists.
    files = FileLists((), ("reproduce_app/apps.py", "django/db/migrations/loader.py"))
    with_files = summarize(middle, head=head, budget=1_500, files=files)
    assert "django/db/migrations/loader.py" in with_files.split("## Critical Context")[1]


def test_pruned_briefs_are_read_not_repeated() -> None:
    middle = [
        *tool_group(
            "bash",
            {"command": "pytest -q"},
            '[bash] "pytest -q" → 32 lines output (exit code 1, AssertionError: assert 2 == 3)',
        ),
        *tool_group("read_file", {"path": "src/app.py"}, "[read_file] src/app.py (45,210 chars)"),
        assistant("Next I will fix the assertion in src/app.py."),
    ]
    text = summarize(middle)
    assert "bash: `pytest -q` → exit 1, error: `AssertionError: assert 2 == 3`" in text
    assert "read_file `src/app.py` → 45,210 chars" in text
    assert "Error seen: `AssertionError: assert 2 == 3` (from bash: `pytest -q`)" in text


def test_results_pair_within_their_group_when_ids_repeat() -> None:
    middle = [
        *tool_group("think", {"thought": "plan it"}, "", call_id="dup"),
        *tool_group("search", {"query": "flights"}, "Error: no flights found", call_id="dup"),
    ]
    text = summarize(middle)
    assert "think(thought=plan it) → no output" in text
    assert "search(query=flights) → error: `Error: no flights found`" in text


# --- repetition and the task quote -----------------------------------------------

COMPLAINT = (
    "Please always provide EXACTLY ONE action in triple backticks, found {n} actions. "
    "Please format your action in triple backticks as shown in <response_example>."
)


def test_repeated_user_messages_appear_once_with_a_count() -> None:
    middle = [
        user("Run the tests before every commit, found 3 failures."),
        assistant("Sorry, running them now."),
        user("Run the tests before every commit, found 2 failures."),
        user("Also add a changelog entry."),
        user("Run the tests before every commit, found 2 failures."),
    ]
    text = summarize(middle, head=[system(), user("Fix the bug.")])
    goal = text.split("## Goal")[1].split("## Constraints")[0]
    constraints = text.split("## Constraints & Preferences")[1].split("## Progress")[0]
    assert "Run the tests" not in goal  # a reminder, not a request
    assert "User: Also add a changelog entry." in goal
    assert constraints.count("Run the tests") == 1
    assert "- User, 3 times: Run the tests before every commit, found 2 failures." in constraints


def test_a_harness_format_complaint_is_not_the_users_words() -> None:
    middle = [
        user(COMPLAINT.format(n=3)),
        assistant("Sorry, one action this time."),
        user(COMPLAINT.format(n=2)),
        user("Also add a changelog entry."),
        user(COMPLAINT.format(n=2)),
    ]
    text = summarize(middle, head=[system(), user("Fix the bug.")])
    assert "EXACTLY ONE" not in text
    assert "User: Also add a changelog entry." in text


def test_a_rule_repeated_in_different_messages_is_counted() -> None:
    middle = [
        user("Run the migration now. You must not touch tests/ at all."),
        user("Then update the docs. You must not touch tests/ at all."),
        user("Run step 1. Never push."),
        user("Run step 2. Never push."),  # the same message but for a number
    ]
    constraints = summarize(middle).split("## Constraints & Preferences")[1]
    assert "- You must not touch tests/ at all. (2 times)" in constraints
    assert "- User, 2 times: Run step 2." in constraints
    assert "- Never push. (2 times)" in constraints


def test_task_quote_is_compact() -> None:
    task = (
        "<pr_description>\nConsider the following PR description:\n"
        "Django Admin with Inlines not using UUIDField default value\n"
        + "Description of the bug, with many details about the models. " * 40
        + "\n</pr_description>"
    )
    text = summarize([assistant("Looking.")], head=[system(), user(task)])
    line = next(s for s in text.splitlines() if s.startswith("- Task: "))
    assert line.startswith("- Task: Django Admin with Inlines not using UUIDField default value")
    assert "<pr_description>" not in line and "Consider the following" not in line
    assert len(line) <= 260 and line.endswith(" …")
    assert line.removesuffix(" …").split()[-1] in task.split()  # cut between words


def test_long_text_without_sentence_ends_is_summarized_within_its_budget() -> None:
    # No sentence punctuation in 240,000 characters: the input a backtracking
    # sentence splitter would not finish on. How long it takes is for
    # ``make bench`` to say; here, that it ends, with a summary of bounded size.
    huge = "lorem ipsum " * 20_000
    middle = [user(huge), assistant(huge), assistant(huge), *tool_group("bash", {"command": huge})]
    text = summarize(middle, head=[system(), user(huge)], previous=[huge])
    assert "lorem ipsum" in text
    assert len(text) < len(huge)


# --- errors and decisions ------------------------------------------------------


def _failing_run(command: str, *errors: str) -> list[dict[str, Any]]:
    output = "\n".join(["collected 3 items", *errors])
    return tool_group(
        "bash", {"command": command}, f"<returncode>1</returncode>\n<output>\n{output}\n</output>"
    )


def test_the_last_five_distinct_error_lines_are_kept_whole() -> None:
    long_error = "ValueError: " + " ".join(f"detail{i}" for i in range(30))  # ~250 chars
    middle = [
        *_failing_run("python a.py", "KeyError: 'oldest'"),
        *_failing_run("python b.py", "TypeError: two", "TypeError: two"),
        *_failing_run("python c.py", "error: three", long_error),
        *_failing_run("pytest -q", "FAILED tests/t.py::test_x - AssertionError: four"),
        *_failing_run("python d.py", "fatal: five is the newest"),
    ]
    text = summarize(middle, budget=1_500)
    blocked = text.split("### Blocked")[1].split("## Key Decisions")[0]
    for error in (
        "TypeError: two",
        "error: three",
        long_error,
        "FAILED tests/t.py::test_x - AssertionError: four",
        "fatal: five is the newest",
    ):
        assert f"`{error}`" in blocked, error
    assert blocked.count("TypeError: two") == 1
    assert "KeyError: 'oldest'" not in blocked  # the sixth newest


def test_an_error_line_over_300_characters_is_cut_between_words() -> None:
    error = "RuntimeError: " + " ".join(f"word{i:03d}" for i in range(80))
    text = summarize(_failing_run("python run.py", error), budget=1_500)
    quoted = next(line for line in text.splitlines() if "Error seen" in line)
    kept = quoted.split("`")[1]
    assert kept.endswith("…") and len(kept) <= 300
    assert kept[:-1].split()[-1] in error.split()  # a whole word before the ellipsis


def test_errors_outrank_older_steps_in_a_small_budget() -> None:
    steps = [m for i in range(60) for m in tool_group("bash", {"command": f"echo {i}"}, "ok")]
    middle = [*_failing_run("pytest", "AssertionError: the one that matters"), *steps]
    text = summarize(middle, budget=300)
    assert "AssertionError: the one that matters" in text


def test_errors_printed_by_a_script_that_exits_0_count_but_file_contents_do_not() -> None:
    middle = [
        *tool_group(
            "bash",
            {"command": "python repro.py"},
            "<returncode>0</returncode>\n<output>\nValueError: caught and printed\n</output>",
        ),
        *tool_group(
            "bash",
            {"command": "sed -n '1,20p' src/lib.py"},
            "<returncode>0</returncode>\n<output>\nRaises:\nValueError: in a docstring\n</output>",
        ),
    ]
    blocked = summarize(middle).split("### Blocked")[1].split("## Key")[0]
    assert "ValueError: caught and printed" in blocked
    assert "in a docstring" not in blocked


@pytest.mark.parametrize(
    "sentence",
    [
        "I'll use a regex instead of the parser.",
        "We decided to keep the old API for now.",
        "Let's switch to the sqlite backend.",
        "The fix is to guard the division with a check.",
        "We should not touch the migrations at all.",
        "I will replace the loop with a comprehension.",
    ],
)
def test_decision_sentences_are_key_decisions(sentence: str) -> None:
    middle = [assistant(f"Looked at the code. {sentence} More later."), assistant("Done now.")]
    decisions = summarize(middle).split("## Key Decisions")[1].split("## Next Steps")[0]
    assert f"- {sentence}" in decisions
    assert "Looked at the code" not in decisions


@pytest.mark.parametrize(
    "text",
    [
        "Let me look at the file to see what it does.",
        "I'll run the tests to make sure nothing broke.",
        "The output shows three failures in the loader.",
    ],
)
def test_other_sentences_are_not_decisions(text: str) -> None:
    decisions = summarize([assistant(text), assistant("Next.")]).split("## Key Decisions")[1]
    assert "- None recorded" in decisions.split("## Next Steps")[0]


def test_no_line_is_cut_inside_a_word() -> None:
    request = " ".join(f"requirement{i}" for i in range(100))
    middle = [
        user(request),
        assistant("I'll use " + " ".join(f"choice{i}" for i in range(80)) + "."),
    ]
    text = summarize(middle, head=[system(), user("Fix it.")], budget=2_000)
    words = set(request.split()) | {f"choice{i}" for i in range(80)}
    for line in text.splitlines():
        if line.endswith("…"):
            assert line[:-1].split()[-1].strip("`") in words | {"use"}, line
