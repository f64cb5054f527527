"""Where the last ``serve`` keeps its state, for ``sessions`` and ``show``.

``serve --config proxy.toml`` writes to the store that file names, while
``sessions`` run without the same ``--config`` read the default one — empty,
or another proxy's. So ``serve`` leaves, in the default state folder
(``$XDG_STATE_HOME/compaction-proxy``), a small file naming the configuration
it read and its store; ``sessions`` and ``show`` given no configuration of
their own (no ``--config``, ``$COMPACTION_PROXY_CONFIG``,
``./compaction-proxy.toml`` or store URL in the environment) read that.

The file holds a path and a store location, never a secret: a store URL that
carries a password is left out (the configuration file named beside it, or
the environment, gives it again). A relative SQLite path is written made
absolute, since ``serve`` may have started in another folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import orjson

from config import Settings, find_config_file, load_settings
from proxy.state.stores import sqlite_path
from proxy.state.stores.sqlite import default_sqlite_path

#: The file's name, beside the default ``state.db``.
SERVED_FILE: Final = "serve.json"
#: Environment variables that name a store as a configuration file would.
_STORE_ENV: Final = ("COMPACTION_PROXY_STORE__URL", "COMPACTION_PROXY_STORE")


def served_file() -> Path:
    return default_sqlite_path().parent / SERVED_FILE


def _store_location(url: str) -> str | None:
    """``url`` as another working directory reads it the same; ``None`` when
    it cannot be written down (it carries a password)."""
    scheme = urlsplit(url).scheme.lower() if url else "sqlite"
    if scheme == "sqlite":
        return f"sqlite://{sqlite_path(url).resolve()}"
    if urlsplit(url).password is not None:
        return None
    return url


def remember(config_file: Path | None, settings: Settings) -> None:
    """Leave where this ``serve`` keeps its state; a folder that cannot be
    written leaves nothing (``sessions`` then reads its defaults, as before)."""
    record = {
        "config": str(config_file.resolve()) if config_file is not None else None,
        "store": _store_location(settings.store.url),
    }
    path = served_file()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(orjson.dumps(record))
    except OSError:
        return


@dataclass(frozen=True)
class Served:
    """The settings ``sessions`` and ``show`` read, and where they came from."""

    settings: Settings
    #: Set when they are the last ``serve``'s: a line saying so.
    note: str | None = None


def _configured_here(config_file: str | None) -> bool:
    return (
        config_file is not None
        or find_config_file(None) is not None  # $COMPACTION_PROXY_CONFIG, ./compaction-proxy.toml
        or any(os.environ.get(name) for name in _STORE_ENV)
    )


def dashboard_settings(config_file: str | None) -> Served:
    """The settings of ``sessions`` and ``show``: their own where they have
    any, else the last ``serve``'s (see the module doc)."""
    if _configured_here(config_file):
        return Served(load_settings(config_file))
    try:
        record = orjson.loads(served_file().read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return Served(load_settings(None))
    config = record.get("config") if isinstance(record, dict) else None
    store = record.get("store") if isinstance(record, dict) else None
    config = config if isinstance(config, str) and Path(config).is_file() else None
    overrides = {"store": {"url": store}} if isinstance(store, str) else {}
    settings = load_settings(config, **overrides)
    where = f"the configuration {config}" if config else "its defaults"
    return Served(settings, f"reading the store serve last used ({where})")
