"""evaluation.facts: the eval's own rules for paths, error lines and typed messages."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import compaction
from evaluation.facts import (
    ERROR_CHARS,
    TYPED_CHARS,
    draw_facts,
    error_lines,
    last_errors,
    touched_paths,
    typed_messages,
)
from evaluation.probes import request_text
from evaluation.run import ledger_text
from tests.synthetic import tool_call

EVALUATION = Path(__file__).resolve().parents[2] / "evaluation"


def _bash(call_id: str, command: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [tool_call(call_id, "bash", {"command": command})],
    }


def _result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _session(*steps: tuple[str, str]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug."}]
    for i, (command, output) in enumerate(steps):
        messages += [_bash(f"c{i}", command), _result(f"c{i}", output)]
    return messages


# -- paths ------------------------------------------------------------------------


def test_a_dedicated_tools_file_arguments_are_touched_paths() -> None:
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                tool_call("a", "read_file", {"absolute_path": "/repo/src/app.py"}),
                tool_call("b", "edit", {"file_path": "./src/util.py", "old": "x", "new": "y"}),
                tool_call("c", "read_many_files", {"paths": ["docs/a.md", "docs/b.md"]}),
                tool_call("d", "glob", {"pattern": "**/*.py"}),
            ],
        }
    ]
    assert touched_paths(messages) == ["/repo/src/app.py", "src/util.py", "docs/a.md", "docs/b.md"]


def test_shell_commands_touch_their_file_operands_not_patterns_code_or_labels() -> None:
    messages = _session(
        ("cat django/forms/models.py | grep -n 'ValueError.py' setup.cfg", ""),
        ("sed -i 's/a.b/c.d/' src/x.py && python reproduce.py > out/log.txt 2>&1", ""),
        ("python -c 'import os.path' && python -m pytest tests/test_a.py::test_one -q", ""),
        ("cd /testbed && python tests/runtests.py queries.tests forms_tests.tests.test_forms", ""),
        ("cat <<'EOF' > fix.py\nimport helper.py\nopen('inside.txt')\nEOF\nls tests/ *.py", ""),
        ("curl https://example.com/a.json -o data.json", ""),
    )
    assert touched_paths(messages) == [
        "django/forms/models.py",
        "setup.cfg",
        "src/x.py",
        "reproduce.py",
        "out/log.txt",
        "tests/test_a.py",
        "tests/runtests.py",
        "fix.py",
        "data.json",
    ]


# -- error lines -----------------------------------------------------------------------


PYTEST = """\
============================= test session starts ==============================
tests/test_range.py F.                                                    [100%]
    def test_range():
>       assert parse_range(1, 3) == [1, 2, 3]
E       AssertionError: assert [1, 2] == [1, 2, 3]
FAILED tests/test_range.py::test_range - AssertionError: assert [1, 2] == [1, 2, 3]
==================== 3 failed, 68 passed, 1 xfailed in 4.74s ===================="""

UNITTEST = """\
FAIL: test_03 (tests.test_names.NamesTest)
----------------------------------------------------------------------
Ran 71 tests in 0.4s

