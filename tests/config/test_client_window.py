"""The window a client's long-context beta header opens, and what it never overrides."""

from __future__ import annotations

import pytest

from config import BETA_WINDOW, beta_window, load_settings, resolve_model, with_client_window


@pytest.mark.parametrize(
    "header",
    [
        "context-1m-2025-08-07",
        "interleaved-thinking-2025-05-14,context-1m-2025-08-07",
        " fine-grained-tool-streaming-2025-05-14 , Context-1M-2026-02-01 ",
    ],
)
def test_any_context_1m_token_asks_for_the_1m_window(header: str) -> None:
    assert beta_window(header) == BETA_WINDOW == 1_000_000


@pytest.mark.parametrize("header", [None, "", "interleaved-thinking-2025-05-14", "context-1"])
def test_other_betas_ask_for_no_window(header: str | None) -> None:
    assert beta_window(header) is None


def test_the_beta_header_lifts_a_table_window_to_1m() -> None:
    config = resolve_model(load_settings(None), "claude-sonnet-4-5")
    assert config.profile.context_window == 200_000
    lifted = with_client_window(config, "context-1m-2025-08-07")
    assert (lifted.profile.context_window, lifted.window_source) == (1_000_000, "client")
    assert with_client_window(config, "interleaved-thinking-2025-05-14") is config


def test_the_beta_header_lifts_the_default_window_of_an_unknown_model() -> None:
    config = resolve_model(load_settings(None), "my-gateway-model")
    assert config.window_source == "default"
    assert with_client_window(config, "context-1m-2025-08-07").profile.context_window == 1_000_000


def test_an_explicit_window_wins_over_the_beta_header() -> None:
    settings = load_settings(None, models={"claude-*": {"context_window": 150_000}})
    config = resolve_model(settings, "claude-opus-4-8")
    assert with_client_window(config, "context-1m-2025-08-07") is config
    assert config.profile.context_window == 150_000


def test_a_learned_window_wins_over_the_beta_header() -> None:
    config = resolve_model(load_settings(None), "claude-sonnet-4-5", {"claude-sonnet-4-5": 180_000})
    assert config.window_source == "learned"
    assert with_client_window(config, "context-1m-2025-08-07") is config
