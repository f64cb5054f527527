from __future__ import annotations

import dataclasses

import pytest

from compaction.budget.calibrated import compute_budget, requested_output_tokens
from compaction.budget.profile import DEFAULT_SAFETY_MARGIN, Bounds, Profile


def test_budget_for_small_local_model_keeps_a_quarter_for_output() -> None:
    budget = compute_budget(Profile(context_window=8192))
    assert budget.reserve == 2048
    assert budget.input_limit == 6144
    assert budget.trigger == 6144
    assert budget.tail_budget == 3072


def test_budget_for_large_model_uses_reserve_and_keep_recent() -> None:
    budget = compute_budget(Profile(context_window=128_000))
    assert budget.reserve == 16_384
    assert budget.input_limit == 128_000 - 16_384
    assert budget.tail_budget == 20_000


def test_requested_output_above_reserve_wins() -> None:
    budget = compute_budget(Profile(context_window=128_000), requested_output=50_000)
    assert budget.reserve == 50_000
    assert budget.input_limit == 78_000


def test_threshold_lowers_the_trigger_but_not_the_limit() -> None:
    budget = compute_budget(Profile(context_window=128_000, threshold=32_000))
    assert budget.trigger == 32_000
    assert budget.input_limit == 111_616
    too_high = compute_budget(Profile(context_window=8192, threshold=100_000))
    assert too_high.trigger == too_high.input_limit


def test_requested_output_reads_max_completion_tokens_first() -> None:
    assert requested_output_tokens({"max_completion_tokens": 10, "max_tokens": 20}) == 10
    assert requested_output_tokens({"max_tokens": 20}) == 20
    assert requested_output_tokens({"max_tokens": True}) == 0
    assert requested_output_tokens({"max_tokens": "9"}) == 0
    assert requested_output_tokens({}) == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("context_window", 0),
        ("reserve_tokens", -1),
        ("threshold", 0),
        ("summary_ratio", 1.5),
        ("summarizer", "gpt"),
        ("assistant_keep_start", 9000),
    ],
)
def test_invalid_profiles_are_rejected_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        Profile(**{field: value})  # type: ignore[arg-type]


def test_every_field_declares_a_description_and_its_bounds() -> None:
    for field in dataclasses.fields(Profile):
        assert field.metadata["description"], field.name
        bounds = field.metadata["bounds"]
        assert bounds is None or isinstance(bounds, Bounds), field.name


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("safety_margin", -0.01, r"safety_margin must be in \[0, 0.5\), got -0.01"),
        ("safety_margin", 0.5, r"safety_margin must be in \[0, 0.5\), got 0.5"),
        ("prune_target", 0, r"prune_target must be in \(0, 1\], got 0"),
        ("image_tokens", -1, "image_tokens must not be negative, got -1"),
        ("summarizer_context_window", 0, "summarizer_context_window must be positive, got 0"),
    ],
)
def test_bounds_are_checked_with_a_message_naming_the_range(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Profile(**{field: value})  # type: ignore[arg-type]


def test_safety_margin_defaults_to_two_percent_and_may_be_zero() -> None:
    assert Profile().safety_margin == DEFAULT_SAFETY_MARGIN == 0.02
    assert Profile(safety_margin=0).safety_margin == 0
    assert Profile(threshold=None, summarizer_context_window=None).threshold is None


def test_holding_back_lowers_the_limit_and_a_trigger_above_it() -> None:
    budget = compute_budget(Profile(context_window=8192))
    held = budget.holding_back(200)
    assert (held.input_limit, held.trigger, held.held_back) == (
        budget.input_limit - 200,
        budget.input_limit - 200,
        200,
    )
    assert budget.holding_back(0) is budget
    lower = compute_budget(Profile(context_window=8192, threshold=4000)).holding_back(200)
    assert lower.trigger == 4000


def test_a_scaled_budget_scales_the_limit_and_trigger_and_derives_its_tail() -> None:
    profile = Profile(context_window=16_384, threshold=6_000, keep_recent_tokens=20_000)
    plain = compute_budget(profile)
    scaled = compute_budget(profile, scale=0.8)
    assert scaled.input_limit == int(plain.input_limit * 0.8)
    assert scaled.trigger == int(6_000 * 0.8)
    assert scaled.tail_budget == scaled.input_limit // 2  # of the scaled limit, not the plain
    assert (scaled.context_window, scaled.reserve) == (plain.context_window, plain.reserve)
    # A limit at or below zero (more output asked than the window holds) stays as it is.
    over = compute_budget(Profile(context_window=8192), requested_output=9_000, scale=0.5)
    assert over.input_limit == over.trigger == 8192 - 9_000
    assert over.tail_budget == 0


@pytest.mark.parametrize("threshold", [None, 4_000, 5_000])
@pytest.mark.parametrize("tokens", [-5, 0, 200, 7_000])
def test_a_budget_made_holding_back_is_the_budget_held_back(
    threshold: int | None, tokens: int
) -> None:
    profile = Profile(context_window=8192, threshold=threshold)
    for scale in (1.0, 0.8):
        made = compute_budget(profile, 100, scale=scale, held_back=tokens)
        assert made == compute_budget(profile, 100, scale=scale).holding_back(tokens)
