"""Build :class:`Settings` from its sources and explain what is wrong with them.

Sources, highest first (docs/configuration.md)::

    overrides      load_settings(**overrides): the CLI's flags, as nested dicts
    environment    COMPACTION_PROXY_SERVER__PORT=9000, COMPACTION_PROXY_MODELS='{…}',
                   COMPACTION_PROXY_STORE=redis://… (short for COMPACTION_PROXY_STORE__URL)
    TOML file      load_settings(path) > $COMPACTION_PROXY_CONFIG > ./compaction-proxy.toml
    defaults       the models' field defaults (compaction.profile's DEFAULT_…)

Each source is read into a plain dict (a *layer*) and the layers are merged
key by key, so a flag for one ``[compaction]`` field leaves the file's other
``[compaction]`` fields alone. The merged dict is validated once; each pydantic
error is traced back to the highest layer that holds its key, so the message
can say where the bad value came from.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import InitSettingsSource, SettingsError

from config.errors import ConfigError, ConfigIssue
from config.settings import (
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    OVERRIDE_CONFLICT,
    STORE_URL_ENV,
    BackgroundSettings,
    CompactionSettings,
    EnvSource,
    ModelOverride,
    ServerSettings,
    Settings,
    StoreSettings,
    UpstreamSettings,
)

CONFIG_FILE_ENV: Final = ENV_PREFIX + "CONFIG"
DEFAULT_CONFIG_FILE: Final = "compaction-proxy.toml"

_OVERRIDES_SOURCE: Final = "command-line options"
_SECTIONS: Final[Mapping[str, type[BaseModel]]] = {
    "server": ServerSettings,
    "upstream": UpstreamSettings,
    "compaction": CompactionSettings,
    "store": StoreSettings,
    "background": BackgroundSettings,
}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class _Layer:
    """What one source says, and how to name it in an error."""

    source: str
    data: Mapping[str, Any]
    env_vars: Mapping[str, str | None] | None = None  #: set for the environment layer

    def label(self, path: Sequence[str | int]) -> str:
        if self.env_vars is None:
            return self.source
        for depth in range(len(path), 0, -1):
            name = ENV_PREFIX + ENV_NESTED_DELIMITER.join(str(key) for key in path[:depth])
            if name.lower() in self.env_vars:
                return f"environment variable {name.upper()}"
        return self.source


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Read, merge and validate every source; raise :class:`ConfigError` on any problem.

    ``overrides`` are nested dicts by section, e.g. ``compaction={"context_window":
    8192}``; a ``None`` value means "not given" and is dropped, so CLI flags can
    be passed as they come from argparse.
    """
    path = find_config_file(config_file)
    toml = _Layer(str(path), _read_toml(path)) if path is not None else None
    layers = [_read_environment()]  # highest first
    if overrides:
        layers.insert(0, _Layer(_OVERRIDES_SOURCE, _drop_none(overrides)))
    if toml is not None:
        layers.append(toml)

    merged: dict[str, Any] = {}
    for layer in reversed(layers):
        merged = _merge(merged, layer.data)
    try:
        # Pre-built sources: the merged dict is the only input, so the
        # environment is not read a second time behind our back.
        sources = (InitSettingsSource(Settings, init_kwargs=merged),)
        # BaseSettings.__init__ takes _build_sources; the dataclass_transform
        # signature mypy derives from the fields does not show it.
        return Settings(_build_sources=(sources, {}))  # type: ignore[call-arg]
    except ValidationError as exc:
        issues = tuple(_issue(error, layers) for error in exc.errors())
        raise ConfigError(issues) from exc


def find_config_file(config_file: str | Path | None = None) -> Path | None:
    """The TOML file to read, or ``None``.

    The named file, else ``$COMPACTION_PROXY_CONFIG``, else
    ``./compaction-proxy.toml`` if it exists. A file named explicitly (argument
    or environment) must exist.
    """
    if config_file is not None and str(config_file):
        named, how = Path(config_file), ""
    elif os.environ.get(CONFIG_FILE_ENV):
        named, how = Path(os.environ[CONFIG_FILE_ENV]), f" (from {CONFIG_FILE_ENV})"
    else:
        default = Path(DEFAULT_CONFIG_FILE)
        return default if default.is_file() else None
    if not named.is_file():
        raise ConfigError(ConfigIssue("", f"configuration file not found: {named}{how}"))
    return named


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(ConfigIssue("", f"invalid TOML: {exc}", str(path))) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(ConfigIssue("", f"cannot read the file: {exc}", str(path))) from exc


