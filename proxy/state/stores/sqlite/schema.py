"""The SQLite file's schema: the tables, the steps that built them, and the version.

The schema is versioned with ``PRAGMA user_version``. :data:`MIGRATIONS` is the
ordered list of steps, each moving the file one version up; :func:`migrate`
applies the ones a file lacks, each in its own transaction under the write
lock, so a file written by any earlier version is brought up to date on open
and two processes opening it at once never apply a step twice. A file from a
newer version is refused (:class:`~proxy.state.stores.base.StoreError`) rather
than guessed at.

A step once released is never edited: a change to the schema is a new entry at
the end, written so that the rows already in the file stay meaningful.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final

from proxy.state.stores.base import StoreError

#: Each entry moves the schema from version ``index`` to ``index + 1``.
MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """CREATE TABLE checkpoints (
            id TEXT PRIMARY KEY,
            end_hash TEXT NOT NULL,
            session TEXT NOT NULL,
            created_at REAL NOT NULL,
            json BLOB NOT NULL
        )""",
        "CREATE UNIQUE INDEX checkpoints_end_hash ON checkpoints (end_hash)",
        "CREATE INDEX checkpoints_created_at ON checkpoints (created_at)",
        """CREATE TABLE originals (
            checkpoint_id TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            json BLOB NOT NULL
        )""",
        "CREATE INDEX originals_created_at ON originals (created_at)",
        """CREATE TABLE events (
            id TEXT PRIMARY KEY,
            compaction_id TEXT NOT NULL,
            session TEXT NOT NULL,
            type TEXT NOT NULL,
            created_at REAL NOT NULL,
            instance TEXT NOT NULL,
            json BLOB NOT NULL
        )""",
        "CREATE INDEX events_session ON events (session, created_at)",
        "CREATE INDEX events_created_at ON events (created_at)",
        "CREATE INDEX events_compaction ON events (compaction_id)",
        'CREATE TABLE learned_windows (model TEXT PRIMARY KEY, "window" INTEGER NOT NULL)',
    ),
    ("CREATE TABLE calibrations (key TEXT PRIMARY KEY, ratio REAL NOT NULL)",),
    # Owners, so one caller never reads another's; rows from before have none ("").
    (
        "ALTER TABLE checkpoints ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE events ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
        # One caller's newest events without reading everyone else's: rowid
        # is implicitly the index's last column, so ORDER BY rowid walks it.
        "CREATE INDEX events_owner ON events (owner)",
    ),
    # Per-request figures, their sessions and hourly savings; per-session
    # settings, for the dashboard.
    (
        """CREATE TABLE requests (
            session TEXT NOT NULL,
            owner TEXT NOT NULL,
            created_at REAL NOT NULL,
            json BLOB NOT NULL
        )""",
        "CREATE INDEX requests_session ON requests (session, created_at)",
        "CREATE INDEX requests_created_at ON requests (created_at)",
        """CREATE TABLE sessions (
            owner TEXT NOT NULL,
            session TEXT NOT NULL,
            last_at REAL NOT NULL,
            json BLOB NOT NULL,
            PRIMARY KEY (owner, session)
        )""",
        "CREATE INDEX sessions_last_at ON sessions (last_at)",
        "CREATE INDEX sessions_owner ON sessions (owner, last_at)",
        """CREATE TABLE savings (
            owner TEXT NOT NULL,
            bucket REAL NOT NULL,
            saved INTEGER NOT NULL,
            PRIMARY KEY (owner, bucket)
        )""",
        """CREATE TABLE session_settings (
            owner TEXT NOT NULL,
            session TEXT NOT NULL,
            json BLOB NOT NULL,
            PRIMARY KEY (owner, session)
        )""",
    ),
    # When each learned window, calibration and session setting was last set:
    # they are keyed by names a client chooses, so they are capped (the least
    # recently set dropped) and purged with the retention. Rows from before
    # count as set now, so an upgrade purges none of them at once.
    (
        *(
            statement
            for table in ("learned_windows", "calibrations", "session_settings")
            for statement in (
                f"ALTER TABLE {table} ADD COLUMN updated_at REAL NOT NULL DEFAULT 0",
                f"UPDATE {table} SET updated_at = (julianday('now') - 2440587.5) * 86400.0",
                f"CREATE INDEX {table}_updated_at ON {table} (updated_at)",
            )
        ),
        # The owners of one session id (an admin steering it), without a scan.
        "CREATE INDEX sessions_session ON sessions (session)",
    ),
)
SCHEMA_VERSION: Final = len(MIGRATIONS)


def schema_version(connection: sqlite3.Connection) -> int:
    """The version the file is at: ``0`` for a new one."""
    version: int = connection.execute("PRAGMA user_version").fetchone()[0]
    return version


def migrate(
    connection: sqlite3.Connection, migrations: Sequence[Sequence[str]] = MIGRATIONS
) -> int:
    """Apply the steps the file lacks, each in one transaction; the version reached.

    ``connection`` must be in autocommit mode (``isolation_level=None``).
    """
    while True:
        connection.execute("BEGIN IMMEDIATE")  # re-read under the write lock: another
        try:  # process may be migrating the same file
            version = schema_version(connection)
            if version > len(migrations):
                raise StoreError(
                    f"the database is at schema version {version}, newer than this "
                    f"proxy's {len(migrations)}; upgrade the proxy or use another file"
                )
            if version == len(migrations):
                connection.execute("COMMIT")
                return version
            for statement in migrations[version]:
                connection.execute(statement)
            connection.execute(f"PRAGMA user_version = {version + 1}")
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
