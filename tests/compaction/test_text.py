from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction import text as text_module
from compaction.text import (
    clip,
    clip_keeping,
    cut_middle,
    error_lines,
    fit_tokens,
    one_line,
    shrink_arguments,
    word_cut,
)
from compaction.tokens import TokenCounter


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter("gpt-4o")


def test_one_line_flattens_and_cuts_with_an_ellipsis() -> None:
    assert one_line("  a\n\tb  c ", 10) == "a b c"
    assert one_line("word " * 10, 11) == "word word…"  # no blank before the ellipsis
    assert len(one_line("x" * 50, 20)) == 20


def test_one_line_cuts_between_words() -> None:
    text = "the quick brown fox jumps over the lazy dog"
    assert one_line(text, 18) == "the quick brown…"
    assert word_cut(text, 12) == "the quick"
    assert word_cut(text, 15) == "the quick brown"  # the limit falls on a blank
    assert word_cut("a " + "x" * 40, 20) == "a " + "x" * 18  # one huge word: cut where it falls


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
        "AssertionError: assert 1 == 2",
        "FAILED tests/t.py::test_a - AssertionError",
        "ERROR: test_b (mod.Case)",
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


def test_cut_middle_keeps_both_ends_and_never_cuts_twice() -> None:
    text = "S" * 100 + "M" * 1_000 + "E" * 50
    cut = cut_middle(text, 100, 50)
    assert cut == "S" * 100 + "\n[… 1,000 characters cut …]\n" + "E" * 50
    assert cut_middle(cut, 100, 50) is cut
    short = "s" * 160
    assert cut_middle(short, 100, 50) is short  # the marker would not save anything


def test_clip_and_fit_tokens(counter: TokenCounter) -> None:
    assert clip("short", 10) == "short"
    clipped = clip("a" * 100 + "b" * 100, 60)
    assert clipped.startswith("a" * 40) and clipped.endswith("b" * 20)
    text = " ".join(f"word{i}" for i in range(1_000))
    fitted = fit_tokens(text, 50, counter)
    assert counter.count_text(fitted) <= 50
    assert fitted.startswith("word0 word1")
    assert fit_tokens("small", 50, counter) == "small"
    assert fit_tokens("anything", 0, counter) == ""


def test_argument_cutting_spares_short_values_and_cuts_the_longest_most() -> None:
    arguments = {"a": "A" * 2_000, "b": "B" * 300, "c": "short", "nested": [{"d": "D" * 900}]}
    parsed = json.loads(shrink_arguments(json.dumps(arguments), 400))
    assert parsed["c"] == "short"
    kept = [parsed["a"], parsed["b"], parsed["nested"][0]["d"]]
    assert all("chars cut]" in value for value in kept)
    assert len({value.index("…") for value in kept}) == 1  # one common cap


def test_arguments_that_are_not_json_are_cut_as_text() -> None:
    arguments = "not json " * 100
    shrunk = shrink_arguments(arguments, 200)
    assert len(shrunk) <= 200 and shrunk.startswith("not json not json")
    assert shrink_arguments(shrunk, 200) == shrunk


def test_arguments_with_many_short_values_stay_valid_json_above_the_limit() -> None:
    arguments = json.dumps({f"key_{i}": f"value_{i}" for i in range(100)})
    shrunk = shrink_arguments(arguments, 200)
    assert json.loads(shrunk) == json.loads(arguments)  # nothing to cut but spaces
    assert len(shrunk) < len(arguments)
    assert shrink_arguments(shrunk, 200) == shrunk


_JSON_TEXT = st.text(st.sampled_from(list('ab "\\\n\t\x01\x7fé…𝄞\ud800')), max_size=300)
_JSON_VALUES = st.recursive(
    st.one_of(_JSON_TEXT, st.integers(), st.booleans(), st.none()),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_JSON_TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES, st.integers(min_value=0, max_value=600), st.integers(0, 320))
def test_shrink_sizer_agrees_with_writing_the_json(value: object, limit: int, cap: int) -> None:
    # The binary search sizes candidates without writing them; it must say what writing says.
    written = len(text_module._dumps(text_module._cap_strings(value, cap)))
    assert text_module._sizer(value, limit)(cap) == (written <= limit)
