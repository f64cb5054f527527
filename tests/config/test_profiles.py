from __future__ import annotations

import pytest

from compaction.budget.calibrated import compute_budget
from config import ModelResolver, Settings, find_override, resolve_model
from config.settings import ModelOverride

LLAMA = "http://127.0.0.1:11434/v1"


def settings(**models: dict[str, object]) -> Settings:
    return Settings.model_validate({"models": models})


def test_unknown_model_uses_compaction_defaults() -> None:
    config = resolve_model(Settings(), "my-finetune")
    assert config.model == "my-finetune"
    assert config.profile.context_window == 32_000
    assert config.window_source == "default"
    assert config.upstream == "https://api.openai.com/v1"
    assert config.summary_model == "my-finetune"
    assert config.api_key_env == "OPENAI_API_KEY"
    assert config.override is None


def test_no_model_name() -> None:
    config = resolve_model(Settings(), None)
    assert config.model == ""
    assert config.profile.context_window == 32_000


def test_table_beats_compaction_context_window() -> None:
    base = Settings.model_validate({"compaction": {"context_window": 50_000}})
    config = resolve_model(base, "gpt-4o")
    assert config.profile.context_window == 128_000
    assert config.window_source == "table"
    assert resolve_model(base, "my-finetune").profile.context_window == 50_000


def test_override_beats_table_and_learned_beats_override() -> None:
    config_settings = settings(**{"gpt-4o": {"context_window": 64_000}})
    config = resolve_model(config_settings, "gpt-4o")
    assert (config.profile.context_window, config.window_source) == (64_000, "override")
    learned = resolve_model(config_settings, "gpt-4o", {"gpt-4o": 30_000})
    assert (learned.profile.context_window, learned.window_source) == (30_000, "learned")
    assert resolve_model(Settings(), "gpt-4o", {"gpt-4o": 30_000}).profile.context_window == 30_000


def test_learned_windows_for_other_models_or_invalid_are_ignored() -> None:
    assert resolve_model(Settings(), "gpt-4o", {"gpt-4": 8192}).profile.context_window == 128_000
    assert resolve_model(Settings(), "gpt-4o", {"gpt-4o": 0}).profile.context_window == 128_000


def test_override_without_window_keeps_the_table_window() -> None:
    config = resolve_model(settings(**{"gpt-4o*": {"reserve_tokens": 32_768}}), "gpt-4o-mini")
    assert config.profile.context_window == 128_000
    assert config.profile.reserve_tokens == 32_768
    assert config.override == "gpt-4o*"


def test_override_layers_over_compaction() -> None:
    base = Settings.model_validate(
        {
            "compaction": {"head_count": 3, "summarizer": "extractive", "reserve_tokens": 1000},
            "models": {"llama*": {"reserve_tokens": 2000}},
        }
    )
    profile = resolve_model(base, "llama3.1:8b").profile
    assert (profile.head_count, profile.summarizer, profile.reserve_tokens) == (
        3,
        "extractive",
        2000,
    )


def test_exact_name_beats_glob() -> None:
    config_settings = settings(
        **{"llama3.1:*": {"context_window": 4096}, "llama3.1:8b": {"context_window": 8192}}
    )
    assert resolve_model(config_settings, "llama3.1:8b").profile.context_window == 8192
    assert resolve_model(config_settings, "llama3.1:70b").profile.context_window == 4096


def test_most_specific_glob_wins_and_matching_ignores_case() -> None:
    models = {
        "*": ModelOverride(head_count=1),
        "*/qwen*": ModelOverride(head_count=2),
        "*/qwen2.5*": ModelOverride(head_count=3),
    }
    found = find_override(models, "Together/Qwen2.5-72B")
    assert found is not None
    assert found[0] == "*/qwen2.5*"
    found = find_override(models, "ollama/qwen3")
    assert found is not None
    assert found[0] == "*/qwen*"
    found = find_override(models, "gpt-4o")
    assert found is not None
    assert found[0] == "*"
    assert find_override({}, "gpt-4o") is None


def test_only_one_override_applies() -> None:
    config_settings = settings(**{"gpt-*": {"head_count": 5}, "gpt-4o*": {"reserve_tokens": 1000}})
    profile = resolve_model(config_settings, "gpt-4o").profile
    assert profile.reserve_tokens == 1000
    assert profile.head_count == 2


def test_summary_model_precedence() -> None:
    base = Settings.model_validate(
        {
            "compaction": {"summary_model": "gpt-4o-mini"},
            "models": {"llama*": {"summary_model": "llama3.2:3b"}},
        }
    )
    assert resolve_model(base, "llama3.1:8b").summary_model == "llama3.2:3b"
    assert resolve_model(base, "gpt-4o").summary_model == "gpt-4o-mini"
    assert resolve_model(Settings(), "gpt-4o").summary_model == "gpt-4o"


