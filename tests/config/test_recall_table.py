from __future__ import annotations

import pytest

from config import load_settings, resolve_model
from config.model_table import MAX_NAME_CHARS
from config.recall_table import never_recalls


@pytest.mark.parametrize(
    "model",
    [
        "qwen2.5-coder-1.5b-instruct",  # llama.cpp's --alias, as the harness serves it
        "qwen2.5-coder-0.5b-instruct",
        "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",  # Hugging Face
        "qwen2.5-coder:1.5b",  # Ollama
        "qwen2.5-coder:0.5b-instruct-q4_K_M",
        "  QWEN2.5-CODER-1.5B  ",
    ],
)
def test_the_measured_small_models_never_recall(model: str) -> None:
    assert never_recalls(model)


@pytest.mark.parametrize(
    "model",
    [
        "",
        "qwen2.5-coder-7b-instruct",  # never measured: recall stays on
        "qwen2.5-coder:14b",
        "qwen2.5-coder-15b",  # a prefix of the name is not the name
        "qwen3-coder-30b-a3b",
        "gpt-4o",
        "my-qwen2.5-coder-1.5b",  # only a provider prefix ending in '/' is removed
        "qwen2.5-coder-1.5b" + "x" * MAX_NAME_CHARS,  # no real model's name
    ],
)
def test_every_other_model_keeps_recall(model: str) -> None:
    assert not never_recalls(model)


def test_recall_is_off_for_them_unless_a_models_table_turns_it_on() -> None:
    plain = load_settings(None)
    assert not resolve_model(plain, "qwen2.5-coder:1.5b").profile.recall
    assert resolve_model(plain, "qwen2.5-coder:7b").profile.recall
    for pattern in ("qwen2.5-coder:1.5b", "qwen2.5-coder*", "*"):
        on = load_settings(None, models={pattern: {"recall": True}})
        assert resolve_model(on, "qwen2.5-coder:1.5b").profile.recall
    # A table that sets something else leaves the measured default alone.
    window = load_settings(None, models={"qwen2.5-coder*": {"context_window": 8192}})
    assert not resolve_model(window, "qwen2.5-coder:1.5b").profile.recall
