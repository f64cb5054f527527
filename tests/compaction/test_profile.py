from __future__ import annotations

import pytest

from compaction.profile import Profile, compute_budget, requested_output_tokens


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
        ("assistant_keep_start", 5000),
    ],
)
def test_invalid_profiles_are_rejected_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        Profile(**{field: value})  # type: ignore[arg-type]
