"""Opening the SQLite file: where it lives, who may read it, and what to do when it is damaged.

:func:`open_database` is the one way in. It returns a connection in
autocommit mode (``isolation_level=None``), in WAL mode, with the busy
timeout set and the schema migrated (:mod:`.schema`); it blocks, so it is
called from the store's worker thread, never from the event loop.

WAL mode lets several processes share the file: readers never wait for the
writer, and writers wait up to :data:`BUSY_TIMEOUT_SECONDS`.

A damaged file — not a database, truncated, corrupt — is moved aside
(``state.db.corrupt-<time>``, with its ``-wal`` and ``-shm``) and a fresh one
started, so the proxy still starts: its state is a cache of work, never a
reason not to serve. A file that is only locked, full, or from a newer
version is not damaged: its error is raised as it is.

The file holds conversations, so it is its owner's alone whatever the umask:
the database is made (or made again) ``0600`` before SQLite opens it, and
SQLite gives its ``-wal`` and ``-shm`` the database's own mode. A directory
the proxy creates is ``0700``; its own default directory found wider is
tightened, and a directory the user chose found readable by others is left
as it is with a warning (it may be shared on purpose; the file is not).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Final

from proxy.state.stores.sqlite.schema import migrate

# The package's logger: what the file's opening finds is the store's to say.
logger = logging.getLogger(__package__)

BUSY_TIMEOUT_SECONDS: Final = 10.0

#: The modes of what holds conversations: its owner's alone.
PRIVATE_FILE: Final = 0o600
PRIVATE_DIRECTORY: Final = 0o700


def default_sqlite_path() -> Path:
    """``$XDG_STATE_HOME/compaction-proxy/state.db``, else ``~/.local/state/…``."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "compaction-proxy" / "state.db"


def open_database(path: Path) -> sqlite3.Connection:
    """A connection to the database at ``path``, made owner-only, checked and
    migrated; a damaged file there is moved aside and a fresh one started."""
    _private_directory(path.parent)
    found = _inode(path)
    try:
        return _connect(path)
    except (sqlite3.DatabaseError, _Damaged) as exc:
        damage = _damage(exc)
        if damage is None:
            raise
    # Another proxy on the file may have moved it aside already: only the
    # file found damaged is moved, never the fresh one that replaced it.
    if _inode(path) == found:
        aside = _move_aside(path)
        logger.warning(
            "the state database %s is damaged (%s); moved it aside to %s and started "
            "a fresh one (its checkpoints, originals and events are not used)",
            path,
            damage,
            aside,
        )
    return _connect(path)


def _connect(path: Path) -> sqlite3.Connection:
    _private_file(path)
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
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


def open_watch(path: Path) -> sqlite3.Connection:
    """A read-only connection to the database :func:`open_database` opened, for
    ``PRAGMA data_version`` alone: no busy timeout (a read that would wait
    fails instead), usable from the thread that reads it, not this one."""
    connection = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA query_only = ON")
    return connection


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
