from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from compaction.budget import profile as defaults
from compaction.budget.profile import Bounds, Profile
from config.settings import (
    PROFILE_FIELDS,
    CompactionSettings,
    ModelOverride,
    ServerSettings,
    Settings,
    StoreSettings,
    UpstreamSettings,
)


def test_compaction_defaults_are_the_libraries() -> None:
    settings = CompactionSettings()
    assert settings.context_window == defaults.DEFAULT_CONTEXT_WINDOW
    assert settings.reserve_tokens == defaults.DEFAULT_RESERVE_TOKENS
    assert settings.keep_recent_tokens == defaults.DEFAULT_KEEP_RECENT_TOKENS
    assert settings.head_count == defaults.DEFAULT_HEAD_COUNT
    assert settings.image_tokens == defaults.DEFAULT_IMAGE_TOKENS
    assert settings.summary_ratio == defaults.DEFAULT_SUMMARY_RATIO
    assert settings.read_tools == defaults.DEFAULT_READ_TOOLS
    assert settings.threshold is None
    assert settings.summarizer == "llm"
    assert settings.summary_model is None
    assert settings.to_profile() == Profile()


def test_compaction_has_every_profile_field_and_summary_model() -> None:
    profile_fields = {field.name for field in dataclasses.fields(Profile)}
    assert set(PROFILE_FIELDS) == profile_fields
    assert set(CompactionSettings.model_fields) == profile_fields | {"summary_model"}
    assert set(ModelOverride.model_fields) == profile_fields | {
        "summary_model",
        "upstream",
        "anthropic_upstream",
        "api_key_env",
    }


def test_model_override_inherits_everything_by_default() -> None:
    assert all(value is None for value in ModelOverride().model_dump().values())
    assert ModelOverride().profile_changes() == {}
    assert ModelOverride(context_window=8192).profile_changes() == {"context_window": 8192}


def test_server_and_upstream_defaults() -> None:
    server, upstream = ServerSettings(), UpstreamSettings()
    assert (server.host, server.port, server.cors_origins) == ("127.0.0.1", 8808, [])
    assert server.api_key is None
    assert server.max_body_bytes == 32 * 1024 * 1024
    assert upstream.base_url == "https://api.openai.com/v1"
    assert upstream.api_key_env == "OPENAI_API_KEY"
    assert (upstream.connect_timeout, upstream.read_timeout) == (10.0, 600.0)


def test_every_field_has_a_description() -> None:
    for model in (
        Settings,
        ServerSettings,
        UpstreamSettings,
        CompactionSettings,
        StoreSettings,
        ModelOverride,
    ):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name}"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("context_window", 0),
        ("reserve_tokens", -1),
        ("head_count", -1),
        ("summary_ratio", 0),
        ("summary_ratio", 1.5),
        ("summarizer", "gpt"),
        ("summary_min_tokens", 0),
        ("threshold", 0),
    ],
)
def test_compaction_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        CompactionSettings.model_validate({field: value})
    assert caught.value.errors()[0]["loc"] == (field,)


def test_compaction_applies_the_profiles_cross_field_rules() -> None:
    with pytest.raises(ValidationError, match="summary_max_tokens must be at least"):
        CompactionSettings(summary_min_tokens=5000)
    ok = CompactionSettings(assistant_text_chars=1000, assistant_keep_start=300)
    assert ok.to_profile().assistant_text_chars == 1000


def test_override_is_checked_against_compaction() -> None:
    with pytest.raises(ValidationError, match="summary_max_tokens must be at least"):
        Settings.model_validate({"models": {"small": {"summary_min_tokens": 5000}}})


def test_upstream_urls_must_be_http_and_lose_the_trailing_slash() -> None:
    assert UpstreamSettings(base_url="http://127.0.0.1:11434/v1/").base_url == (
        "http://127.0.0.1:11434/v1"
    )
    for bad in ("ftp://example.com", "localhost:8080", ""):
        with pytest.raises(ValidationError):
            UpstreamSettings(base_url=bad)
    with pytest.raises(ValidationError):
        ModelOverride(upstream="file:///etc/passwd")


def test_port_range_and_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        ServerSettings(port=70000)
    with pytest.raises(ValidationError, match="Extra inputs"):
        ServerSettings.model_validate({"prot": 1})


def test_proxy_key_is_never_printed() -> None:
    server = ServerSettings(api_key=SecretStr("sk-secret"))
    assert "sk-secret" not in repr(server)
    assert "sk-secret" not in str(Settings(server=server))
    assert server.api_key is not None
    assert server.api_key.get_secret_value() == "sk-secret"


