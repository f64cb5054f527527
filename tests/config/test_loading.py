from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from compaction.budget.profile import DEFAULT_KEEP_RECENT_TOKENS, DEFAULT_RESERVE_TOKENS
from config import ConfigError, Settings, load_settings
from config.loading import find_config_file

WriteToml = Callable[..., Path]

DESIGN_EXAMPLE = """
[server]
host = "127.0.0.1"
port = 8808

[upstream]
base_url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"

[compaction]
context_window = 32000
reserve_tokens = 16384
keep_recent_tokens = 20000
head_count = 2
summarizer = "llm"

[models."llama3.1:8b"]
context_window = 8192
upstream = "http://127.0.0.1:11434/v1"
summary_model = "llama3.1:8b"

[models."gpt-4o*"]
reserve_tokens = 32768

[models."*/qwen*"]
summarizer = "extractive"
"""


def test_no_sources_gives_the_defaults() -> None:
    assert load_settings() == Settings()


def test_design_example_loads(write_toml: WriteToml) -> None:
    settings = load_settings(write_toml(DESIGN_EXAMPLE))
    llama = settings.models["llama3.1:8b"]
    assert llama.context_window == 8192
    assert llama.upstream == "http://127.0.0.1:11434/v1"
    assert llama.summary_model == "llama3.1:8b"
    assert settings.models["gpt-4o*"].reserve_tokens == 32768
    assert settings.models["*/qwen*"].summarizer == "extractive"
    assert settings.compaction.context_window == 32000


def test_environment_uses_the_nested_delimiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_COMPACTION__RESERVE_TOKENS", "8000")
    monkeypatch.setenv("COMPACTION_PROXY_SERVER__PORT", "9000")
    monkeypatch.setenv("COMPACTION_PROXY_SERVER__CORS_ORIGINS", '["http://localhost:3000"]')
    monkeypatch.setenv("COMPACTION_PROXY_UPSTREAM__BASE_URL", "http://127.0.0.1:8000/v1")
    settings = load_settings()
    assert settings.compaction.reserve_tokens == 8000
    assert settings.server.port == 9000
    assert settings.server.cors_origins == ["http://localhost:3000"]
    assert settings.upstream.base_url == "http://127.0.0.1:8000/v1"


def test_environment_models_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_MODELS", '{"gpt-4o": {"reserve_tokens": 32768}}')
    settings = load_settings()
    assert settings.models["gpt-4o"].reserve_tokens == 32768


def test_environment_models_merge_with_the_file(
    monkeypatch: pytest.MonkeyPatch, write_toml: WriteToml
) -> None:
    path = write_toml('[models."gpt-4o"]\ncontext_window = 64000\n[models.other]\nhead_count = 1\n')
    monkeypatch.setenv("COMPACTION_PROXY_MODELS", '{"gpt-4o": {"reserve_tokens": 32768}}')
    settings = load_settings(path)
    assert settings.models["gpt-4o"].context_window == 64000
    assert settings.models["gpt-4o"].reserve_tokens == 32768
    assert settings.models["other"].head_count == 1


def test_precedence_overrides_then_environment_then_file_then_defaults(
    monkeypatch: pytest.MonkeyPatch, write_toml: WriteToml
) -> None:
    path = write_toml(
        "[compaction]\ncontext_window = 1000\nreserve_tokens = 100\nkeep_recent_tokens = 10\n"
    )
    monkeypatch.setenv("COMPACTION_PROXY_COMPACTION__CONTEXT_WINDOW", "2000")
    monkeypatch.setenv("COMPACTION_PROXY_COMPACTION__RESERVE_TOKENS", "200")
    settings = load_settings(path, compaction={"context_window": 3000})
    assert settings.compaction.context_window == 3000  # override
    assert settings.compaction.reserve_tokens == 200  # environment
    assert settings.compaction.keep_recent_tokens == 10  # file
    assert settings.compaction.head_count == 2  # default


