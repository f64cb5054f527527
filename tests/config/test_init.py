from __future__ import annotations

import subprocess
import sys

import config


def test_public_surface_is_pinned_and_sorted() -> None:
    assert config.__all__ == sorted(config.__all__)
    assert config.__all__ == [
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
    for name in config.__all__:
        assert getattr(config, name) is not None


def test_config_does_not_import_the_proxy() -> None:
    code = (
        "import config, sys; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'proxy', 'fastapi', 'httpx'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
