"""config: settings for the proxy, from CLI flags, environment, TOML and defaults.

    settings = load_settings(args.config, compaction={"context_window": args.context_window})
    resolver = ModelResolver(settings)
    model_config = resolver.resolve(body.get("model"), learned_windows)

``config`` maps TOML and environment onto the pipeline's own
:class:`compaction.profile.Profile`; it imports nothing from ``proxy``.
"""

from config.errors import ConfigError, ConfigIssue
from config.loading import find_config_file, load_settings
from config.model_table import builtin_context_window
from config.profiles import (
    BETA_WINDOW,
    ModelConfig,
    ModelResolver,
    beta_window,
    find_override,
    resolve_model,
    with_client_window,
    with_server_window,
    with_working_limit,
)
from config.reference import SettingDoc, settings_reference
from config.settings import (
    CompactionSettings,
    ModelOverride,
    ServerSettings,
    Settings,
    StoreSettings,
    UpstreamSettings,
)

__all__ = [
    "BETA_WINDOW",
    "CompactionSettings",
    "ConfigError",
    "ConfigIssue",
    "ModelConfig",
    "ModelOverride",
    "ModelResolver",
    "ServerSettings",
    "SettingDoc",
    "Settings",
    "StoreSettings",
    "UpstreamSettings",
    "beta_window",
    "builtin_context_window",
    "find_config_file",
    "find_override",
    "load_settings",
    "resolve_model",
    "settings_reference",
    "with_client_window",
    "with_server_window",
    "with_working_limit",
]
