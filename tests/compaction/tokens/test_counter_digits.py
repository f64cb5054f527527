"""compaction.tokens.counter: runs of digits counted a token a digit for the models
whose tokenizer splits them so, and as the encoding counts for the others."""

from __future__ import annotations

import random
import re

import pytest

from compaction.tokens.counter import TokenCounter, digit_surplus, splits_digits
from compaction.tokens.encodings import load_encoding

#: A tool output of the kind that poisoned a model's ratio: a table of figures.
FIGURES = "\n".join(
    " ".join(f"{random.Random(row * 31 + col).randint(0, 10**9)}" for col in range(10))
    for row in range(200)
)


def _per_digit_reference(text: str) -> int:
    """A tokenizer that splits digits one by one: cl100k for what is not a digit,
    one token for each digit."""
    encoding = load_encoding("cl100k_base")
    assert encoding is not None
    pieces = re.split(r"[0-9]", text)
    others = sum(len(encoding.encode_ordinary(piece)) for piece in pieces if piece)
    return others + sum(ch.isdigit() for ch in text)


@pytest.mark.parametrize(
    "model",
    [
        "qwen2.5-coder-1.5b-instruct",
        "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        "qwen2.5-coder:1.5b",
        "llama-2-7b-chat",
        "codellama:13b",
        "mistral-7b-instruct-v0.2.Q4_K_M.gguf",
        "deepseek-coder-6.7b",
        "gemma-2-9b-it",
        "Phi-3-mini-4k-instruct",
    ],
)
def test_models_that_split_digits_are_known_by_name(model: str) -> None:
    assert splits_digits(model)


@pytest.mark.parametrize(
    "model",
    [
        "gpt-4o",
        "gpt-4",
        "gpt-3.5-turbo",
        "gpt-5-mini",
        "o3-mini",
        "o1",
        "openai/gpt-4.1",
        "gpt-oss-20b",
        "llama3.1:8b",
        "Meta-Llama-3.1-8B-Instruct",
        "claude-sonnet-4",
        None,
    ],
)
def test_models_counted_as_the_encoding_counts(model: str | None) -> None:
    """The OpenAI models' tokenizers are these encodings; Llama 3 groups digits
    by three as they do."""
    assert not splits_digits(model)
    counter = TokenCounter(model)
    plain = TokenCounter(encoding=counter.encoding_name, digits_apart=False)
    assert counter.count_text(FIGURES) == plain.count_text(FIGURES)


def test_a_digit_heavy_tool_output_is_counted_near_a_per_digit_tokenizer() -> None:
    counter = TokenCounter("qwen2.5-coder-1.5b-instruct")
    reference = _per_digit_reference(FIGURES)
    counted = counter.count_text(FIGURES)
    assert reference * 0.95 <= counted <= reference * 1.05
    # The encoding alone counts about half of it: what made one answer 2.0×.
    assert TokenCounter(encoding="cl100k_base").count_text(FIGURES) < reference * 0.6


def test_the_surplus_is_what_three_digits_a_token_leaves_out() -> None:
    assert digit_surplus("no figures here") == 0
    assert digit_surplus("a 7 b") == 0  # one digit is one token everywhere
    assert digit_surplus("12") == 1
    assert digit_surplus("1234567890") == 10 - 4
    assert digit_surplus("v1.25 at 2024-01-15") == 1 + 2 + 1 + 1  # 25, 2024, 01, 15


def test_prose_without_digits_counts_the_same_for_every_model() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 50
    qwen = TokenCounter("qwen2.5-coder-1.5b-instruct")
    assert qwen.count_text(text) == TokenCounter(encoding="cl100k_base").count_text(text)


def test_a_message_is_cached_by_the_counter_that_counted_it() -> None:
    """A counter per rule: the same message has each rule's count, both cached."""
    message = {"role": "tool", "tool_call_id": "c1", "content": FIGURES}
    qwen, plain = TokenCounter("qwen2.5-coder"), TokenCounter(encoding="cl100k_base")
    first, again = qwen.count_message(message), qwen.count_message(message)
    assert first == again and qwen.hits == 1
    assert plain.count_message(message) < first
