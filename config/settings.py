"""The settings models: what ``compaction-proxy.toml`` and the environment may hold.

Layout (DESIGN.md §8)::

    [server]            ServerSettings      where the proxy listens, who may call it
    [upstream]          UpstreamSettings    where requests go
    [compaction]        CompactionSettings  every Profile field + summary_model
    [store]             StoreSettings       checkpoints, originals, events (proxy.stores)
    [models."<glob>"]   ModelOverride       per-model changes to [compaction]

Every model forbids unknown keys and is frozen. The pipeline's defaults are not
repeated here: ``CompactionSettings`` takes them from ``compaction.profile``, and
its validation ends by building a :class:`~compaction.profile.Profile`, so the
library's own rules (e.g. ``summary_max_tokens >= summary_min_tokens``) decide.

``Settings()`` reads keyword arguments and ``COMPACTION_PROXY_*`` variables
only; :func:`config.load_settings` adds the TOML file and readable errors.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from compaction.profile import (
    DEFAULT_ASSISTANT_KEEP_END,
    DEFAULT_ASSISTANT_KEEP_START,
    DEFAULT_ASSISTANT_TEXT_CHARS,
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_HEAD_COUNT,
    DEFAULT_IMAGE_TOKENS,
    DEFAULT_KEEP_RECENT_TOKENS,
    DEFAULT_MODIFY_TOOLS,
    DEFAULT_PRUNE_TARGET,
    DEFAULT_READ_TOOLS,
    DEFAULT_RESERVE_TOKENS,
    DEFAULT_SUMMARY_MAX_TOKENS,
    DEFAULT_SUMMARY_MIN_TOKENS,
    DEFAULT_SUMMARY_RATIO,
    DEFAULT_SUMMARY_TOOL_RESULT_CHARS,
    DEFAULT_TOOL_ARGS_CHARS,
    DEFAULT_TOOL_RESULT_CHARS,
    Profile,
)
from compaction.types import SummarizerMode

ENV_PREFIX: Final = "COMPACTION_PROXY_"
ENV_NESTED_DELIMITER: Final = "__"

#: Error type of an override that is invalid only together with [compaction].
OVERRIDE_CONFLICT: Final = "override_conflict"

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8808
DEFAULT_MAX_BODY_BYTES: Final = 32 * 1024 * 1024
DEFAULT_UPSTREAM: Final = "https://api.openai.com/v1"
DEFAULT_API_KEY_ENV: Final = "OPENAI_API_KEY"
DEFAULT_CONNECT_TIMEOUT: Final = 10.0
DEFAULT_READ_TIMEOUT: Final = 600.0
DEFAULT_MAX_CONNECTIONS: Final = 100
DEFAULT_MAX_KEEPALIVE_CONNECTIONS: Final = 20
DEFAULT_RETENTION_DAYS: Final = 30.0
DEFAULT_PROGRESS_MIN_RATIO: Final = 0.10
DEFAULT_LOCK_TTL_SECONDS: Final = 120.0

#: A short name for [store] url, as the issue and the docs spell it; the nested
#: COMPACTION_PROXY_STORE__URL wins when both are set.
STORE_URL_ENV: Final = ENV_PREFIX + "STORE"
STORE_SCHEMES: Final = ("memory", "sqlite", "redis", "rediss")

#: The Profile fields, in declaration order: the keys [compaction] and
#: [models."…"] share with the library.
PROFILE_FIELDS: Final = tuple(field.name for field in dataclasses.fields(Profile))


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("must be an http:// or https:// URL")
    # Callers append paths ("/chat/completions"); a trailing slash would double it.
    return value.rstrip("/")


def _store_url(value: str) -> str:
    scheme = urlsplit(value).scheme.lower()
    if value and scheme not in STORE_SCHEMES:
        schemes = ", ".join(f"{name}://" for name in STORE_SCHEMES)
        raise ValueError(f"must be empty or a {schemes} URL")
    return value


_PositiveInt = Annotated[int, Field(gt=0)]
_NonNegativeInt = Annotated[int, Field(ge=0)]
_PositiveFloat = Annotated[float, Field(gt=0)]
_Ratio = Annotated[float, Field(gt=0, le=1)]
_HttpUrl = Annotated[str, AfterValidator(_http_url)]
_Name = Annotated[str, Field(min_length=1)]

_SECTION = ConfigDict(extra="forbid", frozen=True)

# One description per Profile field, shared by [compaction] and [models."…"].
_DOC: Final = {
    "context_window": "Context window in tokens, for models the built-in table does not know.",
    "reserve_tokens": "Tokens kept free for the reply (at most a quarter of the window).",
    "keep_recent_tokens": "Newest tokens kept verbatim (at most half the input limit).",
    "threshold": "Absolute trigger in tokens; compaction starts above min(threshold, limit).",
    "head_count": "Leading messages never compacted (extended over leading system messages).",
    "summarizer": "How the middle is summarized: llm, extractive or off.",
    "image_tokens": "Tokens counted for each image.",
    "tool_result_chars": "Pruner: tool results longer than this become a one-line brief.",
    "tool_args_chars": "Pruner: tool-call arguments longer than this are shortened.",
    "assistant_text_chars": "Pruner: assistant text longer than this is cut in the middle.",
    "assistant_keep_start": "Pruner: characters kept from the start of cut assistant text.",
    "assistant_keep_end": "Pruner: characters kept from the end of cut assistant text.",
    "prune_target": "Pruning alone ends a compaction only if it brings the request to this "
    "share of the trigger; otherwise the middle is condensed, to leave room for later turns.",
    "summary_ratio": "Summary budget as a share of the middle's tokens.",
    "summary_min_tokens": "Lower bound of the summary budget.",
    "summary_max_tokens": "Upper bound of the summary budget.",
    "summary_tool_result_chars": "Tool results are cut to this length for the summarizer.",
    "summarizer_context_window": "Window of the summary model, if smaller than the chat model's.",
    "read_tools": "Tool-name words that mean a file was read (for the file lists).",
    "modify_tools": "Tool-name words that mean a file was modified (for the file lists).",
    "summary_model": "Model that writes summaries; unset means the request's own model.",
}


class ServerSettings(BaseModel):
    """``[server]``: where the proxy listens and who may call it."""

    model_config = _SECTION

    host: str = Field(default=DEFAULT_HOST, description="Address to bind; loopback by default.")
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535, description="TCP port to listen on.")
    cors_origins: list[str] = Field(
        default_factory=list, description="Origins sent CORS headers; none unless configured."
    )
    api_key: SecretStr | None = Field(
        default=None, description="If set, clients must present this key to the proxy."
    )
    max_body_bytes: _PositiveInt = Field(
        default=DEFAULT_MAX_BODY_BYTES, description="Larger request bodies get 413 before parsing."
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="Log lines as plain text or one JSON object per line."
    )
    log_content: bool = Field(
        default=False,
        description="Also log the last message's text (never on by default: it is private).",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names accepted besides localhost when bound to loopback "
        "(other Host headers get 403, against DNS rebinding).",
    )


class UpstreamSettings(BaseModel):
    """``[upstream]``: the OpenAI-compatible server requests are forwarded to."""

    model_config = _SECTION

    base_url: _HttpUrl = Field(
        default=DEFAULT_UPSTREAM, description="Base URL of the upstream API."
    )
    api_key_env: _Name = Field(
        default=DEFAULT_API_KEY_ENV,
        description="Environment variable holding the key used when a client sends none.",
    )
    connect_timeout: _PositiveFloat = Field(
        default=DEFAULT_CONNECT_TIMEOUT, description="Seconds to wait for a connection."
    )
    read_timeout: _PositiveFloat = Field(
        default=DEFAULT_READ_TIMEOUT, description="Seconds to wait for the next upstream byte."
    )
    max_connections: _PositiveInt = Field(
        default=DEFAULT_MAX_CONNECTIONS, description="Size of the upstream connection pool."
    )
    max_keepalive_connections: _NonNegativeInt = Field(
        default=DEFAULT_MAX_KEEPALIVE_CONNECTIONS, description="Idle connections kept open."
    )


class StoreSettings(BaseModel):
    """``[store]``: where checkpoints, originals and events are kept (DESIGN.md §7)."""

    model_config = _SECTION

    url: Annotated[str, AfterValidator(_store_url)] = Field(
        default="",
        description="sqlite:///path.db, redis://host:port/db or memory://; empty means "
        "SQLite at $XDG_STATE_HOME/compaction-proxy/state.db (~/.local/state/… when unset). "
        f"{STORE_URL_ENV} also sets it; {STORE_URL_ENV}__URL wins if both are set.",
    )
    retention_days: _PositiveFloat = Field(
        default=DEFAULT_RETENTION_DAYS,
        description="Days the replaced messages (and old checkpoints and events) are kept.",
    )
    store_originals: bool = Field(
        default=True, description="Keep the messages each compaction replaced."
    )
    progress_min_ratio: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=DEFAULT_PROGRESS_MIN_RATIO,
        description="A compaction that shrinks the request by less than this share "
        "is not repeated for the same span.",
    )
    lock_ttl_seconds: _PositiveFloat = Field(
        default=DEFAULT_LOCK_TTL_SECONDS,
        description="Single-flight lock expiry: waiters proceed after this if the holder "
        "died. Keep it above the slowest summarization.",
    )

    @property
    def retention_seconds(self) -> float:
        return self.retention_days * 86400.0


class CompactionSettings(BaseModel):
    """``[compaction]``: the pipeline profile used unless a model table says otherwise."""

    model_config = _SECTION

    context_window: _PositiveInt = Field(
        default=DEFAULT_CONTEXT_WINDOW, description=_DOC["context_window"]
    )
    reserve_tokens: _NonNegativeInt = Field(
        default=DEFAULT_RESERVE_TOKENS, description=_DOC["reserve_tokens"]
    )
    keep_recent_tokens: _NonNegativeInt = Field(
        default=DEFAULT_KEEP_RECENT_TOKENS, description=_DOC["keep_recent_tokens"]
    )
    threshold: _PositiveInt | None = Field(default=None, description=_DOC["threshold"])
    head_count: _NonNegativeInt = Field(default=DEFAULT_HEAD_COUNT, description=_DOC["head_count"])
    summarizer: SummarizerMode = Field(default="llm", description=_DOC["summarizer"])
    image_tokens: _NonNegativeInt = Field(
        default=DEFAULT_IMAGE_TOKENS, description=_DOC["image_tokens"]
    )
    tool_result_chars: _PositiveInt = Field(
        default=DEFAULT_TOOL_RESULT_CHARS, description=_DOC["tool_result_chars"]
    )
    tool_args_chars: _PositiveInt = Field(
        default=DEFAULT_TOOL_ARGS_CHARS, description=_DOC["tool_args_chars"]
    )
    assistant_text_chars: _PositiveInt = Field(
        default=DEFAULT_ASSISTANT_TEXT_CHARS, description=_DOC["assistant_text_chars"]
    )
    assistant_keep_start: _NonNegativeInt = Field(
        default=DEFAULT_ASSISTANT_KEEP_START, description=_DOC["assistant_keep_start"]
    )
    assistant_keep_end: _NonNegativeInt = Field(
        default=DEFAULT_ASSISTANT_KEEP_END, description=_DOC["assistant_keep_end"]
    )
    prune_target: _Ratio = Field(default=DEFAULT_PRUNE_TARGET, description=_DOC["prune_target"])
    summary_ratio: _Ratio = Field(default=DEFAULT_SUMMARY_RATIO, description=_DOC["summary_ratio"])
    summary_min_tokens: _PositiveInt = Field(
        default=DEFAULT_SUMMARY_MIN_TOKENS, description=_DOC["summary_min_tokens"]
    )
    summary_max_tokens: _PositiveInt = Field(
        default=DEFAULT_SUMMARY_MAX_TOKENS, description=_DOC["summary_max_tokens"]
    )
    summary_tool_result_chars: _PositiveInt = Field(
        default=DEFAULT_SUMMARY_TOOL_RESULT_CHARS, description=_DOC["summary_tool_result_chars"]
    )
    summarizer_context_window: _PositiveInt | None = Field(
        default=None, description=_DOC["summarizer_context_window"]
    )
    read_tools: tuple[str, ...] = Field(default=DEFAULT_READ_TOOLS, description=_DOC["read_tools"])
    modify_tools: tuple[str, ...] = Field(
        default=DEFAULT_MODIFY_TOOLS, description=_DOC["modify_tools"]
    )
    summary_model: _Name | None = Field(default=None, description=_DOC["summary_model"])

    @model_validator(mode="after")
    def _valid_profile(self) -> CompactionSettings:
        self.to_profile()  # the library's cross-field rules; its ValueError names the field
        return self

    def to_profile(self, **changes: Any) -> Profile:
        """The :class:`Profile` these settings describe, with ``changes`` applied."""
        values: dict[str, Any] = {name: getattr(self, name) for name in PROFILE_FIELDS}
        values.update(changes)
        return Profile(**values)


class ModelOverride(BaseModel):
    """``[models."<name or glob>"]``: changes to [compaction] for matching models.

    Every field defaults to ``None``, meaning "inherit"; so an override cannot
    unset an optional setting (``threshold``) that [compaction] sets.
    """

    model_config = _SECTION

    context_window: _PositiveInt | None = Field(default=None, description=_DOC["context_window"])
    reserve_tokens: _NonNegativeInt | None = Field(default=None, description=_DOC["reserve_tokens"])
    keep_recent_tokens: _NonNegativeInt | None = Field(
        default=None, description=_DOC["keep_recent_tokens"]
    )
    threshold: _PositiveInt | None = Field(default=None, description=_DOC["threshold"])
    head_count: _NonNegativeInt | None = Field(default=None, description=_DOC["head_count"])
    summarizer: SummarizerMode | None = Field(default=None, description=_DOC["summarizer"])
    image_tokens: _NonNegativeInt | None = Field(default=None, description=_DOC["image_tokens"])
    tool_result_chars: _PositiveInt | None = Field(
        default=None, description=_DOC["tool_result_chars"]
    )
    tool_args_chars: _PositiveInt | None = Field(default=None, description=_DOC["tool_args_chars"])
    assistant_text_chars: _PositiveInt | None = Field(
        default=None, description=_DOC["assistant_text_chars"]
    )
    assistant_keep_start: _NonNegativeInt | None = Field(
        default=None, description=_DOC["assistant_keep_start"]
    )
    assistant_keep_end: _NonNegativeInt | None = Field(
        default=None, description=_DOC["assistant_keep_end"]
    )
    prune_target: _Ratio | None = Field(default=None, description=_DOC["prune_target"])
    summary_ratio: _Ratio | None = Field(default=None, description=_DOC["summary_ratio"])
    summary_min_tokens: _PositiveInt | None = Field(
        default=None, description=_DOC["summary_min_tokens"]
    )
    summary_max_tokens: _PositiveInt | None = Field(
        default=None, description=_DOC["summary_max_tokens"]
    )
    summary_tool_result_chars: _PositiveInt | None = Field(
        default=None, description=_DOC["summary_tool_result_chars"]
    )
    summarizer_context_window: _PositiveInt | None = Field(
        default=None, description=_DOC["summarizer_context_window"]
    )
    read_tools: tuple[str, ...] | None = Field(default=None, description=_DOC["read_tools"])
    modify_tools: tuple[str, ...] | None = Field(default=None, description=_DOC["modify_tools"])
    summary_model: _Name | None = Field(default=None, description=_DOC["summary_model"])
    upstream: _HttpUrl | None = Field(
        default=None, description="Base URL for these models instead of [upstream].base_url."
    )
    api_key_env: _Name | None = Field(
        default=None, description="Environment variable with the upstream key for these models."
    )

    def profile_changes(self) -> dict[str, Any]:
        """The Profile fields this override sets."""
        changes = {name: getattr(self, name) for name in PROFILE_FIELDS}
        return {name: value for name, value in changes.items() if value is not None}


class Settings(BaseSettings):
    """The whole configuration. Build it with :func:`config.load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
    )

    server: ServerSettings = Field(default_factory=ServerSettings, description="[server]")
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings, description="[upstream]")
    compaction: CompactionSettings = Field(
        default_factory=CompactionSettings, description="[compaction]"
    )
    store: StoreSettings = Field(default_factory=StoreSettings, description="[store]")
    models: dict[str, ModelOverride] = Field(
        default_factory=dict,
        description="Per-model overrides by exact name or glob; the most specific one applies.",
    )

    @field_validator("models")
    @classmethod
    def _overrides_fit_compaction(
        cls, models: dict[str, ModelOverride], info: ValidationInfo
    ) -> dict[str, ModelOverride]:
        # An override is checked against [compaction] now, so that a bad
        # combination fails at start-up instead of on the first request.
        compaction = info.data.get("compaction")
        if isinstance(compaction, CompactionSettings):
            for name, override in models.items():
                try:
                    compaction.to_profile(**override.profile_changes())
                except ValueError as exc:
                    raise PydanticCustomError(
                        OVERRIDE_CONFLICT,
                        '"{model}": {problem}',
                        {"model": name, "problem": str(exc)},
                    ) from None
        return models

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # No .env files or secret directories: the TOML file is the one file source.
        return (init_settings, EnvSource(settings_cls))


class EnvSource(EnvSettingsSource):
    """The ``COMPACTION_PROXY_*`` variables, with ``COMPACTION_PROXY_STORE`` read as
    [store] url when it is not a JSON object."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        name = STORE_URL_ENV.lower()
        raw = self.env_vars.get(name)
        self.store_url: str | None = None
        if raw is not None and not raw.lstrip().startswith("{"):
            self.store_url = raw
            self.env_vars = {key: value for key, value in self.env_vars.items() if key != name}

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        if self.store_url is not None:
            nested = data.get("store")
            data["store"] = {"url": self.store_url, **(nested if isinstance(nested, dict) else {})}
        return data
