from __future__ import annotations

import pytest

from compaction.summary.steps import Step, tool_steps
from tests.conftest import tool_group


def only_step(name: str, arguments: dict[str, object], result: str) -> Step:
    (step,) = tool_steps(tool_group(name, arguments, result))
    return step


def test_a_call_without_a_result_has_no_outcome() -> None:
    call = tool_group("bash", {"command": "ls"})[0]
    (step,) = tool_steps([call])
    assert step == Step("bash: `ls`", None, None)
    assert step.line == "- bash: `ls`"


def test_a_shell_result_gives_exit_code_and_error_line() -> None:
    result = "<returncode>1</returncode>\n<output>\nTraceback …\nKeyError: 'x'\n</output>"
    step = only_step("bash", {"command": "python run.py\nmore"}, result)
    assert step.line == "- bash: `python run.py …` → exit 1, error: `KeyError: 'x'`"
    assert step.error == "KeyError: 'x'"


@pytest.mark.parametrize(
    ("brief", "outcome", "error"),
    [
        ('[bash] "pytest" → 32 lines output', "32 lines", None),
        ('[bash] "pytest" → 1 line output (exit code 0)', "exit 0, 1 line", None),
        (
            '[bash] "pytest" → 32 lines output (exit code 1, AssertionError: assert 2 == 3)',
            "exit 1, error: `AssertionError: assert 2 == 3`",
            "AssertionError: assert 2 == 3",
        ),
        # Error lines hold commas and brackets of their own.
        (
            '[bash] "pytest" → 9 lines output (exit code 2, TypeError: f() takes (a, b), [c])',
            "exit 2, error: `TypeError: f() takes (a, b), [c]`",
            "TypeError: f() takes (a, b), [c]",
        ),
        (
            '[bash] "a → b (c)" → 3 lines output (exit code 0, Error: x, 2 images)',
            "exit 0, 3 lines",
            None,
        ),
        (
            '[bash] "pytest" → 4 lines output (error: no such file (x), y)',
            "error: `error: no such file (x), y`",
            "error: no such file (x), y",
        ),
    ],
)
def test_pruned_command_briefs_are_read(brief: str, outcome: str, error: str | None) -> None:
    step = only_step("bash", {"command": "pytest"}, brief)
    assert (step.outcome, step.error) == (outcome, error)


@pytest.mark.parametrize(
    ("brief", "outcome"),
    [
        ("[read_file] src/a.py (45,210 chars)", "45,210 chars"),
        ("[read_file] src/a.py (45,210 chars, 2 images)", "45,210 chars, 2 images"),
        (
            "[read_file] src/a.py (900 chars, Error: bad (x), y, 1 image)",
            "error: `Error: bad (x), y`",
        ),
    ],
)
def test_pruned_sized_briefs_are_read(brief: str, outcome: str) -> None:
    assert only_step("read_file", {"path": "src/a.py"}, brief).outcome == outcome


def test_a_brief_of_another_tool_is_ordinary_text() -> None:
    step = only_step("bash", {"command": "cat x"}, "[read_file] x (10 chars)")
    assert step.outcome == "`[read_file] x (10 chars)`"


def test_huge_results_are_read_into_a_bounded_outcome() -> None:
    # Inputs a backtracking pattern would not finish on (no line ends, a
    # sentence per two characters, an unclosed bracket run). How long they
    # take is for ``make bench`` to say; here, that each ends, briefly told.
    results = ["x" * 300_000, "a." * 150_000, "lorem " * 50_000, "[bash] " + "(" * 100_000]
    for result in results:
        step = only_step("bash", {"command": "run"}, result)
        assert len(step.outcome) < 1_000


def test_a_result_keeps_every_distinct_error_line_whole() -> None:
    long_error = "ValueError: " + " ".join(f"part{i}" for i in range(40))  # ~250 chars
    output = "\n".join(
        [
            "<returncode>1</returncode>",
            "<output>",
            "TypeError: first",
            "KeyError: k",
            "TypeError: first",
            long_error,
            "FAILED (failures=2)",
            "</output>",
        ]
    )
    step = only_step("bash", {"command": "pytest"}, output)
    # Distinct, each where it was last seen.
    assert step.errors == ("KeyError: k", "TypeError: first", long_error, "FAILED (failures=2)")
    assert step.error == long_error  # the last exception line
    assert step.outcome is not None and step.outcome.startswith("exit 1, error: `ValueError: part0")
    assert len(step.outcome) < 200  # the Done line quotes it short, between words
    assert step.outcome.removesuffix("…`").split()[-1] in long_error.split()


def test_a_file_shown_is_not_an_error_but_a_script_printing_one_is() -> None:
    docstring = "<returncode>0</returncode>\n<output>\nRaises:\nValueError: if x\n</output>"
    assert only_step("bash", {"command": "sed -n '1,9p' a.py"}, docstring).errors == ()
    printed = "<returncode>0</returncode>\n<output>\nValueError: caught\n</output>"
    step = only_step("bash", {"command": "python repro.py"}, printed)
    assert step.errors == ("ValueError: caught",) and step.error is None


def test_a_brief_with_a_first_and_a_last_error_gives_both() -> None:
    brief = '[bash] "pytest" → 9 lines output (exit code 1, KeyError: a; last: FAILED (failures=1))'
    step = only_step("bash", {"command": "pytest"}, brief)
    assert step.errors == ("KeyError: a", "FAILED (failures=1)")
