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
<proxy.state.stores.sqlite.store.SQLiteStore.lookup_now>`). The thread reads
it too, after each piece of work, and hands it to ``settle``: that is how the
store learns that its own commits (the recorder's figures, once a second)
changed nothing it keeps in memory, so that the loop's next look need not
wait for the thread because of them.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
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

    def __init__(
        self, path: Path, settle: Callable[[sqlite3.Connection, int], None] | None = None
    ) -> None:
        self.path = path
        #: Called on the thread after each piece of work with the connection
        #: and the watching connection's version read after it (see the module doc).
        self._settle = settle
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compaction-store")
        self._connection: sqlite3.Connection | None = None  #: touched by the thread only
        #: Opened by the thread with the connection, read by the loop and,
        #: after each piece of work, by the thread: see :meth:`version`.
        self._watch: sqlite3.Connection | None = None
        #: The watching connection is read by the loop and by the thread, one at a time.
        self._watch_lock = threading.Lock()
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
        result = work(self._connection)
        if self._settle is not None:
            version = self.version(wait=True)
            if version is not None:
                self._settle(self._connection, version)
        return result

    def version(self, *, wait: bool = False) -> int | None:
        """The file's ``PRAGMA data_version`` as a connection of its own sees it,
        read on the caller's thread; ``None`` before the first piece of work or
        when SQLite cannot say at once.

        It changes whenever any connection commits — another process's, and
        this worker's own, which is "another connection" to the watching one —
        and only then. Reading it is a look at the WAL's shared memory, with
        no busy timeout: a read that would wait fails, and ``None`` sends the
        caller to the thread. The watching connection never writes and holds
        no transaction open between reads. The loop never waits for the
        thread's read of it (``wait`` is the thread's): it is told ``None``.
        """
        if not self._watch_lock.acquire(blocking=wait):
            return None
        try:
            watch = self._watch
            if watch is None or self._closed:
                return None
            try:
                rows = watch.execute("PRAGMA data_version").fetchall()  # to the end: no open read
            except sqlite3.Error:
                return None
            version: int = rows[0][0]
            return version
        finally:
            self._watch_lock.release()

    async def close(self) -> None:
        """Close the connection and join the thread; a second call does nothing."""
        if self._closed:
            return
        with self._watch_lock:  # the thread may be reading it after a piece of work
            if self._watch is not None:
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