def test_overrides_merge_with_the_file_section(write_toml: WriteToml) -> None:
    path = write_toml(
        "[compaction]\nreserve_tokens = 4096\nsummarizer = 'extractive'\n"
        "[upstream]\napi_key_env = 'LOCAL_KEY'\n"
    )
    settings = load_settings(
        path,
        compaction={"context_window": 8192},
        upstream={"base_url": "http://127.0.0.1:1234/v1"},
    )
    assert settings.compaction.context_window == 8192
    assert settings.compaction.reserve_tokens == 4096
    assert settings.compaction.summarizer == "extractive"
    assert settings.upstream.base_url == "http://127.0.0.1:1234/v1"
    assert settings.upstream.api_key_env == "LOCAL_KEY"


def test_overrides_merge_with_the_environment_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_SERVER__HOST", "0.0.0.0")
    settings = load_settings(server={"port": 9999})
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 9999)


def test_none_overrides_mean_not_given(write_toml: WriteToml) -> None:
    path = write_toml("[compaction]\nreserve_tokens = 4096\n")
    settings = load_settings(path, compaction={"reserve_tokens": None, "head_count": 3})
    assert settings.compaction.reserve_tokens == 4096
    assert settings.compaction.head_count == 3


def test_unknown_key_in_the_file_is_named(write_toml: WriteToml) -> None:
    path = write_toml("[compaction]\nreserv_tokens = 8000\n", "compaction-proxy.toml")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert "unknown key 'compaction.reserv_tokens' in" in message
    assert "compaction-proxy.toml" in message
    assert "did you mean 'reserve_tokens'?" in message
    issue = caught.value.issues[0]
    assert issue.unknown_key
    assert issue.key == "compaction.reserv_tokens"


def test_unknown_section_and_unknown_model_key(write_toml: WriteToml) -> None:
    path = write_toml('[srever]\nport = 1\n[models."llama3.1:8b"]\ncontext_windw = 1\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    keys = {issue.key for issue in caught.value.issues}
    assert keys == {"srever", 'models."llama3.1:8b".context_windw'}


def test_unknown_key_in_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_SERVER__PROT", "9000")
    with pytest.raises(ConfigError, match="environment variable COMPACTION_PROXY_SERVER__PROT"):
        load_settings()


def test_unknown_override_key_names_the_command_line() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'compaction\.contxt' in command-line"):
        load_settings(compaction={"contxt": 1})


def test_invalid_value_names_key_and_source(write_toml: WriteToml) -> None:
    path = write_toml("[compaction]\nreserve_tokens = -1\n", "compaction-proxy.toml")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert str(caught.value) == (
        f"invalid configuration: compaction.reserve_tokens: must not be negative (got -1) in {path}"
    )
    assert caught.value.issues[0].source == str(path)


def test_invalid_value_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_COMPACTION__SUMMARIZER", "gpt")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    issue = caught.value.issues[0]
    assert issue.key == "compaction.summarizer"
    assert "'llm', 'extractive' or 'off'" in issue.problem
    assert issue.source == "environment variable COMPACTION_PROXY_COMPACTION__SUMMARIZER"


def test_invalid_value_inside_models_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_MODELS", '{"gpt-4o": {"context_window": 0}}')
    with pytest.raises(ConfigError) as caught:
        load_settings()
    issue = caught.value.issues[0]
    assert issue.key == "models.gpt-4o.context_window"
    assert issue.problem == "must be positive (got 0)"
    assert issue.source == "environment variable COMPACTION_PROXY_MODELS"


def test_override_that_conflicts_with_compaction_names_the_model(write_toml: WriteToml) -> None:
    path = write_toml(
        '[compaction]\nassistant_keep_start = 100\n[models."gpt-4o*"]\nassistant_text_chars = 150\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    issue = caught.value.issues[0]
    assert issue.key == 'models."gpt-4o*"'
    assert "assistant_text_chars" in issue.problem
    assert issue.source == str(path)


def test_every_problem_is_reported(write_toml: WriteToml) -> None:
    path = write_toml("[server]\nport = 0\n[compaction]\nhead_count = -1\nfoo = 1\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert len(caught.value.issues) == 3
    assert str(caught.value).count("\n") == 3


def test_invalid_json_in_models_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_MODELS", "{gpt-4o: 1}")
    with pytest.raises(ConfigError, match="COMPACTION_PROXY_MODELS is not valid JSON"):
        load_settings()


def test_invalid_toml_names_the_file(write_toml: WriteToml) -> None:
    path = write_toml("[compaction\nreserve_tokens = 1\n", "broken.toml")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert "invalid TOML" in str(caught.value)
    assert "broken.toml" in str(caught.value)


def test_unreadable_file_is_a_config_error(write_toml: WriteToml, tmp_path: Path) -> None:
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"binary\.toml"):
        load_settings(path)


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"configuration file not found: .*nope\.toml"):
        load_settings(tmp_path / "nope.toml")


def test_config_file_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, write_toml: WriteToml
) -> None:
    path = write_toml("[server]\nport = 9100\n", "elsewhere.toml")
    monkeypatch.setenv("COMPACTION_PROXY_CONFIG", str(path))
    assert load_settings().server.port == 9100
    assert find_config_file() == path


