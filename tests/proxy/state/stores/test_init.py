"""The package surface and open_store's URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

import proxy.state.stores
from proxy.state.stores import (
    MemoryStore,
    RedisStore,
    SQLiteStore,
    StoreError,
    default_sqlite_path,
    open_store,
    sqlite_path,
)

pytestmark = pytest.mark.anyio


def test_public_surface_is_pinned() -> None:
    # Sorted as ruff sorts it (RUF022): constants, then classes, then functions.
    assert proxy.state.stores.__all__ == [
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
    for name in proxy.state.stores.__all__:
        assert getattr(proxy.state.stores, name) is not None


def test_default_path_follows_xdg_state_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_sqlite_path() == tmp_path / "state" / "compaction-proxy" / "state.db"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_sqlite_path() == tmp_path / ".local/state/compaction-proxy/state.db"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///var/lib/proxy/state.db", Path("/var/lib/proxy/state.db")),
        ("sqlite:///./state.db", Path("state.db")),
        ("sqlite:///../up/state.db", Path("../up/state.db")),
        ("sqlite:///tmp/with%20space.db", Path("/tmp/with space.db")),
    ],
)
def test_sqlite_urls(url: str, expected: Path) -> None:
    assert sqlite_path(url) == expected


def test_empty_url_and_bare_sqlite_mean_the_default_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert sqlite_path("") == sqlite_path("sqlite://") == default_sqlite_path()
    store = open_store("")
    assert isinstance(store, SQLiteStore)
    assert store.path == tmp_path / "compaction-proxy" / "state.db"


async def test_open_store_picks_the_backend(tmp_path: Path) -> None:
    memory = open_store("memory://", capacity=2)
    assert isinstance(memory, MemoryStore)
    sqlite = open_store(f"sqlite://{tmp_path}/s.db")
    assert isinstance(sqlite, SQLiteStore)
    shared = open_store("redis://127.0.0.1:1/0")  # connects on first use only
    assert isinstance(shared, RedisStore)
    for store in (memory, sqlite, shared):
        await store.close()


@pytest.mark.parametrize("url", ["postgres://db/x", "file:///tmp/x", "just-a-path.db"])
def test_unknown_scheme_is_a_value_error_naming_it(url: str) -> None:
    with pytest.raises(ValueError, match="unsupported store URL scheme") as caught:
        open_store(url)
    assert isinstance(caught.value, StoreError)
    scheme = url.split("://")[0] if "://" in url else "none"
    assert scheme in str(caught.value)


def test_retention_must_be_positive() -> None:
    with pytest.raises(StoreError):
        open_store("memory://", retention_seconds=0)


async def test_memory_store_is_bounded() -> None:
    from tests.proxy.state.stores.test_contract import ORIGINALS, checkpoint

    store = MemoryStore(capacity=2)
    made = [checkpoint(f"h{index}") for index in range(3)]
    for item in made:
        await store.put(item, ORIGINALS)
    assert await store.lookup(["h0", "h1", "h2"]) == {"h1": made[1], "h2": made[2]}
    assert await store.get(made[0].id) is None
    assert await store.originals(made[0].id) is None
