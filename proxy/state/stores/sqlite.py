"""The default store: one SQLite file under the user's state directory.

One connection, opened on first use and used only from one dedicated worker
thread, so store I/O never blocks the event loop (the loop awaits
``run_in_executor``). WAL mode lets several processes share the file: readers
never wait for the writer, and writers wait up to the busy timeout.

The schema is versioned with ``PRAGMA user_version``; :data:`MIGRATIONS` is
the ordered list of steps, each applied in its own transaction, so a file
written by any earlier version is brought up to date on open. A file from a
newer version is refused rather than guessed at. A damaged file — not a
database, truncated, corrupt — is moved aside (``state.db.corrupt-<time>``,
with its ``-wal`` and ``-shm``) and a fresh one started, so the proxy still
starts: its state is a cache of work, never a reason not to serve.

The file holds conversations, so it is its owner's alone whatever the umask:
the database is made (or made again) ``0600`` before SQLite opens it, and
SQLite gives its ``-wal`` and ``-shm`` the database's own mode. A directory
the proxy creates is ``0700``; its own default directory found wider is
tightened, and a directory the user chose found readable by others is left
as it is with a warning (it may be shared on purpose; the file is not).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

from compaction import Checkpoint, Message
from proxy.state.stores import codec
from proxy.state.stores.base import (
    DEFAULT_EVENTS_LIMIT,
    DEFAULT_MAX_MODEL_ROWS,
    DEFAULT_RETENTION_SECONDS,
    INTERRUPTED,
    Event,
    StoreError,
    checked_ratio,
    interrupted,
)
from proxy.state.stores.figures import (
    DEFAULT_REQUESTS_LIMIT,
    DEFAULT_REQUESTS_RETENTION_SECONDS,
    DEFAULT_SESSIONS_LIMIT,
    SAVINGS_BUCKET_SECONDS,
    RequestRecord,
    SessionSettings,
    SessionSummary,
    by_session,
    fold,
    savings_of,
)
from proxy.state.stores.locks import LeaseLocks

_T = TypeVar("_T")
logger = logging.getLogger(__name__)

BUSY_TIMEOUT_SECONDS: Final = 10.0

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

_OPEN_TYPES_SQL: Final = "('compaction.queued', 'compaction.started')"


def default_sqlite_path() -> Path:
    """``$XDG_STATE_HOME/compaction-proxy/state.db``, else ``~/.local/state/…``."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "compaction-proxy" / "state.db"


def schema_version(connection: sqlite3.Connection) -> int:
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


