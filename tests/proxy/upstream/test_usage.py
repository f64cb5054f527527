"""proxy/upstream/usage.py: one read of a ``usage`` object gives what it bills
and the prompt its answer's own step read."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.upstream.usage import NOTHING_REPORTED, Usage, read_usage


@pytest.mark.parametrize(
    ("usage", "apart", "billed", "prompt"),
    [
        (None, False, None, None),
        ({"completion_tokens": 5}, False, None, None),
        # Chat: the cached part is in prompt_tokens; the rest was written.
        (
            {
                "prompt_tokens": 100,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 60},
            },
            False,
            Usage(100, 60, 40, 7),
            100,
        ),
        # A count that is not a non-negative integer is missing.
        ({"prompt_tokens": True, "completion_tokens": 7}, False, None, None),
        ({"input_tokens": 10, "output_tokens": -1}, False, Usage(10, 0, 10, 0), 10),
        (
            {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}},
            False,
            Usage(10, 10, 0, 0),
            10,
        ),
        # Anthropic: the cache counts are apart from input_tokens (its keys say so).
        (
            {
                "input_tokens": 5,
                "cache_read_input_tokens": 80,
                "cache_creation_input_tokens": 15,
                "output_tokens": 3,
            },
            False,
            Usage(100, 80, 15, 3),
            100,
        ),
        ({"input_tokens": 5, "output_tokens": 3}, True, Usage(5, 0, 0, 3), 5),
    ],
)
def test_a_usage_object_is_read_into_its_bill_and_its_prompt(
    usage: Any, apart: bool, billed: Usage | None, prompt: int | None
) -> None:
    reported = read_usage(usage, cache_apart=apart)
    assert (reported.usage, reported.prompt) == (billed, prompt)


def test_every_step_is_billed_and_the_top_level_step_is_the_prompt() -> None:
    usage = {
        "input_tokens": 30,
        "output_tokens": 4,
        "iterations": [
            {"type": "compaction", "input_tokens": 200, "output_tokens": 20},
            {"type": "message", "input_tokens": 30, "output_tokens": 4},
        ],
    }
    reported = read_usage(usage, cache_apart=True)
    assert reported.usage == Usage(230, 0, 0, 24, server_compaction=220)
    assert reported.prompt == 30  # what the model read of the request as sent


def test_a_step_it_cannot_read_leaves_the_top_level_counts() -> None:
    usage = {"input_tokens": 30, "output_tokens": 4, "iterations": [{"input_tokens": "x"}]}
    reported = read_usage(usage, cache_apart=True)
    assert (reported.usage, reported.prompt) == (Usage(30, 0, 0, 4), 30)
    assert read_usage([1, 2]) is NOTHING_REPORTED
