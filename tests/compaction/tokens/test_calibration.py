"""compaction.tokens.calibration: the ratio follows what a model usually counts, and no
one answer moves it by more than a step."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction import Profile, calibrated_budget
from compaction.budget.lessons import MAX_RATIO, MIN_RATIO
from compaction.tokens.calibration import (
    MAX_STEP,
    WINDOW,
    Calibration,
    answers_to_follow,
    calibrate,
    restored_calibration,
)

samples = st.floats(min_value=0.5, max_value=3.0, allow_nan=False)
ratios = st.floats(min_value=MIN_RATIO, max_value=MAX_RATIO, allow_nan=False)


def _after(history: list[float], start: Calibration | None = None) -> Calibration:
    calibration = start
    for sample in history:
        calibration = calibrate(calibration, sample)
    assert calibration is not None
    return calibration


def test_the_first_answer_is_taken_as_it_is_within_the_bounds() -> None:
    assert calibrate(None, 1.12).ratio == pytest.approx(1.12)
    assert calibrate(None, 9.0).ratio == MAX_RATIO
    assert calibrate(None, 0.1).ratio == MIN_RATIO


@given(history=st.lists(samples, min_size=1, max_size=40), outlier=samples)
def test_no_single_answer_moves_the_ratio_by_more_than_a_step(
    history: list[float], outlier: float
) -> None:
    before = _after(history)
    after = calibrate(before, outlier)
    assert abs(after.ratio - before.ratio) <= MAX_STEP * before.ratio + 1e-12


@given(prior=ratios, outlier=samples)
def test_a_ratio_restored_from_the_store_is_moved_by_steps_too(
    prior: float, outlier: float
) -> None:
    after = calibrate(restored_calibration(prior), outlier)
    assert abs(after.ratio - prior) <= MAX_STEP * prior + 1e-12


def test_one_digit_heavy_answer_moves_another_conversations_limit_by_a_few_percent() -> None:
    """A model that counted about 1.10 of our estimate for a while, then one tool
    output full of digits counted at 2.0: the limit of every other conversation
    on the model moves by one step at most (the old rule took it from ~5,500 to
    ~3,070 tokens at once)."""
    profile = Profile(context_window=8_192)
    settled = _after([1.09, 1.11, 1.10, 1.12, 1.10, 1.08])
    after = calibrate(settled, 2.0)
    before_limit = calibrated_budget(profile, ratio=settled.ratio).input_limit
    after_limit = calibrated_budget(profile, ratio=after.ratio).input_limit
    assert after_limit >= before_limit * (1 - MAX_STEP) - 1
    # …and once the next ordinary answers come, the odd one has no lasting weight.
    recovered = _after([1.10, 1.09, 1.11], after)
    assert recovered.ratio == pytest.approx(settled.ratio, rel=0.02)


def test_a_model_often_sent_digits_follows_what_it_usually_counts() -> None:
    """One request in four full of digits: the median is the prose's ratio."""
    history = [2.0 if number % 4 == 0 else 1.1 for number in range(1, 41)]
    assert _after(history).ratio == pytest.approx(1.1)


@given(old=ratios, new=ratios)
def test_a_sustained_change_is_followed_within_the_answers_it_needs(old: float, new: float) -> None:
    settled = _after([old] * WINDOW)
    assert settled.ratio == pytest.approx(old)
    needed = answers_to_follow(old, new)
    assert _after([new] * needed, settled).ratio == pytest.approx(new)
    if abs(math.log(new / old)) <= (WINDOW // 2 - 1) * math.log(1 + MAX_STEP):
        assert needed <= WINDOW


@given(history=st.lists(samples, min_size=1, max_size=40), new=ratios)
def test_from_any_history_a_sustained_change_is_reached(history: list[float], new: float) -> None:
    bound = WINDOW + answers_to_follow(MIN_RATIO, MAX_RATIO)
    assert _after([new] * bound, _after(history)).ratio == pytest.approx(new)


def test_the_window_keeps_only_the_last_answers() -> None:
    calibration = _after([1.0 + number / 100 for number in range(3 * WINDOW)])
    assert len(calibration.samples) == WINDOW
    assert calibration.samples[-1] == pytest.approx(1.0 + (3 * WINDOW - 1) / 100)