def test_admin_key_is_never_printed_and_differs_from_the_proxy_key() -> None:
    server = ServerSettings(api_key=SecretStr("proxy"), admin_key=SecretStr("admin-secret"))
    assert "admin-secret" not in repr(server)
    assert server.admin_key is not None
    assert server.admin_key.get_secret_value() == "admin-secret"
    # Every client holds the proxy key; as the admin key it would show them all.
    with pytest.raises(ValidationError, match="must differ"):
        ServerSettings(api_key=SecretStr("same"), admin_key=SecretStr("same"))
    with pytest.raises(ValidationError, match="must not be empty"):
        ServerSettings(admin_key=SecretStr(" "))


def test_an_empty_proxy_key_is_refused_not_a_lock_anyone_opens() -> None:
    # "Authorization: Bearer " would present the empty key and match it.
    for empty in ("", "  "):
        with pytest.raises(ValidationError, match=r"server\.api_key must not be empty"):
            ServerSettings(api_key=SecretStr(empty))


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.compaction.context_window = 1  # type: ignore[misc]


def test_settings_read_the_environment_but_no_file(
    monkeypatch: pytest.MonkeyPatch, write_toml: Callable[..., Path]
) -> None:
    write_toml("[server]\nport = 1\n", "compaction-proxy.toml")
    monkeypatch.setenv("COMPACTION_PROXY_COMPACTION__RESERVE_TOKENS", "8000")
    settings = Settings()
    assert settings.compaction.reserve_tokens == 8000
    assert settings.server.port == 8808


def test_store_defaults() -> None:
    store = StoreSettings()
    assert store.url == ""  # SQLite at the default state path
    assert (store.retention_days, store.store_originals) == (30.0, True)
    assert store.retention_seconds == 30 * 86400
    assert (store.progress_min_ratio, store.lock_ttl_seconds) == (0.10, 120.0)
    assert Settings().store == store


@pytest.mark.parametrize(
    "url", ["", "memory://", "sqlite:///tmp/s.db", "sqlite:///./s.db", "redis://h:6379/0"]
)
def test_store_urls_accepted(url: str) -> None:
    assert StoreSettings(url=url).url == url


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("url", "postgres://db/x"),
        ("url", "state.db"),
        ("retention_days", 0),
        ("progress_min_ratio", -0.1),
        ("progress_min_ratio", 1),
        ("lock_ttl_seconds", 0),
    ],
)
def test_store_rejects(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        StoreSettings(**{field: value})


def test_store_url_from_the_short_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_STORE", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("COMPACTION_PROXY_STORE__RETENTION_DAYS", "7")
    settings = Settings()
    assert settings.store.url == "redis://127.0.0.1:6379/0"
    assert settings.store.retention_days == 7


def test_nested_store_url_variable_wins_over_the_short_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_STORE", "redis://short/0")
    monkeypatch.setenv("COMPACTION_PROXY_STORE__URL", "memory://")
    assert Settings().store.url == "memory://"


def test_store_variable_may_still_be_a_json_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_STORE", '{"url": "memory://", "store_originals": false}')
    store = Settings().store
    assert (store.url, store.store_originals) == ("memory://", False)


def _outside(bounds: Bounds) -> list[float]:
    """Values just outside ``bounds``, one per side it closes."""
    values: list[float] = []
    if bounds.gt is not None:
        values.append(bounds.gt)
    if bounds.ge is not None:
        values.append(bounds.ge - 1)
    if bounds.lt is not None:
        values.append(bounds.lt)
    if bounds.le is not None:
        values.append(bounds.le + 1)
    return values


def test_every_profile_declaration_reaches_compaction_and_overrides() -> None:
    # Nothing per field is written in config/: each Profile field arrives in both
    # models with the default, description and bounds declared in compaction/.
    for declared in dataclasses.fields(Profile):
        setting = CompactionSettings.model_fields[declared.name]
        override = ModelOverride.model_fields[declared.name]
        assert setting.default == declared.default
        assert override.default is None
        assert setting.description == override.description == declared.metadata["description"]
        bounds: Bounds | None = declared.metadata["bounds"]
        for value in _outside(bounds) if bounds is not None else []:
            for model in (CompactionSettings, ModelOverride):
                with pytest.raises(ValidationError) as caught:
                    model.model_validate({declared.name: value})
                assert caught.value.errors()[0]["loc"] == (declared.name,), (model, value)


def test_safety_margin_is_a_setting_and_an_override() -> None:
    assert CompactionSettings().safety_margin == defaults.DEFAULT_SAFETY_MARGIN == 0.02
    assert CompactionSettings(safety_margin=0).to_profile().safety_margin == 0
    assert ModelOverride(safety_margin=0.1).profile_changes() == {"safety_margin": 0.1}
    for bad in (-0.01, 0.5):
        with pytest.raises(ValidationError):
            CompactionSettings(safety_margin=bad)
        with pytest.raises(ValidationError):
            ModelOverride(safety_margin=bad)
