"""compaction.budget.lessons: the ratio's samples, which windows an overflow error
teaches, the proven floor, the figures a retry may aim at, and the empty stream
taken for an overflow."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction.budget.lessons import (
    EMPTY_STREAM_MIN_LIMIT,
    EMPTY_STREAM_SHRINK,
    WINDOW_BOUNDS,
    EmptyStream,
    OverflowReport,
    credible_report,
    empty_stream_lesson,
    proven_floor,
    ratio_sample,
    stream_answered,
    window_to_learn,
    working_limit_after_answer,
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


def test_an_empty_stream_above_every_answered_size_narrows_the_working_limit() -> None:
    lesson = empty_stream_lesson(EmptyStream(tokens=9_000, answered=5_000))
    assert lesson.overflow
    assert lesson.limit == int(9_000 * EMPTY_STREAM_SHRINK) == 6_750


def test_an_empty_stream_at_or_below_an_answered_size_is_not_an_overflow() -> None:
    for limit in (None, 7_000):
        lesson = empty_stream_lesson(EmptyStream(tokens=5_000, answered=5_000, limit=limit))
        assert not lesson.overflow and lesson.limit == limit  # nothing learned


def test_an_empty_answer_to_a_small_request_is_never_an_overflow() -> None:
    lesson = empty_stream_lesson(EmptyStream(tokens=EMPTY_STREAM_MIN_LIMIT, answered=0))
    assert not lesson.overflow and lesson.limit is None


def test_the_working_limit_never_falls_below_what_was_answered() -> None:
    lesson = empty_stream_lesson(EmptyStream(tokens=9_000, answered=8_000))
    assert lesson.overflow and lesson.limit == 8_000


def test_the_working_limit_only_narrows() -> None:
    assert empty_stream_lesson(EmptyStream(tokens=9_000, answered=0, limit=5_000)).limit == 5_000
    again = empty_stream_lesson(EmptyStream(tokens=6_000, answered=0, limit=6_750))
    assert again.overflow and again.limit == 4_500


@given(
    tokens=st.integers(0, 2_000_000),
    answered=st.integers(0, 1_000_000),
    limit=st.none() | st.integers(0, 1_000_000),
)
def test_a_narrowed_limit_lies_between_what_was_answered_and_what_failed(
    tokens: int, answered: int, limit: int | None
) -> None:
    if limit is not None:  # as the proxy keeps it: never below an answer, nor the minimum
        limit = max(limit, answered, EMPTY_STREAM_MIN_LIMIT)
    lesson = empty_stream_lesson(EmptyStream(tokens=tokens, answered=answered, limit=limit))
    if not lesson.overflow:
        assert lesson.limit == limit
        return
    assert max(answered, EMPTY_STREAM_MIN_LIMIT) <= lesson.limit < tokens
    assert limit is None or lesson.limit <= limit


def test_an_answer_above_the_working_limit_raises_it() -> None:
    assert working_limit_after_answer(6_000, 7_000) == 7_000
    assert working_limit_after_answer(6_000, 5_000) == 6_000
    assert working_limit_after_answer(None, 7_000) is None


def test_small_requests_teach_no_ratio() -> None:
    assert ratio_sample(30, 12) is None  # a template's few tokens would dominate
    assert ratio_sample(11_200, 10_000) == pytest.approx(1.12)
    assert ratio_sample(0, 10_000) is None


def test_a_count_far_from_any_tokenizers_is_a_misreading_and_teaches_nothing() -> None:
    """A server that counted only the new turn of a prompt it had cached says a
    tenth of it: not a tokenizer that counts a tenth."""
    assert ratio_sample(1_000, 10_000) is None
    assert ratio_sample(50_000, 10_000) is None
    assert ratio_sample(8_000, 10_000) == pytest.approx(0.8)


def test_a_count_below_the_text_sent_is_inconsistent_and_teaches_nothing() -> None:
    """A chat format that drops tool messages counts 2,469 of an estimated
    3,732: taken, it would pull the ratio to its floor and the next request
    would go uncompacted."""
    assert ratio_sample(2_469, 3_732) is None
    assert ratio_sample(7_000, 10_000) is None


def test_a_streamed_estimate_above_what_the_server_said_proves_nothing() -> None:
    """An answer to a prompt we estimated above the window the server states
    (or a size it refused) shows the server dropped part of it, not a larger
    window: the largest streamed prompt answered stays as it was."""
    assert stream_answered(5_000, 10_979, 8_192) == 5_000
    assert stream_answered(5_000, 7_000, 8_192) == 7_000
    assert stream_answered(5_000, 10_979, None) == 10_979
    assert stream_answered(9_000, 7_000, 8_192) == 9_000
