"""compaction.text.clipping: tool results clipped for a summarizer, the lines that matter kept."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from compaction.text.clipping import clip_keeping, error_lines


def test_error_lines_are_found_by_shape_not_by_a_word() -> None:
    text = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "a.py", line 1, in <module>',
            "    raise ValueError('x')",
            "ValueError: x",
            "KeyboardInterrupt",
            "E       AssertionError: assert 1 == 2",
            "FAILED tests/t.py::test_a - AssertionError",
            "ERROR: test_b (mod.Case)",
            "FAIL: test_c (mod.Case)",
            "tests finished: 8 passed, 1 failed, in 0.09 seconds",
            "ERROR = 40",
            "error[E0308]: mismatched types",
            "src/a.c:3:5: error: unknown type",
            "fatal: not a git repository",
            "re.error: bad escape",
            "sed: can't read x.py: No such file or directory",
            "an error occurred somewhere",
            "AssertionError raised as expected",
            "npm ERR! missing script: test",
        ]
    )
    assert error_lines(text) == [
        "ValueError: x",
        "KeyboardInterrupt",
        "E       AssertionError: assert 1 == 2",  # as printed, prefix and all
        "FAILED tests/t.py::test_a - AssertionError",
        "ERROR: test_b (mod.Case)",
        "FAIL: test_c (mod.Case)",
        "tests finished: 8 passed, 1 failed, in 0.09 seconds",
        "error[E0308]: mismatched types",
        "src/a.c:3:5: error: unknown type",
        "fatal: not a git repository",
        "re.error: bad escape",
        "sed: can't read x.py: No such file or directory",
        "npm ERR! missing script: test",
    ]


def _noisy_result() -> str:
    noise = "".join(f"collecting item {i} in the suite\n" for i in range(400))
    return (
        "$ pytest -x tests/\n"
        + noise
        + "Traceback (most recent call last):\n"
        + '  File "/app/src/calc.py", line 12, in divide\n'
        + "    return a / b\n"
        + "ZeroDivisionError: division by zero\n"
        + noise
        + "FAILED tests/test_calc.py::test_div - ZeroDivisionError\n"
        + "1 failed in 0.2s\n"
        + "exit code 1\n"
    )


def test_clip_keeping_keeps_errors_command_status_and_paths_from_the_middle() -> None:
    text = _noisy_result()
    clipped = clip_keeping(text, 2_000)
    assert len(clipped) <= 2_000
    for kept in (
        "$ pytest -x tests/",
        '  File "/app/src/calc.py", line 12, in divide',
        "ZeroDivisionError: division by zero",
        "FAILED tests/test_calc.py::test_div - ZeroDivisionError",
        "exit code 1",
        "collecting item 0 in the suite",  # the start
    ):
        assert kept in clipped, kept
    # Every cut says how much; the counts add up to what is missing (give or
    # take the line break a marker shares with the text before it).
    marker = r"\[… ([\d,]+) characters cut …\]"
    cuts = [int(n.replace(",", "")) for n in re.findall(marker, clipped)]
    missing = len(text) - len(re.sub(r"\n?" + marker + r"\n", "", clipped))
    assert cuts and abs(sum(cuts) - missing) <= len(cuts)


def test_clip_keeping_cuts_a_long_error_line_between_words_and_leaves_short_text_alone() -> None:
    error = "RuntimeError: " + " ".join(f"part{i:03d}" for i in range(120))
    text = "start\n" + "noise line\n" * 300 + error + "\n" + "noise line\n" * 300 + "end\n"
    clipped = clip_keeping(text, 1_500)
    assert len(clipped) <= 1_500
    line = next(ln for ln in clipped.splitlines() if ln.startswith("RuntimeError"))
    assert 200 < len(line) <= 300 and line.split()[-1] in error.split()
    assert clip_keeping("short", 1_000) == "short"
    assert clip_keeping(clipped, 1_500) == clipped  # never clipped twice
    assert len(clip_keeping(text, 100)) <= 100 + 48  # tiny limits: start and end only


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="ab \nE:rF", max_size=3_000), st.integers(min_value=0, max_value=3_000))
def test_clip_keeping_never_exceeds_a_usable_limit(text: str, limit: int) -> None:
    clipped = clip_keeping(text, limit)
    if len(text) <= limit:
        assert clipped == text
    elif limit >= 400:
        assert len(clipped) <= limit


def test_a_traceback_ends_in_any_qualified_exception_and_pytest_reports_are_errors() -> None:
    # Lines the eval's own rule found the engine missing.
    text = "\n".join(
        [
            "django.core.exceptions.ImproperlyConfigured: Requested setting LOGGING_CONFIG",
            "numpy.core._exceptions._UFuncBinaryResolutionError: ufunc 'subtract'",
            "E       assert [] != []",
            "self.Name: int = 3",  # an annotation in code shown, not an error
            "E",
        ]
    )
    assert error_lines(text) == [
        "django.core.exceptions.ImproperlyConfigured: Requested setting LOGGING_CONFIG",
        "numpy.core._exceptions._UFuncBinaryResolutionError: ufunc 'subtract'",
        "E       assert [] != []",
    ]
