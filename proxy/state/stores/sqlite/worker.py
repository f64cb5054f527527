"""The thread the SQLite store's I/O runs on, and its write transactions.

:class:`Worker` holds one connection, opened (:func:`~.file.open_database`)
on first use and touched only from one dedicated thread, so store I/O never
blocks the event loop: the loop awaits ``run_in_executor``. Each piece of
work is a function of the connection, run to its end before the next one
starts, so work needs no lock of its own against the rest of this process.

:func:`transaction` runs a write under ``BEGIN IMMEDIATE``: it takes the
file's write lock before reading anything, so what a write reads cannot be
changed by another process before it commits; an error rolls it all back.

One read is made on the caller's thread instead: :meth:`Worker.version`, the
file's ``PRAGMA data_version`` through a second connection of its own, which
tells the loop whether anything was committed since it last asked without
waiting for the thread (see :meth:`SQLiteStore.lookup_now
<proxy.state.stores.sqlite.store.SQLiteStore.lookup_now>`).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

from proxy.state.stores.base import StoreError
from proxy.state.stores.sqlite.file import open_database, open_watch

_T = TypeVar("_T")


class Worker:
    """One connection to the file at ``path``, used from one thread only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compaction-store")
        self._connection: sqlite3.Connection | None = None  #: touched by the thread only
        #: Opened by the thread with the connection, read by the loop only:
        #: see :meth:`version`.
        self._watch: sqlite3.Connection | None = None
        self._closed = False

    async def run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """``work(connection)`` on the thread; :class:`StoreError` once closed."""
        if self._closed:
            raise StoreError(f"the store at {self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(self._call, work))

    def _call(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._connection is None:
            self._connection = open_database(self.path)
            # Right after the connection, so that both are on the same file
            # (a damaged one may be moved aside and replaced by another process).
            try:
                self._watch = open_watch(self.path)
            except sqlite3.Error:  # then every lookup asks the thread, as before
                self._watch = None
        return work(self._connection)

    def version(self) -> int | None:
        """The file's ``PRAGMA data_version`` as a connection of its own sees it,
        read on the caller's thread; ``None`` before the first piece of work or
        when SQLite cannot say at once.

        It changes whenever any connection commits — another process's, and
        this worker's own, which is "another connection" to the watching one —
        and only then. Reading it is a look at the WAL's shared memory, with
        no busy timeout: a read that would wait fails, and ``None`` sends the
        caller to the thread. The watching connection never writes and holds
        no transaction open between reads.
        """
        watch = self._watch
        if watch is None or self._closed:
            return None
        try:
            rows = watch.execute("PRAGMA data_version").fetchall()  # to the end: no open read
        except sqlite3.Error:
            return None
        version: int = rows[0][0]
        return version

    async def close(self) -> None:
        """Close the connection and join the thread; a second call does nothing."""
        if self._closed:
            return
        if self._watch is not None:  # on the loop, the only thread that reads it
            self._watch.close()
            self._watch = None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_connection)
        self._closed = True
        self._executor.shutdown(wait=True)  # the thread is idle: this only joins it

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def transaction(connection: sqlite3.Connection, work: Callable[[], _T]) -> _T:
    """``work()`` in one write transaction, committed if it returns, rolled back if it raises."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        result = work()
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
    return result