def test_config_file_from_the_environment_must_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_CONFIG", "missing.toml")
    with pytest.raises(ConfigError, match=r"missing\.toml.*COMPACTION_PROXY_CONFIG"):
        load_settings()


def test_explicit_file_beats_the_environment_and_the_cwd(
    monkeypatch: pytest.MonkeyPatch, write_toml: WriteToml
) -> None:
    write_toml("[server]\nport = 1111\n", "compaction-proxy.toml")
    monkeypatch.setenv("COMPACTION_PROXY_CONFIG", str(write_toml("[server]\nport = 2222\n", "e")))
    explicit = write_toml("[server]\nport = 3333\n", "explicit.toml")
    assert load_settings(explicit).server.port == 3333
    assert load_settings().server.port == 2222


def test_file_in_the_working_directory_is_picked_up(write_toml: WriteToml) -> None:
    write_toml("[compaction]\nsummarizer = 'off'\n", "compaction-proxy.toml")
    assert load_settings().compaction.summarizer == "off"
    assert find_config_file() == Path("compaction-proxy.toml")


def test_no_file_in_the_working_directory_is_fine() -> None:
    assert find_config_file() is None
    settings = load_settings()
    assert settings.compaction.reserve_tokens == DEFAULT_RESERVE_TOKENS
    assert settings.compaction.keep_recent_tokens == DEFAULT_KEEP_RECENT_TOKENS


@pytest.mark.parametrize("name", ["api_key", "admin_key"])
def test_proxy_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(f"COMPACTION_PROXY_SERVER__{name.upper()}", "local-secret")
    settings = load_settings()
    key = getattr(settings.server, name)
    assert key is not None
    assert key.get_secret_value() == "local-secret"
    assert "local-secret" not in repr(settings)


def test_store_section_from_the_file(write_toml: WriteToml) -> None:
    path = write_toml('[store]\nurl = "sqlite:///./state.db"\nstore_originals = false\n')
    store = load_settings(path).store
    assert (store.url, store.store_originals) == ("sqlite:///./state.db", False)


def test_short_store_variable_beats_the_file(
    monkeypatch: pytest.MonkeyPatch, write_toml: WriteToml
) -> None:
    path = write_toml('[store]\nurl = "memory://"\nretention_days = 2\n')
    monkeypatch.setenv("COMPACTION_PROXY_STORE", "redis://127.0.0.1:6379/1")
    store = load_settings(path).store
    assert (store.url, store.retention_days) == ("redis://127.0.0.1:6379/1", 2)


def test_nested_store_variable_beats_the_short_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_STORE", "redis://short/0")
    monkeypatch.setenv("COMPACTION_PROXY_STORE__URL", "memory://")
    assert load_settings().store.url == "memory://"


def test_bad_short_store_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_STORE", "postgres://db/x")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    issue = caught.value.issues[0]
    assert issue.key == "store.url"
    assert "redis://" in issue.problem
    assert issue.source == "environment variable COMPACTION_PROXY_STORE"


def test_unknown_store_key_suggests_the_right_one(write_toml: WriteToml) -> None:
    with pytest.raises(ConfigError, match="did you mean 'retention_days'"):
        load_settings(write_toml("[store]\nretention_day = 3\n"))
