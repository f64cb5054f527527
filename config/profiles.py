"""Which profile, upstream and summary model apply to one model name.

Pure functions over :class:`Settings`; the proxy keeps the learned windows and
passes them in. Precedence, strongest first::

    context_window   held to the working limit empty streams taught, where
                     smaller (:func:`with_working_limit`); otherwise
                     learned (overflow error) > [models."…"] > stated by the
                     server (:func:`with_server_window`) > the client's
                     long-context beta header (:func:`with_client_window`) >
                     built-in table > [compaction]; a learned window larger
                     than the server's stated one does not replace it (the
                     smaller of two statements of the server is the safe one)
    recall           [models."…"] > off for a model measured never to call the
                     recall tool (:mod:`config.recall_table`) > [compaction]
    other fields     [models."…"] > [compaction]
    summary_model    [models."…"] > [compaction].summary_model > the model itself
    upstream         [models."…"].upstream > [upstream].base_url
    api_key_env      [models."…"].api_key_env > [upstream].api_key_env, the latter
                     only for models sent to [upstream].base_url: a key belongs
                     to the upstream it was configured for

One ``[models."…"]`` table applies: the one named exactly, otherwise the
matching glob (case-insensitive) with the most literal characters; the first
one written wins a tie. Globs match the name as the client sends it, provider
prefix included (``"*/qwen*"``), in time linear in its length (the name is the
client's: see :mod:`config.model_table` for why :func:`fnmatch.translate`'s
regexes cannot backtrack).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import translate
from typing import Literal

from compaction import Profile
from config.model_table import MAX_NAME_CHARS, builtin_context_window
from config.recall_table import never_recalls
from config.settings import ModelOverride, Settings

WindowSource = Literal[
    "learned", "empty-stream", "override", "server", "client", "table", "default"
]

#: The window Anthropic's long-context beta opens (its documented 1M tokens).
BETA_WINDOW = 1_000_000
#: How that beta is named in ``anthropic-beta``: ``context-1m-2025-08-07`` and
#: any later date.
_BETA_PREFIX = "context-1m-"

#: Resolutions a :class:`ModelResolver` keeps before starting over; clients
#: choose model names, so the cache must not grow without bound.
DEFAULT_RESOLVER_CACHE_SIZE = 1024


@dataclass(frozen=True)
class ModelConfig:
    """Everything the proxy needs to handle one request for ``model``."""

    model: str  #: as the client sent it; "" when the request named none
    profile: Profile
    upstream: str  #: base URL, no trailing slash
    summary_model: str
    #: Variable holding the key used when the client sends none; ``None`` for a
    #: model with an upstream of its own and no variable of its own.
    api_key_env: str | None
    override: str | None = None  #: the [models."…"] key that applied, if any
    window_source: WindowSource = "default"  #: where profile.context_window came from
    #: Where an Anthropic Messages request for this model goes (no trailing slash).
    anthropic_upstream: str = "https://api.anthropic.com/v1"
    #: Variable holding the ``x-api-key`` used there when the client sends none.
    anthropic_api_key_env: str | None = None


def find_override(
    models: Mapping[str, ModelOverride], model: str
) -> tuple[str, ModelOverride] | None:
    """The ``[models."…"]`` entry for ``model``: exact name first, then the most specific glob."""
    exact = models.get(model)
    if exact is not None:
        return model, exact
    name = model.lower()
    best: tuple[str, ModelOverride] | None = None
    best_score = -1
    for pattern, override in models.items():
        glob = _glob(pattern)
        if glob.specificity > best_score and glob.regex.match(name):
            best, best_score = (pattern, override), glob.specificity
    return best


@dataclass(frozen=True)
class _Glob:
    specificity: int
    regex: re.Pattern[str]


@functools.lru_cache(maxsize=4096)
def _glob(pattern: str) -> _Glob:
    # Patterns come from the settings, not from clients, so a cache of them
    # stays as small as the configuration; each is read once, not per request.
    return _Glob(_specificity(pattern), re.compile(translate(pattern.lower())))


def resolve_model(
    settings: Settings,
    model: str | None,
    learned_windows: Mapping[str, int] | None = None,
    server_window: int | None = None,
    working_limit: int | None = None,
) -> ModelConfig:
    """Resolve ``model`` against ``settings``; see the module docstring for precedence."""
    config = with_server_window(_resolve(settings, model or ""), server_window)
    return with_working_limit(_apply_learned(config, learned_windows), working_limit)


class ModelResolver:
    """:func:`resolve_model` for one :class:`Settings`, remembering each answer.

    Settings are frozen, so an answer stays valid; a learned window, the
    server's stated one and the working limit are part of the cache key, so
    learning one for a model simply makes a new entry.
    """

    def __init__(
        self, settings: Settings, *, max_cached: int = DEFAULT_RESOLVER_CACHE_SIZE
    ) -> None:
        self.settings = settings
        self._max_cached = max_cached
        self._cache: dict[tuple[str, int | None, int | None, int | None], ModelConfig] = {}

    def resolve(
        self,
        model: str | None,
        learned_windows: Mapping[str, int] | None = None,
        server_window: int | None = None,
        working_limit: int | None = None,
    ) -> ModelConfig:
        name = model or ""
        learned = learned_windows.get(name) if learned_windows else None
        key = (name, learned, server_window, working_limit)
        config = self._cache.get(key)
        if config is None:
            config = resolve_model(
                self.settings, name, learned_windows, server_window, working_limit
            )
            if len(name) > MAX_NAME_CHARS:  # no real model's: not worth keeping
                return config
            if len(self._cache) >= self._max_cached:
                self._cache.clear()
            self._cache[key] = config
        return config


def _resolve(settings: Settings, model: str) -> ModelConfig:
    found = find_override(settings.models, model) if model else None
    key, override = found if found is not None else (None, ModelOverride())
    changes = override.profile_changes()
    source: WindowSource = "default"
    if "context_window" in changes:
        source = "override"
    elif (window := builtin_context_window(model)) is not None:
        changes["context_window"] = window
        source = "table"
    if "recall" not in changes and never_recalls(model):
        changes["recall"] = False
    return ModelConfig(
        model=model,
        profile=settings.compaction.to_profile(**changes),
        upstream=override.upstream or settings.upstream.base_url,
        summary_model=override.summary_model or settings.compaction.summary_model or model,
        api_key_env=override.api_key_env or _global_key_env(settings, override),
        override=key,
        window_source=source,
        anthropic_upstream=override.anthropic_upstream or settings.upstream.anthropic_base_url,
        anthropic_api_key_env=_anthropic_key_env(settings, override),
    )


def beta_window(anthropic_beta: str | None) -> int | None:
    """The window an ``anthropic-beta`` header (comma-separated tokens) asks
    for: :data:`BETA_WINDOW` when one token is ``context-1m-…``, else ``None``."""
    if not anthropic_beta:
        return None
    tokens = (token.strip().lower() for token in anthropic_beta.split(","))
    return BETA_WINDOW if any(t.startswith(_BETA_PREFIX) for t in tokens) else None


def with_client_window(config: ModelConfig, anthropic_beta: str | None) -> ModelConfig:
    """``config`` with the window the client's long-context beta header opens.

    The client asked the upstream for that window, so it is the one to budget
    for — over the built-in table and the default, never over a window set
    in ``[models."…"]`` or learned from the upstream's own overflow error.
    """
    window = beta_window(anthropic_beta)
    if window is None or config.window_source not in ("table", "default"):
        return config
    profile = dataclasses.replace(config.profile, context_window=window)
    return dataclasses.replace(config, profile=profile, window_source="client")


def with_server_window(config: ModelConfig, window: int | None) -> ModelConfig:
    """``config`` with the window the upstream server states it serves (its
    ``/props``, ``/v1/models``, …: see :mod:`proxy.upstream.discovery`).

    What the server serves is the truth the built-in table and the default
    only guess at, and a client's header cannot widen it; a window set in
    ``[models."…"]`` is the operator's word and stays.
    """
    if window is None or window <= 0 or config.window_source not in ("table", "default"):
        return config
    profile = dataclasses.replace(config.profile, context_window=window)
    return dataclasses.replace(config, profile=profile, window_source="server")


def with_working_limit(config: ModelConfig, limit: int | None) -> ModelConfig:
    """``config`` with its window held to ``limit``, the working window empty
    streams narrowed it to (:meth:`proxy.state.models.ModelKnowledge.empty_stream`),
    when that is smaller: the upstream was seen to fail above it, whatever any
    other source says."""
    if limit is None or limit >= config.profile.context_window:
        return config
    profile = dataclasses.replace(config.profile, context_window=limit)
    return dataclasses.replace(config, profile=profile, window_source="empty-stream")


def _apply_learned(config: ModelConfig, learned_windows: Mapping[str, int] | None) -> ModelConfig:
    if not learned_windows:
        return config
    window = learned_windows.get(config.model)
    if window is None or window <= 0:
        return config
    if config.window_source == "server" and window >= config.profile.context_window:
        # Both are the server's word; aiming at the smaller costs an earlier
        # compaction, at the larger an overflow or a silently cut prompt.
        return config
    profile = dataclasses.replace(config.profile, context_window=window)
    return dataclasses.replace(config, profile=profile, window_source="learned")


def _global_key_env(settings: Settings, override: ModelOverride) -> str | None:
    """[upstream].api_key_env, unless the model goes to another upstream: the
    global key must never be sent to a server it was not configured for."""
    if override.upstream and override.upstream != settings.upstream.base_url:
        return None
    return settings.upstream.api_key_env


def _anthropic_key_env(settings: Settings, override: ModelOverride) -> str | None:
    """[upstream].anthropic_api_key_env, unless the model's Anthropic requests go
    elsewhere (the same rule as :func:`_global_key_env`)."""
    anthropic = settings.upstream.anthropic_base_url
    if override.anthropic_upstream and override.anthropic_upstream != anthropic:
        return None
    return settings.upstream.anthropic_api_key_env


def _specificity(pattern: str) -> int:
    return sum(1 for char in pattern if char not in "*?")