def test_upstream_and_key_precedence() -> None:
    base = Settings.model_validate(
        {
            "upstream": {"base_url": "https://openrouter.ai/api/v1", "api_key_env": "OR_KEY"},
            "models": {"llama*": {"upstream": LLAMA + "/", "api_key_env": "OLLAMA_KEY"}},
        }
    )
    llama = resolve_model(base, "llama3.1:8b")
    assert (llama.upstream, llama.api_key_env) == (LLAMA, "OLLAMA_KEY")
    other = resolve_model(base, "gpt-4o")
    assert (other.upstream, other.api_key_env) == ("https://openrouter.ai/api/v1", "OR_KEY")


def test_the_global_key_stays_with_its_own_upstream() -> None:
    base = Settings.model_validate(
        {
            "upstream": {"base_url": "https://openrouter.ai/api/v1", "api_key_env": "OR_KEY"},
            "models": {
                "local-*": {"upstream": LLAMA},
                "same-*": {"upstream": "https://openrouter.ai/api/v1"},
            },
        }
    )
    assert resolve_model(base, "local-llama").api_key_env is None
    assert resolve_model(base, "same-model").api_key_env == "OR_KEY"


def test_resolved_profile_feeds_the_budget_for_an_8k_model() -> None:
    config = resolve_model(settings(**{"llama3.1:8b": {"context_window": 8192}}), "llama3.1:8b")
    budget = compute_budget(config.profile)
    assert budget.reserve == 2048
    assert budget.input_limit == 6144
    assert budget.tail_budget == 3072


def test_resolver_caches_but_applies_learned_windows_each_time() -> None:
    resolver = ModelResolver(settings(**{"gpt-4o*": {"reserve_tokens": 32_768}}), max_cached=3)
    first = resolver.resolve("gpt-4o")
    assert resolver.resolve("gpt-4o") is first
    learned = resolver.resolve("gpt-4o", {"gpt-4o": 8192})
    assert learned.profile.context_window == 8192
    assert resolver.resolve("gpt-4o", {"gpt-4o": 8192}) is learned
    assert resolver.resolve("gpt-4o", {"gpt-4o": 4096}).profile.context_window == 4096
    assert resolver.resolve("gpt-4o", {"other": 4096}) is first
    resolver.resolve("b")  # the cache starts over instead of growing
    assert resolver.resolve("gpt-4o") == first
    assert resolver.resolve("gpt-4o") is not first
    assert resolver.resolve(None) == resolve_model(resolver.settings, None)


@pytest.mark.parametrize("model", ["gpt-4o", "meta-llama/Llama-3.1-8B-Instruct", "unknown"])
def test_each_model_is_matched_against_the_patterns_once_however_often_it_is_asked(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy resolves the model of every request: the patterns are walked
    once per model (and learned window), every later request is a lookup.
    (What a resolution costs is timed by ``make bench``, not here.)"""
    import config.profiles

    walks: list[str] = []
    walk = config.profiles._resolve

    def counted(settings: Settings, name: str) -> object:
        walks.append(name)
        return walk(settings, name)

    monkeypatch.setattr(config.profiles, "_resolve", counted)
    config_settings = settings(**{f"pattern-{i}*": {"head_count": 1} for i in range(20)})
    resolver = ModelResolver(config_settings)
    learned = {model: 8192}
    plain = [resolver.resolve(model) for _ in range(2000)]
    with_learned = [resolver.resolve(model, learned) for _ in range(2000)]
    assert walks == [model, model]  # once without the learned window, once with it
    assert all(config is plain[0] for config in plain)
    assert all(config is with_learned[0] for config in with_learned)
    assert with_learned[0].profile.context_window == 8192


def test_the_working_limit_holds_the_window_below_every_other_source() -> None:
    resolver = ModelResolver(settings(**{"gpt-4o": {"context_window": 50_000}}))
    limited = resolver.resolve("gpt-4o", {"gpt-4o": 40_000}, 45_000, 30_000)
    assert (limited.profile.context_window, limited.window_source) == (30_000, "empty-stream")
    assert resolver.resolve("gpt-4o", {"gpt-4o": 40_000}, 45_000, 30_000) is limited
    # A limit at or above the window it would narrow changes nothing.
    learned = resolver.resolve("gpt-4o", {"gpt-4o": 40_000})
    wide = resolver.resolve("gpt-4o", {"gpt-4o": 40_000}, None, 40_000)
    assert wide == learned
    assert (wide.profile.context_window, wide.window_source) == (40_000, "learned")
    assert resolve_model(Settings(), "gpt-4o", working_limit=1_000).profile.context_window == 1_000
