from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction.text import cuts as text_module
from compaction.text.cuts import (
    clip,
    cut_middle,
    one_line,
    shrink_arguments,
    without_reminders,
    word_cut,
)
from compaction.tokens.counter import TokenCounter, fit_tokens


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


def test_a_clients_reminders_are_taken_out_of_a_user_message() -> None:
    text = (
        "<system-reminder>\nToday's date is 2026-12-01.\n</system-reminder>\n"
        "Fix the parser.<system-reminder>unclosed, to the end"
    )
    assert without_reminders(text) == "\nFix the parser."
    assert without_reminders("no reminder here") == "no reminder here"


@given(st.lists(st.sampled_from(["<system-reminder>", "</system-reminder>", "ask", "\n"])))
def test_what_is_left_of_a_user_message_holds_no_reminder_opener(parts: list[str]) -> None:
    assert "<system-reminder>" not in without_reminders("".join(parts))


def test_arguments_nested_past_the_recursion_are_cut_as_plain_text() -> None:
    deep = "[" * 5_000 + "]" * 5_000
    cut = shrink_arguments(deep, 200)
    assert len(cut) <= 200 and cut.startswith("[[[")
    assert shrink_arguments(cut, 200) == cut