def _read_environment() -> _Layer:
    source = EnvSource(Settings)
    # pydantic-settings would report bad JSON as "error parsing value for field
    # …"; checking first lets the message name the variable.
    for field in Settings.model_fields:
        raw = source.env_vars.get((ENV_PREFIX + field).lower())
        if raw:
            try:
                json.loads(raw)
            except ValueError as exc:
                name = (ENV_PREFIX + field).upper()
                raise ConfigError(ConfigIssue("", f"{name} is not valid JSON: {exc}")) from exc
    try:
        data = source()
    except SettingsError as exc:
        raise ConfigError(ConfigIssue("", str(exc), "the environment")) from exc
    env_vars = dict(source.env_vars)
    if source.store_url is not None:  # so an error in it names the variable
        env_vars[STORE_URL_ENV.lower()] = source.store_url
    return _Layer("the environment", data, env_vars=env_vars)


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: _drop_none(value) if isinstance(value, Mapping) else value
        for key, value in values.items()
        if value is not None
    }


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            merged[key] = _merge(below, value)
        else:
            merged[key] = value
    return merged


def _issue(error: ErrorDetails, layers: Sequence[_Layer]) -> ConfigIssue:
    loc = error["loc"]
    if error["type"] == OVERRIDE_CONFLICT:
        ctx = error.get("ctx", {})
        loc = (*loc, str(ctx["model"]))
        return ConfigIssue(_key_path(loc), str(ctx["problem"]), _source_of(loc, layers))
    source = _source_of(loc, layers)
    if error["type"] == "extra_forbidden":
        return ConfigIssue(_key_path(loc), _did_you_mean(loc), source, unknown_key=True)
    return ConfigIssue(_key_path(loc), _problem(error), source)


def _source_of(loc: Sequence[str | int], layers: Sequence[_Layer]) -> str | None:
    """The highest layer holding the deepest part of ``loc`` that any layer holds."""
    for depth in range(len(loc), 0, -1):
        path = loc[:depth]
        for layer in layers:
            if _holds(layer.data, path):
                return layer.label(path)
    return None


def _holds(data: Any, path: Sequence[str | int]) -> bool:
    node = data
    for key in path:
        if not isinstance(node, Mapping):
            return True  # a list or scalar: the rest of the path is inside this value
        if key not in node:
            return False
        node = node[key]
    return True


def _key_path(loc: Sequence[str | int]) -> str:
    parts: list[str] = []
    for key in loc:
        if isinstance(key, int):
            parts.append(f"[{key}]")
        else:
            text = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
            parts.append(f".{text}" if parts else text)
    return "".join(parts)


def _problem(error: ErrorDetails) -> str:
    kind, ctx, message = error["type"], error.get("ctx", {}), error["msg"]
    if kind == "greater_than" and ctx.get("gt") == 0:
        text = "must be positive"
    elif kind == "greater_than_equal" and ctx.get("ge") == 0:
        text = "must not be negative"
    elif kind == "value_error":
        text = str(ctx.get("error", message.removeprefix("Value error, ")))
    elif message.startswith("Input should be "):
        text = "must be " + message.removeprefix("Input should be ")
    else:
        text = message[:1].lower() + message[1:]
    value = error.get("input")
    if isinstance(value, str | int | float | bool):
        shown = repr(value)
        text += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    return text


def _did_you_mean(loc: Sequence[str | int]) -> str:
    parent, key = loc[:-1], loc[-1]
    if not parent:
        known: Sequence[str] = list(Settings.model_fields)
    elif len(parent) == 1 and parent[0] in _SECTIONS:
        known = list(_SECTIONS[str(parent[0])].model_fields)
    elif len(parent) == 2 and parent[0] == "models":
        known = list(ModelOverride.model_fields)
    else:
        return ""
    close = difflib.get_close_matches(str(key), known, n=1)
    return f"did you mean '{close[0]}'?" if close else ""
