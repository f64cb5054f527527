"""The settings models: what ``compaction-proxy.toml`` and the environment may hold.

Layout (docs/configuration.md)::

    [server]            ServerSettings      where the proxy listens, who may call it
    [upstream]          UpstreamSettings    where requests go
    [compaction]        CompactionSettings  every Profile field + summary_model
    [store]             StoreSettings       checkpoints, originals, events (proxy.state.stores)
    [background]        BackgroundSettings  compactions prepared ahead: caps, their own pool
    [models."<glob>"]   ModelOverride       per-model changes to [compaction]

Every model forbids unknown keys and is frozen. The pipeline's fields are not
repeated here: ``CompactionSettings`` and ``ModelOverride`` are derived from the
:class:`~compaction.profile.Profile` declarations (type, default, bounds,
description), so a new Profile field is a new key in both. Validation of
[compaction] ends by building a Profile, so the library's own cross-field rules
(e.g. ``summary_max_tokens >= summary_min_tokens``) decide.

``Settings()`` reads keyword arguments and ``COMPACTION_PROXY_*`` variables
only; :func:`config.load_settings` adds the TOML file and readable errors.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, get_type_hints
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    SecretStr,
    ValidationInfo,
    create_model,
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

from compaction import DEFAULT_READING_CACHE_BYTES, Bounds, Profile

ENV_PREFIX: Final = "COMPACTION_PROXY_"
ENV_NESTED_DELIMITER: Final = "__"

#: Error type of an override that is invalid only together with [compaction].
OVERRIDE_CONFLICT: Final = "override_conflict"

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8808
DEFAULT_MAX_BODY_BYTES: Final = 32 * 1024 * 1024
DEFAULT_UPSTREAM: Final = "https://api.openai.com/v1"
DEFAULT_API_KEY_ENV: Final = "OPENAI_API_KEY"
DEFAULT_ANTHROPIC_UPSTREAM: Final = "https://api.anthropic.com/v1"
DEFAULT_ANTHROPIC_KEY_ENV: Final = "ANTHROPIC_API_KEY"
DEFAULT_CONNECT_TIMEOUT: Final = 10.0
DEFAULT_READ_TIMEOUT: Final = 600.0
DEFAULT_MAX_CONNECTIONS: Final = 100
DEFAULT_MAX_KEEPALIVE_CONNECTIONS: Final = 20
#: Below the 5 s idle timeout of uvicorn (vLLM, llama.cpp's python server):
#: the proxy drops an idle connection before the server does, so a request is
#: rarely sent on a connection that is closing under it.
DEFAULT_KEEPALIVE_EXPIRY: Final = 4.0
DEFAULT_RETENTION_DAYS: Final = 30.0
DEFAULT_PROGRESS_MIN_RATIO: Final = 0.10
DEFAULT_LOCK_TTL_SECONDS: Final = 120.0
DEFAULT_HEARTBEAT_SECONDS: Final = 30.0
#: A summary of a long span from a slow model takes tens of seconds; two
#: minutes allows for that and still frees a request held by an upstream that
#: trickles its answer a byte at a time (each within the read timeout).
DEFAULT_SUMMARIZER_TIMEOUT: Final = 120.0
#: Asking a local server for its window takes a few milliseconds; a server
#: that needs longer is busy or not one that answers, and the question is
#: asked off the request path, so nobody waits on it.
DEFAULT_DISCOVERY_TIMEOUT: Final = 3.0
#: A request waits for another request's compaction of the same conversation
#: as long as one summary may take; past that it compacts on its own (the work
#: may be done twice, nobody hangs).
DEFAULT_LOCK_WAIT_SECONDS: Final = DEFAULT_SUMMARIZER_TIMEOUT
#: A healthy store answers in about a millisecond (SQLite on a local disk,
#: Redis on the LAN); two seconds is far beyond that, even for a write queued
#: behind another process's, and short next to the model's answer the request
#: waits for anyway. A store slower than this is treated as down.
DEFAULT_STORE_TIMEOUT_SECONDS: Final = 2.0

#: A short name for [store] url, as docs/state.md and the Docker image spell it; the nested
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
_HttpUrl = Annotated[str, AfterValidator(_http_url)]
_Name = Annotated[str, Field(min_length=1)]

_SECTION = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(BaseModel):
    """``[server]``: where the proxy listens and who may call it."""

    model_config = _SECTION

    host: str = Field(default=DEFAULT_HOST, description="Address to bind; loopback by default.")
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535, description="TCP port to listen on.")
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Web origins that may call the proxy (and get CORS headers); a request "
        "with any other Origin header is refused. None unless configured; * allows all.",
    )
    api_key: SecretStr | None = Field(
        default=None, description="If set, clients must present this key to the proxy."
    )
    admin_key: SecretStr | None = Field(
        default=None,
        description="If set, a client presenting it in the x-compaction-proxy-admin-key "
        "header sees every caller's compaction events and checkpoints (others see their own).",
    )
    dashboard_session_hours: _PositiveFloat = Field(
        default=12.0,
        description="A dashboard sign-in lasts this long: the cookie's Max-Age, and checked "
        "on the server, which refuses an older cookie; signing out ends it at once.",
    )
    max_body_bytes: _PositiveInt = Field(
        default=DEFAULT_MAX_BODY_BYTES,
        description="Larger bodies sent to the compacted and pass-through routes get 413, "
        "refused as they stream in.",
    )
    max_form_bytes: _PositiveInt = Field(
        default=1024 * 1024,
        description="Larger bodies sent to the dashboard's forms (/ui) or the JSON routes "
        "under /v1/compaction get 413 before they are read in full.",
    )
    max_model_chars: _PositiveInt = Field(
        default=256, description="A longer model name in a request gets 400."
    )
    max_session_id_chars: _PositiveInt = Field(
        default=128,
        description="A longer session id in a /v1/compaction or /ui path gets 400 "
        "(the proxy's own are 16 characters).",
    )
    max_instructions_chars: _PositiveInt = Field(
        default=4_000, description="Longer per-session instructions get 400."
    )
    max_summary_chars: _PositiveInt = Field(
        default=200_000, description="A longer edited summary gets 400."
    )
    header_timeout_seconds: _PositiveFloat = Field(
        default=10.0,
        description="A connection that has not sent a request's complete headers this long "
        "after it opened (or after the first byte of its next request) is closed.",
    )
    body_timeout_seconds: _PositiveFloat = Field(
        default=30.0,
        description="A connection whose request body stops arriving for this long is closed.",
    )
    max_connections: _PositiveInt = Field(
        default=500,
        description="Client connections held at once; one more is answered 503 and closed "
        "(keep it below the descriptor limit, ulimit -n, less upstream.max_connections).",
    )
    incremental_cache_mb: _NonNegativeInt = Field(
        default=DEFAULT_READING_CACHE_BYTES // (1024 * 1024),
        description="Memory (MiB, estimated) for the latest request of each conversation, so "
        "that the next one, which resends it, is read in proportion to what is new; the least "
        "recently used conversations are forgotten first. 0 reads every request in full.",
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
        description="Host names accepted besides localhost when the Host check applies "
        "(other Host headers get 403, against DNS rebinding).",
    )
    check_host: bool = Field(
        default=False,
        description="Apply the Host check whatever the bind address (on in the Docker "
        "image, which binds 0.0.0.0); otherwise it applies only when bound to loopback.",
    )

    @model_validator(mode="after")
    def _distinct_keys(self) -> ServerSettings:
        # An empty key would be matched by an empty header (``Bearer `` with
        # nothing after it): a lock anyone opens. Refused, not ignored: a set
        # but empty variable usually means a secret that failed to load.
        admin, proxy = self.admin_key, self.api_key
        for name, key in (("api_key", proxy), ("admin_key", admin)):
            if key is not None and not key.get_secret_value().strip():
                raise ValueError(f"server.{name} must not be empty")
        # Every client holds the proxy key: as the admin key too, it would show
        # each of them everyone's conversations.
        if admin is None:
            return self
        if proxy is not None and admin.get_secret_value() == proxy.get_secret_value():
            raise ValueError("server.admin_key must differ from server.api_key")
        return self


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
    anthropic_base_url: _HttpUrl = Field(
        default=DEFAULT_ANTHROPIC_UPSTREAM,
        description="Base URL of the Anthropic Messages API (POST /v1/messages is sent to "
        "<this>/messages).",
    )
    anthropic_api_key_env: _Name = Field(
        default=DEFAULT_ANTHROPIC_KEY_ENV,
        description="Environment variable holding the x-api-key sent to anthropic_base_url "
        "when a client sends no key.",
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
        default=DEFAULT_MAX_KEEPALIVE_CONNECTIONS,
        description="Deprecated and ignored (idle connections now expire after "
        "keepalive_expiry); accepted so that older files still load.",
    )
    keepalive_expiry: _PositiveFloat = Field(
        default=DEFAULT_KEEPALIVE_EXPIRY,
        description="Seconds an idle upstream connection is kept for reuse.",
    )
    trust_env: bool = Field(
        default=True,
        description="Route upstream requests through HTTP_PROXY / HTTPS_PROXY (NO_PROXY "
        "exempts hosts; credentials in the proxy URL), as set when the proxy starts.",
    )
    ca_bundle: FilePath | None = Field(
        default=None,
        description="PEM file of the certificate authorities that upstream TLS "
        "certificates are checked against, instead of the system's.",
    )
    summarizer_timeout_seconds: _PositiveFloat = Field(
        default=DEFAULT_SUMMARIZER_TIMEOUT,
        description="Seconds a summary request may take in all (connecting, every read, "
        "its one retry), however steadily the upstream trickles bytes, until the "
        "upstream's speed is measured; then at least this, and as long as the prompt "
        "needs at the slowest speed measured, times 3 (at most 30 minutes). Past it the "
        "extractive summary is used instead.",
    )
    discover_windows: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="Ask the upstream server which context window it serves (llama.cpp "
        "/props, /v1/models, LM Studio, Ollama) once per model, in the background: "
        '"auto" asks servers on this machine or the local network only (loopback, '
        'private addresses, names without a dot, .local, .internal), "always" any, '
        '"never" none. A window set in [models."…"] wins over the stated one.',
    )
    discovery_timeout_seconds: _PositiveFloat = Field(
        default=DEFAULT_DISCOVERY_TIMEOUT,
        description="Seconds the questions about a server's window may take in all; a "
        "server silent that long is taken to state nothing.",
    )


class BackgroundSettings(BaseModel):
    """``[background]``: the compactions prepared ahead of need, off the request path."""

    model_config = _SECTION

    max_running: _PositiveInt = Field(
        default=4,
        description="Compactions prepared in the background at once in this process; "
        "one more is not started (the request that crosses its trigger compacts itself).",
    )
    max_running_per_owner: _PositiveInt = Field(
        default=1,
        description="Of those, at once for one caller (one key); one more is not started.",
    )
    max_connections: _PositiveInt = Field(
        default=2,
        description="Size of the upstream connection pool the background summaries use, "
        "apart from upstream.max_connections, so they never take a connection a "
        "request is waiting for.",
    )
    single_slot: Literal["wait", "off"] = Field(
        default="wait",
        description="For an upstream that serves one request at a time (llama.cpp's "
        "/props total_slots = 1, or seen queueing requests behind summaries): 'wait' "
        "asks a preparation's summary only while no user request to it is in flight, "
        "and cancels it for one that arrives; 'off' prepares nothing for it.",
    )


class StoreSettings(BaseModel):
    """``[store]``: where checkpoints, originals and events are kept (docs/state.md)."""

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
    requests_retention_days: _PositiveFloat = Field(
        default=7.0,
        description="Days the per-request figures behind the dashboard (sizes, stage, "
        "time; never content) are kept.",
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
    lock_wait_seconds: _PositiveFloat = Field(
        default=DEFAULT_LOCK_WAIT_SECONDS,
        description="Seconds a request waits for another's compaction of the same "
        "conversation (the single-flight lock); past it, it compacts on its own.",
    )
    heartbeat_seconds: Annotated[float, Field(ge=0.1)] = Field(
        default=DEFAULT_HEARTBEAT_SECONDS,
        description="How long a replica's heartbeat lives in a shared store; it is renewed "
        "every third of this, when a failing store is also asked again. A replica that "
        "stopped is seen dead this long after, and the compactions it left are closed.",
    )
    timeout_seconds: _PositiveFloat = Field(
        default=DEFAULT_STORE_TIMEOUT_SECONDS,
        description="A store call that takes longer is abandoned: the request is served "
        "without the store (compacted afresh, nothing stored) and /healthz says degraded.",
    )
    max_model_rows: _PositiveInt = Field(
        default=1_000,
        description="Learned context windows, and calibration ratios, kept per caller, upstream "
        "and model (model names and keys are the clients' to choose): past this many the least "
        "recently updated is dropped, in the store and in memory. Unused ones go with the "
        "retention.",
    )

    @property
    def retention_seconds(self) -> float:
        return self.retention_days * 86400.0

    @property
    def requests_retention_seconds(self) -> float:
        return self.requests_retention_days * 86400.0


def _profile_fields(*, inherit: bool) -> dict[str, Any]:
    """The Profile fields as pydantic field definitions, from their declarations.

    With ``inherit`` every field is optional and defaults to ``None``: "take
    the value from [compaction]".
    """
    types = get_type_hints(Profile)
    definitions: dict[str, Any] = {}
    for declared in dataclasses.fields(Profile):
        bounds: Bounds | None = declared.metadata["bounds"]
        limits = {} if bounds is None else dataclasses.asdict(bounds)
        info = Field(
            default=None if inherit else declared.default,
            description=declared.metadata["description"],
            **{name: limit for name, limit in limits.items() if limit is not None},
        )
        kind = types[declared.name]
        definitions[declared.name] = (kind | None if inherit else kind, info)
    return definitions


# mypy cannot see the fields of a model built at run time, so to it these bases
# are plain models (a hand-typed stub would repeat every field, the thing this
# module exists to avoid). Typed code builds the settings with model_validate()
# and reads the Profile fields through to_profile() or profile_changes().
if TYPE_CHECKING:
    _ProfileSettings = BaseModel
    _ProfileOverride = BaseModel
else:
    _ProfileSettings = create_model(
        "_ProfileSettings", __config__=_SECTION, **_profile_fields(inherit=False)
    )
    _ProfileOverride = create_model(
        "_ProfileOverride", __config__=_SECTION, **_profile_fields(inherit=True)
    )

_SUMMARY_MODEL_DOC: Final = "Model that writes summaries; unset means the request's own model."


class CompactionSettings(_ProfileSettings):
    """``[compaction]``: the pipeline profile used unless a model table says otherwise.

    Every :class:`~compaction.profile.Profile` field, with the default, bounds
    and description declared there, then ``summary_model``.
    """

    model_config = _SECTION

    summary_model: _Name | None = Field(default=None, description=_SUMMARY_MODEL_DOC)

    @model_validator(mode="after")
    def _valid_profile(self) -> CompactionSettings:
        self.to_profile()  # the library's cross-field rules; its ValueError names the field
        return self

    def to_profile(self, **changes: Any) -> Profile:
        """The :class:`Profile` these settings describe, with ``changes`` applied."""
        values: dict[str, Any] = {name: getattr(self, name) for name in PROFILE_FIELDS}
        values.update(changes)
        return Profile(**values)


class ModelOverride(_ProfileOverride):
    """``[models."<name or glob>"]``: changes to [compaction] for matching models.

    Every Profile field, then ``summary_model``, ``upstream`` and ``api_key_env``.
    Every field defaults to ``None``, meaning "inherit"; so an override cannot
    unset an optional setting (``threshold``) that [compaction] sets.
    """

    model_config = _SECTION

    summary_model: _Name | None = Field(default=None, description=_SUMMARY_MODEL_DOC)
    anthropic_upstream: _HttpUrl | None = Field(
        default=None,
        description="Anthropic Messages base URL for these models instead of "
        "[upstream].anthropic_base_url.",
    )
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
    background: BackgroundSettings = Field(
        default_factory=BackgroundSettings, description="[background]"
    )
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
