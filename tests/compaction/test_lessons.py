"""compaction.lessons: the ratio's samples, which windows an overflow error
teaches, the proven floor, the figures a retry may aim at, and the empty stream
taken for an overflow."""

from __future__ import annotations

import pytest

from compaction.lessons import (
    EMPTY_STREAM_NEAR_LIMIT,
    WINDOW_BOUNDS,
    OverflowReport,
    credible_report,
    empty_stream_is_overflow,
    proven_floor,
    ratio_sample,
    window_to_learn,
)

LOW, HIGH = WINDOW_BOUNDS


def test_a_plausible_stated_window_is_remembered() -> None:
    lesson = window_to_learn(None, 8_192, proven=0)
    assert lesson.taken and lesson.remember == 8_192
    smaller = window_to_learn(8_192, 4_096, proven=1_000)
    assert smaller.taken and smaller.remember == 4_096


def test_a_window_already_learned_is_taken_but_not_remembered_again() -> None:
    lesson = window_to_learn(8_192, 8_192, proven=0)
    assert lesson.taken and lesson.remember is None


def test_a_window_outside_the_bounds_is_refused() -> None:
    for stated in (LOW - 1, HIGH + 1, 0):
        lesson = window_to_learn(None, stated, proven=0)
        assert not lesson.taken and lesson.remember is None
    assert window_to_learn(None, LOW, proven=0).taken
    assert window_to_learn(None, HIGH, proven=0).taken


def test_a_window_not_above_a_prompt_already_answered_is_refused() -> None:
    assert not window_to_learn(None, 8_000, proven=8_000).taken
    assert not window_to_learn(16_000, 4_000, proven=9_000).taken
    assert window_to_learn(None, 8_001, proven=8_000).taken


def test_the_proven_floor_only_rises() -> None:
    assert proven_floor(0, 5_000) == 5_000
    assert proven_floor(5_000, 3_000) == 5_000
    assert proven_floor(5_000, 7_000) == 7_000


def test_a_retry_aims_only_at_credible_figures() -> None:
    report = OverflowReport(window=8_192, count=9_000)
    assert credible_report(report, window_taken=True) == report
    assert credible_report(report, window_taken=False) == OverflowReport(count=9_000)
    absurd = OverflowReport(window=8_192, count=HIGH + 1)
    assert credible_report(absurd, window_taken=True) == OverflowReport(window=8_192)


def test_an_empty_stream_is_an_overflow_only_near_the_limit() -> None:
    limit = 10_000
    near = int(EMPTY_STREAM_NEAR_LIMIT * limit)
    assert empty_stream_is_overflow(near, limit)
    assert empty_stream_is_overflow(limit, limit)
    assert not empty_stream_is_overflow(near - 1, limit)


def test_small_requests_teach_no_ratio() -> None:
    assert ratio_sample(30, 12) is None  # a template's few tokens would dominate
    assert ratio_sample(11_200, 10_000) == pytest.approx(1.12)
    assert ratio_sample(0, 10_000) is None


def test_a_count_far_from_any_tokenizers_is_a_misreading_and_teaches_nothing() -> None:
    """A server that counted only the new turn of a prompt it had cached says a
    tenth of it: not a tokenizer that counts a tenth."""
    assert ratio_sample(1_000, 10_000) is None
    assert ratio_sample(50_000, 10_000) is None
    assert ratio_sample(7_000, 10_000) == pytest.approx(0.7)  # clamped later, not ignored
