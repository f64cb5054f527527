from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config.model_table import MAX_NAME_CHARS, builtin_context_window, builtin_table


@pytest.mark.parametrize(
    ("model", "window"),
    [
        # OpenAI, most specific first
        ("gpt-4o", 128_000),
        ("gpt-4o-2024-08-06", 128_000),
        ("gpt-4o-mini", 128_000),
        ("gpt-4.1", 1_047_576),
        ("gpt-4.1-nano-2025-04-14", 1_047_576),
        ("gpt-4-turbo-2024-04-09", 128_000),
        ("gpt-4-0125-preview", 128_000),
        ("gpt-4", 8_192),
        ("gpt-4-0613", 8_192),
        ("gpt-3.5-turbo", 16_385),
        ("gpt-5", 400_000),
        ("gpt-5-mini", 400_000),
        ("gpt-5-chat-latest", 128_000),
        ("gpt-5.4", 1_050_000),
        ("gpt-5.5-2026-04-23", 1_050_000),
        ("gpt-5.4-mini", 400_000),
        ("o1", 200_000),
        ("o1-mini", 128_000),
        ("o3-mini", 200_000),
        ("o4-mini", 200_000),
        ("gpt-oss-120b", 131_072),
        # provider prefixes and casing
        ("openai/gpt-4o", 128_000),
        ("OpenAI/GPT-4o-Mini", 128_000),
        ("anthropic/claude-3-5-sonnet", 200_000),
        ("anthropic/claude-3.5-sonnet", 200_000),
        ("claude-sonnet-4-20250514", 200_000),
        ("claude-opus-4-1", 200_000),
        ("anthropic.claude-3-haiku-20240307-v1:0", 200_000),
        ("models/gemini-2.0-flash", 1_048_576),
        ("gemini-3-pro-preview", 1_048_576),
        ("google/gemini-3.1-pro-preview", 1_048_576),
        # Anthropic's 1M models (Claude Code's default among them), and those
        # that stay at 200k without the beta header
        ("claude-opus-4-8", 1_000_000),
        ("claude-opus-4-7", 1_000_000),
        ("claude-opus-4-6", 1_000_000),
        ("claude-sonnet-4-6", 1_000_000),
        ("anthropic.claude-opus-4-7", 1_000_000),
        ("claude-sonnet-5", 1_000_000),
        ("claude-opus-5-5", 1_000_000),
        ("claude-opus-4-5-20251101", 200_000),
        ("claude-sonnet-4-5-20250929", 200_000),
        ("claude-haiku-4-5-20251001", 200_000),
        ("google/gemini-2.5-pro", 1_048_576),
        ("gemini-1.5-flash", 1_048_576),
        ("gemma3:1b", 32_768),
        ("gemma3:27b", 131_072),
        # Llama: Hugging Face, Groq and Ollama spellings
        ("meta-llama/Llama-3.1-8B-Instruct", 131_072),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", 131_072),
        ("llama-3.3-70b-versatile", 131_072),
        ("llama3.1:8b", 131_072),
        ("llama3.2:3b", 131_072),
        ("llama3", 8_192),
        ("llama3:8b", 8_192),
        ("meta-llama/Meta-Llama-3-8B-Instruct", 8_192),
        # Qwen
        ("qwen2.5:7b", 32_768),
        ("Qwen/Qwen2.5-7B-Instruct", 32_768),
        ("qwen/qwen-2.5-72b-instruct", 32_768),
        ("Qwen/Qwen2.5-7B-Instruct-1M", 1_010_000),
        ("qwen2.5-coder:32b", 32_768),
        ("qwen3:8b", 40_960),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", 262_144),
        # Mistral
        ("mistral-large-latest", 128_000),
        ("mistral-small3.1:24b", 128_000),
        ("mistral:7b", 32_768),
        ("mistralai/Mistral-7B-Instruct-v0.3", 32_768),
        ("mixtral:8x7b", 32_768),
        ("open-mixtral-8x22b", 65_536),
        ("codestral-latest", 256_000),
        ("codestral:22b", 32_768),
        # DeepSeek, Phi, Cohere
        ("deepseek-chat", 128_000),
        ("deepseek-reasoner", 128_000),
        ("deepseek-r1:8b", 128_000),
        ("deepseek/deepseek-chat-v3-0324", 128_000),
        ("phi3", 4_096),
        ("microsoft/Phi-3-mini-128k-instruct", 131_072),
        ("phi3.5", 131_072),
        ("phi4:14b", 16_384),
        ("phi4-mini", 131_072),
        ("command-r-plus", 128_000),
    ],
)
def test_known_models(model: str, window: int) -> None:
    assert builtin_context_window(model) == window


@pytest.mark.parametrize("model", ["", "   ", "my-finetune", "text-embedding-3-small", "gpt-4x"])
def test_unknown_models(model: str) -> None:
    assert builtin_context_window(model) is None


def test_table_is_ordered_most_specific_first() -> None:
    table = builtin_table()
    literal = [sum(char not in "*?" for char in pattern) for pattern, _ in table]
    assert literal == sorted(literal, reverse=True)
    assert len({pattern for pattern, _ in table}) == len(table)
    assert all(window > 0 for _, window in table)


def test_a_name_within_the_length_limit_is_looked_up_and_a_longer_one_is_not() -> None:
    padded = "anthropic/claude-sonnet-4-6-" + "x" * MAX_NAME_CHARS
    assert builtin_context_window(padded[:MAX_NAME_CHARS]) == 1_000_000
    assert builtin_context_window(padded[: MAX_NAME_CHARS + 1]) is None


def _reference(model: str) -> int | None:
    """The table read the slow, obvious way: each glob tried in turn with fnmatch."""
    name = model.strip().lower()
    bare = name.rsplit("/", 1)[-1]
    for candidate in (bare, name):
        for pattern, window in builtin_table():
            if fnmatchcase(candidate, pattern):
                return window
    return None


_PIECES = st.sampled_from(
    [pattern.replace("*", "") for pattern, _ in builtin_table()] + ["-", "/", "x", "*", "?", "4"]
)


@given(st.lists(_PIECES, max_size=5).map("".join))
def test_the_most_specific_glob_wins_for_the_bare_name_before_the_prefixed_one(model: str) -> None:
    for name in (model, model.upper(), f"provider/{model}", f"a/b/{model}"):
        assert builtin_context_window(name) == _reference(name)


def test_no_glob_in_the_table_uses_a_set_which_would_read_as_one_character() -> None:
    # The globs are read by fnmatch, where "[…]" is a set of characters.
    assert not any("[" in pattern for pattern, _ in builtin_table())
