"""The window the upstream server states: where it stands among the other sources."""

from __future__ import annotations

from config import ModelResolver, load_settings, resolve_model, with_client_window

MODEL = "qwen2.5-coder"  # the built-in table says 32,768


def test_the_servers_window_replaces_the_tables() -> None:
    config = resolve_model(load_settings(None), MODEL, server_window=8192)
    assert (config.profile.context_window, config.window_source) == (8192, "server")


def test_the_servers_window_replaces_the_default_of_a_model_the_table_does_not_know() -> None:
    config = resolve_model(load_settings(None), "my-finetune", server_window=8192)
    assert (config.profile.context_window, config.window_source) == (8192, "server")


def test_a_window_set_in_the_configuration_wins_over_the_servers() -> None:
    settings = load_settings(None, models={MODEL: {"context_window": 20_000}})
    config = resolve_model(settings, MODEL, server_window=8192)
    assert (config.profile.context_window, config.window_source) == (20_000, "override")


def test_a_learned_window_wins_over_the_servers_only_when_smaller() -> None:
    settings = load_settings(None)
    smaller = resolve_model(settings, MODEL, {MODEL: 6000}, server_window=8192)
    assert (smaller.profile.context_window, smaller.window_source) == (6000, "learned")
    larger = resolve_model(settings, MODEL, {MODEL: 16_000}, server_window=8192)
    assert (larger.profile.context_window, larger.window_source) == (8192, "server")


def test_the_clients_beta_header_does_not_widen_what_the_server_serves() -> None:
    config = resolve_model(load_settings(None), MODEL, server_window=8192)
    assert with_client_window(config, "context-1m-2025-08-07") is config


def test_a_window_the_server_could_not_state_changes_nothing() -> None:
    table = resolve_model(load_settings(None), MODEL)
    for window in (None, 0, -5):
        assert resolve_model(load_settings(None), MODEL, server_window=window) == table


def test_the_resolver_keeps_an_answer_per_stated_window() -> None:
    resolver = ModelResolver(load_settings(None))
    assert resolver.resolve(MODEL).window_source == "table"
    assert resolver.resolve(MODEL, server_window=8192).profile.context_window == 8192
    assert resolver.resolve(MODEL, server_window=4096).profile.context_window == 4096
    assert resolver.resolve(MODEL).window_source == "table"
