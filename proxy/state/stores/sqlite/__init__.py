"""proxy.state.stores.sqlite: the default store, one SQLite file under the user's state directory.

    store = SQLiteStore(default_sqlite_path())   # nothing is opened until first use
    await store.put(checkpoint, originals)
    await store.close()

* :mod:`.store` — :class:`SQLiteStore`, the store's operations as SQL;
* :mod:`.worker` — the one thread its I/O runs on, and its write transactions;
* :mod:`.file` — opening the file: its path, owner-only modes, WAL, and a
  damaged file moved aside;
* :mod:`.schema` — the tables, their migrations and the schema version.
"""

from __future__ import annotations

from proxy.state.stores.sqlite.file import default_sqlite_path
from proxy.state.stores.sqlite.schema import MIGRATIONS, SCHEMA_VERSION, migrate, schema_version
from proxy.state.stores.sqlite.store import SQLiteStore

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SQLiteStore",
    "default_sqlite_path",
    "migrate",
    "schema_version",
]