FAILED (failures=3, errors=3, skipped=8)"""


def test_pytest_result_lines_are_error_lines_and_its_rule_is_trimmed() -> None:
    assert error_lines(PYTEST) == [
        "E       AssertionError: assert [1, 2] == [1, 2, 3]",
        "FAILED tests/test_range.py::test_range - AssertionError: assert [1, 2] == [1, 2, 3]",
        "3 failed, 68 passed, 1 xfailed in 4.74s",
    ]


def test_unittest_result_lines_are_error_lines() -> None:
    assert error_lines(UNITTEST) == [
        "FAIL: test_03 (tests.test_names.NamesTest)",
        "FAILED (failures=3, errors=3, skipped=8)",
    ]


def test_a_traceback_gives_its_last_line_even_without_an_error_name() -> None:
    output = (
        "Traceback (most recent call last):\n"
        '  File "a.py", line 3, in <module>\n    main()\nKeyboardInterrupt\ndone'
    )
    assert error_lines(output) == ["KeyboardInterrupt"]
    cut = (
        "Traceback (most recent call last):\n"
        '  File "a.py", line 3, in <module>\n</output_head>\n<elided_chars>\n'
        "During handling of the above exception, another exception occurred:\nok"
    )
    assert error_lines(cut) == []


def test_syntax_errors_exit_statuses_and_exceptions_count_but_harness_tags_do_not() -> None:
    output = "\n".join(
        [
            "<returncode>1</returncode>",
            '  File "x.py", line 4 SyntaxError: invalid syntax',
            "django.core.exceptions.ImproperlyConfigured: settings are not configured",
            "subprocess.CalledProcessError: Command 'make' returned non-zero exit status 2.",
            "Exit code: 0",
            "exit code 3",
            "Error: (none)",
            "AssertionError raised as expected (fix applied).",
            "all good",
        ]
    )
    assert error_lines(output) == [
        'File "x.py", line 4 SyntaxError: invalid syntax',
        "django.core.exceptions.ImproperlyConfigured: settings are not configured",
        "subprocess.CalledProcessError: Command 'make' returned non-zero exit status 2.",
        "exit code 3",
    ]


def test_a_file_being_shown_has_no_error_lines() -> None:
    source = "Error: this is a docstring of the module\nFAILED = 3"
    messages = _session(("cat src/app.py", source), ("sed -n '1,40p' src/app.py", source))
    assert last_errors(messages) == []
    assert last_errors(_session(("python src/app.py", source))) == [
        "Error: this is a docstring of the module",
        "FAILED = 3",
    ]


def test_the_last_five_distinct_error_lines_are_the_most_recent_ones_oldest_first() -> None:
    outputs = [f"ValueError: bad {i}" for i in range(7)] + ["ValueError: bad 2"]
    messages = _session(*((f"python run{i}.py", text) for i, text in enumerate(outputs)))
    assert last_errors(messages) == [f"ValueError: bad {i}" for i in (3, 4, 5, 6, 2)]


def test_errors_of_an_observation_sent_as_a_user_message_count() -> None:
    observation = (
        "<returncode>1</returncode>\n<output>\n"
        "TypeError: 'Exists' object is not subscriptable\n</output>"
    )
    messages = [{"role": "user", "content": "Fix it."}, {"role": "user", "content": observation}]
    assert last_errors(messages) == ["TypeError: 'Exists' object is not subscriptable"]


# -- typed messages ----------------------------------------------------------------------


def test_observations_summaries_and_client_reminders_are_not_typed_messages() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "<pr_description>\nFix   the admin.\n</pr_description>"},
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\nok\n</output>"},
        {
            "role": "user",
            "content": "Please always provide EXACTLY ONE action in triple backticks, found 2.",
        },
        {"role": "user", "content": "diff --git a/x.py b/x.py\n+fixed"},
        {"role": "user", "content": f"{compaction.SUMMARY_MARKER}\nSummary of 3 earlier messages"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "<system-reminder>\nskills\n</system-reminder>"}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>skills</system-reminder>"},
                {"type": "text", "text": "Now run the tests."},
            ],
        },
        {"role": "assistant", "content": "Sure."},
    ]
    assert typed_messages(messages) == [
        "<pr_description> Fix the admin. </pr_description>",
        "Now run the tests.",
    ]


# -- presence ----------------------------------------------------------------------------


def test_long_lines_and_messages_are_kept_by_their_first_characters() -> None:
    long_error = "ValueError: " + "x" * 300
    long_message = "Please " + "do this and that " * 40
    messages = [
        {"role": "user", "content": long_message},
        *_session(("python a.py", long_error))[1:],
    ]
    facts = {fact.kind: fact for fact in draw_facts(messages)}
    assert len(facts["error"].needle) == ERROR_CHARS
    assert len(facts["typed"].needle) <= TYPED_CHARS
    kept = request_text(
        [
            {
                "role": "user",
                "content": f"{long_message[:TYPED_CHARS]}\n{long_error[:ERROR_CHARS]}  a.py",
            }
        ]
    )
    assert all(fact.kept_in(kept) for fact in facts.values())
    shorter = request_text(
        [{"role": "user", "content": f"{long_message[:150]} {long_error[:100]}"}]
    )
    assert not facts["error"].kept_in(shorter)
    assert not facts["typed"].kept_in(shorter)


def test_the_ledgers_blocks_are_found_by_their_tags_in_a_summary_but_not_the_file_lists() -> None:
    summary = (
        "## Goal\nFix it.\n\n<ledger>\nerrors:\n- ValueError: x\n</ledger>\n"
        "<read-files>\na.py\n</read-files>"
    )
    assert ledger_text(summary) == ["<ledger>\nerrors:\n- ValueError: x\n</ledger>"]
    assert ledger_text("## Goal\nFix it.\n<read-files>\na.py\n</read-files>") == []
    blocks = (
        "<errors>\n- FAILED (failures=1)\n</errors>\n<commands>\n- pytest → exit 1\n</commands>\n"
        "<identifiers>\n- #123\n</identifiers>\n<user-messages>\n<user-message>Fix it."
        "</user-message>\n</user-messages>"
    )
    found = ledger_text(f"## Goal\nFix it.\n\n<read-files>\na.py\n</read-files>\n{blocks}")
    assert [block.split(">", 1)[0] for block in found] == [
        "<errors",
        "<commands",
        "<identifiers",
        "<user-messages",
    ]


# -- independence --------------------------------------------------------------------------

#: Modules that read the conversation as the summaries do, by design: the
#: probes score what the summaries were built to keep, and the judge shows a
#: model the conversation as the summarizer is shown it.
READS_LIKE_THE_SUMMARIES = {"probes.py", "judge.py"}


def _compaction_imports(path: Path) -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "compaction":
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.split(".")[0] == "compaction"]
    return found


def test_the_eval_uses_only_the_engines_public_api_outside_the_probes() -> None:
    public = set(compaction.__all__)
    for path in sorted(EVALUATION.glob("*.py")):
        if path.name in READS_LIKE_THE_SUMMARIES:
            continue
        for module, name in _compaction_imports(path):
            assert module == "compaction" and name in public, (path.name, module, name)


def test_the_facts_rules_import_neither_the_probes_nor_the_engines_internals() -> None:
    tree = ast.parse((EVALUATION / "facts.py").read_text())
    modules = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "evaluation.probes" not in modules
    assert {m for m in modules if m.startswith("compaction")} == {"compaction"}
