"""evaluation.probes: what must be found, on a conversation where we know the answers."""

from __future__ import annotations

from typing import Any

from evaluation.probes import generate_probes, request_text
from tests.synthetic import tool_call

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing range test in tests/test_range.py.\nThanks!"},
    {
        "role": "assistant",
        "content": "Let me read the module first.",
        "tool_calls": [tool_call("c1", "read_file", {"path": "src/util.py"})],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "def parse_range(a, b):\n    ..."},
    {
        "role": "assistant",
        "content": "The root cause is the off-by-one in parse_range because the loop stops early.",
        "tool_calls": [
            tool_call("c2", "edit_file", {"path": "src/util.py", "old": "b", "new": "b + 1"})
        ],
    },
    {"role": "tool", "tool_call_id": "c2", "content": "Edited src/util.py."},
    {
        "role": "assistant",
        "content": "Next, I will run the tests again with max_items_42 set.",
        "tool_calls": [tool_call("c3", "bash", {"command": "pytest -q tests/test_range.py"})],
    },
    {
        "role": "tool",
        "tool_call_id": "c3",
        "content": "F.\nE   AssertionError: expected 3 got 4\n1 failed, 1 passed",
    },
]


def _by_name(name: str) -> list[Any]:
    return [p for p in generate_probes(CONVERSATION) if p.name == name]


def test_recall_finds_the_error_line_and_the_values_said() -> None:
    # The engine's error-line rule may also count the runner's "1 failed"
    # tally; the assertion is the line that must be there.
    errors = {p.needles: p for p in _by_name("error")}
    error = errors[("E AssertionError: expected 3 got 4",)]  # as printed, blanks made one
    assert "pytest -q tests/test_range.py" in error.question
    values = [p.needles[0] for p in _by_name("value")]
    assert "max_items_42" in values and "tests/test_range.py" in values


def test_artifacts_are_the_files_read_and_modified() -> None:
    assert [p.needles for p in _by_name("modified")] == [("src/util.py",)]
    assert _by_name("read") == []  # modified files are never listed as read


def test_continuation_is_the_task_the_last_plan_and_the_last_command() -> None:
    [task] = _by_name("task")
    assert task.needles == ("Fix the failing range test in tests/test_range.py.",)
    [plan] = _by_name("plan")
    assert plan.needles == ("Next, I will run the tests again with max_items_42 set.",)
    [command] = _by_name("command")
    assert command.needles == ("bash pytest -q tests/test_range.py", "F.")


def test_decisions_need_most_of_their_words() -> None:
    [decision] = _by_name("decision")
    assert "parse_range" in decision.needles and decision.share < 1
    reworded = "Found it: parse_range has an off-by-one, the loop stops early."
    assert decision.found_in(request_text([{"role": "user", "content": reworded}]))
    assert not decision.found_in(request_text([{"role": "user", "content": "parse_range"}]))


def test_every_probe_is_found_in_its_own_conversation_and_not_in_an_empty_one() -> None:
    probes = generate_probes(CONVERSATION)
    assert {p.kind for p in probes} == {"recall", "artifacts", "continuation", "decisions"}
    text = request_text(CONVERSATION)
    assert all(p.found_in(text) for p in probes)
    empty = request_text([{"role": "user", "content": "hello"}])
    assert not any(p.found_in(empty) for p in probes)


def test_a_dropped_output_loses_its_error_but_not_the_call() -> None:
    hidden = [*CONVERSATION[:-1], {**CONVERSATION[-1], "content": "[output hidden]"}]
    text = request_text(hidden)
    errors = _by_name("error")
    assert errors and not any(error.found_in(text) for error in errors)
    assert all(p.found_in(text) for p in _by_name("modified"))
