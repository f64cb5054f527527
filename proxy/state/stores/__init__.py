"""proxy.state.stores: where checkpoints, originals, events, learned windows and calibration
ratios live.

    store = open_store(settings.store.url, retention_seconds=…, store_originals=…)
    found = await store.lookup(chain)            # one round trip
    async with store.lock(f"compact:{key}", ttl):  # single flight
        ...
    await store.close()

``url`` chooses the backend:

* ``""`` or ``sqlite://`` — SQLite at :func:`default_sqlite_path` (the default);
* ``sqlite:///absolute/path.db``, ``sqlite:///./relative.db`` — SQLite there;
* ``redis://host:port/db`` (or ``rediss://``) — shared by several replicas;
* ``memory://`` — this process only (tests).

:class:`Store` is one protocol per concern (:mod:`proxy.state.stores.protocols`):
``CheckpointLookup``, ``CheckpointStore``, ``EventStore``, ``LivenessStore``, ``LockStore``,
``WindowStore``, ``CalibrationStore``, ``FigureStore``, ``SettingsStore`` and
``UpkeepStore``; a consumer types against the ones it uses. Every backend
passes the same contract suite (``tests/proxy/state/stores``).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from proxy.state.stores.base import (
    DEFAULT_CAPACITY,
    DEFAULT_EVENTS_LIMIT,
    DEFAULT_MAX_MODEL_ROWS,
    DEFAULT_RETENTION_SECONDS,
    INTERRUPTED,
    OPEN_EVENT_TYPES,
    Event,
    EventType,
    StoreError,
    interrupted,
)
from proxy.state.stores.codec import to_dict
from proxy.state.stores.figures import (
    DEFAULT_REQUESTS_RETENTION_SECONDS,
    EMPTY_STREAM_STATUS,
    RequestRecord,
    SessionSettings,
    SessionSummary,
)
from proxy.state.stores.health import HealthReport, StoreHealth
from proxy.state.stores.memory import MemoryStore
from proxy.state.stores.protocols import (
    CalibrationStore,
    CheckpointLookup,
    CheckpointStore,
    EventStore,
    FigureStore,
    LivenessStore,
    LockStore,
    SettingsStore,
    Store,
    UpkeepStore,
    WindowStore,
)
from proxy.state.stores.redis import DEFAULT_KEY_PREFIX, RedisStore
from proxy.state.stores.resilient import (
    FailureKind,
    ResilientStore,
    StoreObserver,
    StoreUnavailable,
)
from proxy.state.stores.sqlite import SQLiteStore, default_sqlite_path

_SCHEMES = ("memory", "sqlite", "redis", "rediss")


def open_store(
    url: str,
    *,
    retention_seconds: float = DEFAULT_RETENTION_SECONDS,
    store_originals: bool = True,
    capacity: int = DEFAULT_CAPACITY,
    key_prefix: str = DEFAULT_KEY_PREFIX,
    timeout: float | None = None,
    requests_retention_seconds: float = DEFAULT_REQUESTS_RETENTION_SECONDS,
    max_model_rows: int = DEFAULT_MAX_MODEL_ROWS,
) -> Store:
    """The store ``url`` names; nothing is opened or connected until first use.

    ``capacity`` bounds the memory backend; ``max_model_rows`` the learned
    windows and the calibrations of every backend; ``key_prefix`` namespaces Redis keys;
    ``timeout`` bounds each Redis command (wrap the store in a
    :class:`ResilientStore` to bound every call of every backend).
    Raises :class:`ValueError` (a :class:`StoreError`) for an unknown scheme.
    """
    if retention_seconds <= 0:
        raise StoreError(f"retention must be positive, got {retention_seconds}")
    scheme = urlsplit(url).scheme.lower() if url else "sqlite"
    if scheme == "memory":
        return MemoryStore(
            capacity,
            retention_seconds=retention_seconds,
            store_originals=store_originals,
            requests_retention_seconds=requests_retention_seconds,
            max_model_rows=max_model_rows,
        )
    if scheme == "sqlite":
        return SQLiteStore(
            sqlite_path(url),
            retention_seconds=retention_seconds,
            store_originals=store_originals,
            requests_retention_seconds=requests_retention_seconds,
            max_model_rows=max_model_rows,
        )
    if scheme in ("redis", "rediss"):
        return RedisStore.from_url(
            url,
            key_prefix=key_prefix,
            retention_seconds=retention_seconds,
            store_originals=store_originals,
            timeout=timeout,
            requests_retention_seconds=requests_retention_seconds,
            max_model_rows=max_model_rows,
        )
    shown = f"{scheme!r}" if scheme else "none"
    raise StoreError(
        f"unsupported store URL scheme {shown} in {url!r}; "
        f"use one of {', '.join(s + '://' for s in _SCHEMES)}"
    )


def sqlite_path(url: str) -> Path:
    """The file a ``sqlite://`` URL names; the default path for ``""`` or ``sqlite://``.

    ``sqlite:///abs/state.db`` is absolute; ``sqlite:///./state.db`` and
    ``sqlite:///../state.db`` are relative to the working directory and
    ``sqlite:///~/state.db`` to the home directory.
    """
    rest = unquote(url[len("sqlite://") :]) if url else ""
    if rest in ("", "/"):
        return default_sqlite_path()
    if rest.startswith(("/./", "/../", "/~")):
        rest = rest[1:]
    return Path(rest).expanduser()


__all__ = [
    "DEFAULT_EVENTS_LIMIT",
    "DEFAULT_KEY_PREFIX",
    "EMPTY_STREAM_STATUS",
    "INTERRUPTED",
    "OPEN_EVENT_TYPES",
    "CalibrationStore",
    "CheckpointLookup",
    "CheckpointStore",
    "Event",
    "EventStore",
    "EventType",
    "FailureKind",
    "FigureStore",
    "HealthReport",
    "LivenessStore",
    "LockStore",
    "MemoryStore",
    "RedisStore",
    "RequestRecord",
    "ResilientStore",
    "SQLiteStore",
    "SessionSettings",
    "SessionSummary",
    "SettingsStore",
    "Store",
    "StoreError",
    "StoreHealth",
    "StoreObserver",
    "StoreUnavailable",
    "UpkeepStore",
    "WindowStore",
    "default_sqlite_path",
    "interrupted",
    "open_store",
    "sqlite_path",
    "to_dict",
]