class SQLiteStore:
    """The :class:`~proxy.state.stores.protocols.Store` contract in one SQLite file."""

    #: No heartbeats in the file: two proxies may share it, so another
    #: instance's open compactions are closed only at start-up.
    tracks_liveness = False

    def __init__(
        self,
        path: str | Path,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        store_originals: bool = True,
        requests_retention_seconds: float = DEFAULT_REQUESTS_RETENTION_SECONDS,
        max_model_rows: int = DEFAULT_MAX_MODEL_ROWS,
    ) -> None:
        self.path = Path(path)
        self._max_model_rows = max_model_rows
        self._requests_retention = requests_retention_seconds
        self._retention = retention_seconds
        self._store_originals = store_originals
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compaction-store")
        self._connection: sqlite3.Connection | None = None  #: touched by the worker only
        #: Every checkpoint end hash in the file (a superset: rows deleted
        #: since are dropped at the next reload), and the ``data_version`` it
        #: was read at; touched by the worker only. See :meth:`_known_ends`.
        self._ends: set[str] | None = None
        self._ends_version = -1
        self._locks = LeaseLocks()
        self._closed = False

    # -- the worker thread -------------------------------------------------

    async def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._closed:
            raise StoreError(f"the store at {self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(self._call, work))

    def _call(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._connection is None:
            self._connection = self._open()
        return work(self._connection)

    def _open(self) -> sqlite3.Connection:
        _private_directory(self.path.parent)
        found = _inode(self.path)
        try:
            return self._connect()
        except (sqlite3.DatabaseError, _Damaged) as exc:
            damage = _damage(exc)
            if damage is None:
                raise
        # Another proxy on the file may have moved it aside already: only the
        # file found damaged is moved, never the fresh one that replaced it.
        if _inode(self.path) == found:
            aside = _move_aside(self.path)
            logger.warning(
                "the state database %s is damaged (%s); moved it aside to %s and started "
                "a fresh one (its checkpoints, originals and events are not used)",
                self.path,
                damage,
                aside,
            )
        return self._connect()

    def _connect(self) -> sqlite3.Connection:
        _private_file(self.path)
        connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
            _enter_wal(connection)
            connection.execute("PRAGMA synchronous = NORMAL")
            # Once per process, before anything is written to it: a truncated
            # file passes the header checks and fails only on the lost pages.
            # Reads every page: ~0.15 s for 200 MB (warm cache).
            verdict = connection.execute("PRAGMA quick_check(1)").fetchone()
            if verdict != ("ok",):
                raise _Damaged("quick_check failed")
            migrate(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    @staticmethod
    def _write(connection: sqlite3.Connection, work: Callable[[], _T]) -> _T:
        connection.execute("BEGIN IMMEDIATE")
        try:
            result = work()
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
        return result

    # -- checkpoints -------------------------------------------------------

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        if not hashes:
            return {}
        wanted = list(dict.fromkeys(hashes))

        def work(connection: sqlite3.Connection) -> dict[str, Checkpoint]:
            found: dict[str, Checkpoint] = {}
            ends = self._known_ends(connection)
            hits = [h for h in wanted if h in ends]
            for start in range(0, len(hits), 500):  # below SQLite's variable limit
                chunk = hits[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                rows = connection.execute(
                    f"SELECT end_hash, json FROM checkpoints WHERE end_hash IN ({marks})", chunk
                )
                for end_hash, raw in rows:
                    found[end_hash] = codec.load_checkpoint(raw)
            return found

        return await self._run(work)

    def _known_ends(self, connection: sqlite3.Connection) -> set[str]:
        """The end hashes in the file, re-read only when another connection wrote.

        A request resends its whole history, so a lookup asks for hundreds of
        hashes of which at most a few are checkpoints; asking SQLite for all of
        them cost ~0.6 ms a request. ``PRAGMA data_version`` changes when
        another connection (another process) commits, never for this one's
        own writes, which :meth:`put` adds here itself.
        """
        version: int = connection.execute("PRAGMA data_version").fetchone()[0]
        if self._ends is None or version != self._ends_version:
            self._ends = {row[0] for row in connection.execute("SELECT end_hash FROM checkpoints")}
            self._ends_version = version
        return self._ends

    async def put(
        self, checkpoint: Checkpoint, originals: Sequence[Message] | None = None, *, owner: str = ""
    ) -> None:
        keep = originals is not None and self._store_originals

        def work(connection: sqlite3.Connection) -> None:
            raw = codec.dump_checkpoint(checkpoint)
            kept = codec.dump_messages(originals) if keep and originals is not None else None

            def write() -> None:
                connection.execute(
                    "DELETE FROM checkpoints WHERE end_hash = ? OR id = ?",
                    (checkpoint.end_hash, checkpoint.id),
                )
                connection.execute(
                    "INSERT INTO checkpoints (id, end_hash, session, created_at, json, owner) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        checkpoint.id,
                        checkpoint.end_hash,
                        checkpoint.session,
                        checkpoint.created_at,
                        raw,
                        owner,
                    ),
                )
                if kept is not None:
                    connection.execute(
                        "INSERT OR REPLACE INTO originals (checkpoint_id, created_at, json) "
                        "VALUES (?, ?, ?)",
                        (checkpoint.id, checkpoint.created_at, kept),
                    )

            self._write(connection, write)
            if self._ends is not None:
                self._ends.add(checkpoint.end_hash)

        await self._run(work)

    async def get(self, checkpoint_id: str, *, owner: str | None = None) -> Checkpoint | None:
        def work(connection: sqlite3.Connection) -> Checkpoint | None:
            row = connection.execute(
                "SELECT json FROM checkpoints WHERE id = ? AND (? IS NULL OR owner = ?)",
                (checkpoint_id, owner, owner),
            ).fetchone()
            return None if row is None else codec.load_checkpoint(row[0])

        return await self._run(work)

    async def originals(self, checkpoint_id: str) -> list[Message] | None:
        def work(connection: sqlite3.Connection) -> list[Message] | None:
            row = connection.execute(
                "SELECT json FROM originals WHERE checkpoint_id = ?", (checkpoint_id,)
            ).fetchone()
            return None if row is None else codec.load_messages(row[0])

        return await self._run(work)

    async def owner_of(self, checkpoint_id: str) -> str | None:
        def work(connection: sqlite3.Connection) -> str | None:
            row = connection.execute(
                "SELECT owner FROM checkpoints WHERE id = ?", (checkpoint_id,)
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._run(work)

    # -- events ------------------------------------------------------------

    async def add_event(self, event: Event) -> None:
        await self._run(partial(self._insert_event, event=event))

    @staticmethod
    def _insert_event(connection: sqlite3.Connection, event: Event) -> None:
        connection.execute(
            "INSERT OR REPLACE INTO events "
            "(id, compaction_id, session, type, created_at, instance, json, owner) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                event.id,
                event.compaction_id,
                event.session,
                event.type,
                event.created_at,
                event.instance,
                codec.dump_event(event),
                event.owner,
            ),
        )

    async def events(
        self,
        session: str | None = None,
        limit: int = DEFAULT_EVENTS_LIMIT,
        *,
        owner: str | None = None,
    ) -> list[Event]:
        # Newest recorded first, as the memory and Redis lists: clocks of
        # different processes need not agree, the order of arrival does.
        if limit <= 0:
            return []

        conditions = {"session = ?": session, "owner = ?": owner}
        wanted = [(sql, value) for sql, value in conditions.items() if value is not None]
        where = " AND ".join(sql for sql, _ in wanted) or "1"

        def work(connection: sqlite3.Connection) -> list[Event]:
            rows = connection.execute(
                f"SELECT json FROM events WHERE {where} ORDER BY rowid DESC LIMIT ?",
                (*(value for _, value in wanted), limit),
            )
            return [codec.load_event(raw) for (raw,) in rows]

        return await self._run(work)

    async def fail_interrupted(self, instance: str, message: str = INTERRUPTED) -> int:
        # Without heartbeats in a file, every other instance is taken for dead:
        # this runs at start-up, when nothing of ours can be in flight yet.
        def work(connection: sqlite3.Connection) -> int:
            def write() -> int:
                rows = connection.execute(
                    "SELECT json FROM events AS e WHERE e.type IN "
                    f"{_OPEN_TYPES_SQL} AND e.instance != ? AND NOT EXISTS "
                    "(SELECT 1 FROM events AS later WHERE later.compaction_id = e.compaction_id"
                    " AND later.rowid > e.rowid)",
                    (instance,),
                ).fetchall()
                for (raw,) in rows:
                    failed = interrupted(codec.load_event(raw), instance, message)
                    self._insert_event(connection, failed)
                return len(rows)

            return self._write(connection, write)

        return await self._run(work)

    async def heartbeat(self, instance: str, ttl: float) -> None:
        return None

    def lock(self, key: str, ttl: float) -> AbstractAsyncContextManager[None]:
        return self._locks.hold(key, ttl)

    # -- learned windows ---------------------------------------------------

    async def learned_windows(self) -> dict[str, int]:
        def work(connection: sqlite3.Connection) -> dict[str, int]:
            rows = connection.execute('SELECT model, "window" FROM learned_windows')
            return {model: window for model, window in rows}

        return await self._run(work)

    async def set_learned_window(self, model: str, window: int) -> None:
        def work(connection: sqlite3.Connection) -> None:
            def write() -> None:
                connection.execute(
                    'INSERT OR REPLACE INTO learned_windows (model, "window", updated_at) '
                    "VALUES (?, ?, ?)",
                    (model, window, time.time()),
                )
                self._cap(connection, "learned_windows")

            self._write(connection, write)

        await self._run(work)

    def _cap(self, connection: sqlite3.Connection, table: str) -> None:
        """Past ``max_model_rows`` rows in ``table``, drop the least recently set."""
        connection.execute(
            f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
            f"ORDER BY updated_at, rowid LIMIT max(0, (SELECT COUNT(*) FROM {table}) - ?))",
            (self._max_model_rows,),
        )

    # -- calibration ratios ------------------------------------------------

    async def calibrations(self) -> dict[str, float]:
        def work(connection: sqlite3.Connection) -> dict[str, float]:
            rows = connection.execute("SELECT key, ratio FROM calibrations")
            return {key: ratio for key, ratio in rows}

        return await self._run(work)

    async def set_calibration(self, key: str, ratio: float) -> None:
        value = checked_ratio(ratio)

        def work(connection: sqlite3.Connection) -> None:
            def write() -> None:
                connection.execute(
                    "INSERT OR REPLACE INTO calibrations (key, ratio, updated_at) VALUES (?, ?, ?)",
                    (key, value, time.time()),
                )
                self._cap(connection, "calibrations")

            self._write(connection, write)

        await self._run(work)

    # -- per-request figures and sessions ----------------------------------

    async def record_requests(self, records: Sequence[RequestRecord]) -> None:
        if not records:
            return

        def work(connection: sqlite3.Connection) -> None:
            def write() -> None:
                connection.executemany(
                    "INSERT INTO requests (session, owner, created_at, json) VALUES (?, ?, ?, ?)",
                    [(r.session, r.owner, r.created_at, codec.dump(r)) for r in records],
                )
                for (owner, session), found in by_session(records).items():
                    row = connection.execute(
                        "SELECT json FROM sessions WHERE owner = ? AND session = ?",
                        (owner, session),
                    ).fetchone()
                    old = None if row is None else codec.load(SessionSummary, row[0])
                    summary = fold(old, found)
                    connection.execute(
                        "INSERT OR REPLACE INTO sessions (owner, session, last_at, json) "
                        "VALUES (?, ?, ?, ?)",
                        (owner, session, summary.last_at, codec.dump(summary)),
                    )
                connection.executemany(
                    "INSERT INTO savings (owner, bucket, saved) VALUES (?, ?, ?) "
                    "ON CONFLICT (owner, bucket) DO UPDATE SET saved = saved + excluded.saved",
                    [(*key, saved) for key, saved in savings_of(records).items()],
                )

            self._write(connection, write)

        await self._run(work)

    async def requests(
        self, session: str, *, owner: str | None = None, limit: int = DEFAULT_REQUESTS_LIMIT
    ) -> list[RequestRecord]:
        def work(connection: sqlite3.Connection) -> list[RequestRecord]:
            rows = connection.execute(
                "SELECT json FROM requests WHERE session = ? AND (? IS NULL OR owner = ?) "
                "ORDER BY created_at DESC LIMIT ?",
                (session, owner, owner, max(limit, 0)),
            )
            return [codec.load(RequestRecord, raw) for (raw,) in rows]

        return await self._run(work)

    async def sessions(
        self, *, owner: str | None = None, limit: int = DEFAULT_SESSIONS_LIMIT
    ) -> list[SessionSummary]:
        where = "1" if owner is None else "owner = ?"
        values = () if owner is None else (owner,)

        def work(connection: sqlite3.Connection) -> list[SessionSummary]:
            rows = connection.execute(
                f"SELECT json FROM sessions WHERE {where} ORDER BY last_at DESC LIMIT ?",
                (*values, max(limit, 0)),
            )
            return [codec.load(SessionSummary, raw) for (raw,) in rows]

        return await self._run(work)

    async def session_count(self, *, owner: str | None = None) -> int:
        def work(connection: sqlite3.Connection) -> int:
            if owner is None:
                row = connection.execute("SELECT COUNT(*) FROM sessions").fetchone()
            else:
                row = connection.execute(
                    "SELECT COUNT(*) FROM sessions WHERE owner = ?", (owner,)
                ).fetchone()
            return int(row[0])

        return await self._run(work)

    async def savings(self, *, owner: str | None = None) -> list[tuple[float, int]]:
        def work(connection: sqlite3.Connection) -> list[tuple[float, int]]:
            rows = connection.execute(
                "SELECT bucket, SUM(saved) FROM savings WHERE (? IS NULL OR owner = ?) "
                "GROUP BY bucket ORDER BY bucket",
                (owner, owner),
            )
            return [(bucket, saved) for bucket, saved in rows]

        return await self._run(work)

    async def session_settings(self, session: str, owner: str) -> SessionSettings:
        def work(connection: sqlite3.Connection) -> SessionSettings:
            row = connection.execute(
                "SELECT json FROM session_settings WHERE owner = ? AND session = ?",
                (owner, session),
            ).fetchone()
            return SessionSettings() if row is None else codec.load(SessionSettings, row[0])

        return await self._run(work)

    async def set_session_settings(
        self, session: str, owner: str, settings: SessionSettings
    ) -> None:
        def work(connection: sqlite3.Connection) -> None:
            connection.execute(
                "INSERT OR REPLACE INTO session_settings (owner, session, json, updated_at) "
                "VALUES (?, ?, ?, ?)",
                (owner, session, codec.dump(settings), time.time()),
            )

        await self._run(work)

    async def owners_of_session(self, session: str) -> list[str]:
        def work(connection: sqlite3.Connection) -> list[str]:
            rows = connection.execute(
                "SELECT owner FROM sessions WHERE session = ? "
                "UNION SELECT owner FROM events WHERE session = ? ORDER BY owner",
                (session, session),
            )
            return [str(owner) for (owner,) in rows]

        return await self._run(work)

    # -- lifecycle ---------------------------------------------------------

    async def purge(self, now: float | None = None) -> int:
        moment = time.time() if now is None else now
        cutoff = moment - self._retention
        figures = moment - self._requests_retention

        def work(connection: sqlite3.Connection) -> int:
            def write() -> int:
                connection.execute("DELETE FROM requests WHERE created_at < ?", (figures,))
                connection.execute("DELETE FROM sessions WHERE last_at < ?", (figures,))
                connection.execute(
                    "DELETE FROM savings WHERE bucket + ? < ?", (SAVINGS_BUCKET_SECONDS, figures)
                )
                dropped = connection.execute(
                    "DELETE FROM originals WHERE created_at < ?", (cutoff,)
                ).rowcount
                connection.execute("DELETE FROM checkpoints WHERE created_at < ?", (cutoff,))
                connection.execute("DELETE FROM events WHERE created_at < ?", (cutoff,))
                for table in ("session_settings", "learned_windows", "calibrations"):
                    connection.execute(f"DELETE FROM {table} WHERE updated_at < ?", (cutoff,))
                return dropped

            self._ends = None  # re-read without the purged ones at the next lookup
            return self._write(connection, write)

        return await self._run(work)

    async def close(self) -> None:
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_connection)
        self._closed = True
        self._executor.shutdown(wait=True)  # the worker is idle: this only joins it

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class _Damaged(Exception):
    """The file opened as a database but fails its integrity check."""


#: SQLite's answers for a file that is not (or no longer) a database.
_DAMAGED_CODES: Final = frozenset({sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT})


def _damage(exc: BaseException) -> str | None:
    """What is wrong with the file, if ``exc`` says it is damaged (not locked,
    not full, not from a newer version)."""
    if isinstance(exc, _Damaged):
        return str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and exc.sqlite_errorcode in _DAMAGED_CODES:
        return exc.sqlite_errorname
    return None


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


#: The modes of what holds conversations: its owner's alone.
PRIVATE_FILE: Final = 0o600
PRIVATE_DIRECTORY: Final = 0o700


def _private_directory(directory: Path) -> None:
    """Make ``directory`` (``0700``) if it is missing; tighten it if it is the
    proxy's own default one, else warn when others may read it."""
    if not directory.exists():
        directory.mkdir(mode=PRIVATE_DIRECTORY, parents=True, exist_ok=True)
        os.chmod(directory, PRIVATE_DIRECTORY)  # mkdir's mode is cut by the umask
        return
    mode = directory.stat().st_mode & 0o777
    if not mode & 0o077:
        return
    if directory == default_sqlite_path().parent:
        os.chmod(directory, PRIVATE_DIRECTORY)
        return
    logger.warning(
        "the state directory %s is open to other users (mode %o); the database in it "
        "is kept owner-only, but other files there are not the proxy's to guard",
        directory,
        mode,
    )


def _private_file(path: Path) -> None:
    """Create ``path`` owner-only before SQLite does (it would take the umask's
    mode), and make an existing one, with its ``-wal`` and ``-shm``, owner-only."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE)
    except PermissionError:
        return  # another user's file: SQLite says what can be done with it
    try:
        # The umask may have cut the new file's mode, and an old file be wider.
        for name in (path, f"{path}-wal", f"{path}-shm"):
            with contextlib.suppress(FileNotFoundError):
                if name == path:
                    os.fchmod(descriptor, PRIVATE_FILE)
                else:
                    os.chmod(name, PRIVATE_FILE)
    except PermissionError:
        logger.warning("could not make the state database %s owner-only", path)
    finally:
        os.close(descriptor)


def _move_aside(path: Path) -> Path:
    """Rename ``path`` (and its ``-wal``, ``-shm``) to ``<name>.corrupt-<UTC time>``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    number = 1
    while aside.exists():
        number += 1
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{number}")
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{path}{suffix}", f"{aside}{suffix}")
    return aside


def _enter_wal(connection: sqlite3.Connection) -> None:
    """Switch to WAL mode, waiting out other processes opening the same new file.

    Changing the journal mode can fail at once with "database is locked"
    without going through the busy handler (seen with two processes opening
    one fresh file), so it is retried here for as long as busy_timeout says.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
