"""The thread the SQLite store's I/O runs on, and its write transactions.

:class:`Worker` holds one connection, opened (:func:`~.file.open_database`)
on first use and touched only from one dedicated thread, so store I/O never
blocks the event loop: the loop awaits ``run_in_executor``. Each piece of
work is a function of the connection, run to its end before the next one
starts, so work needs no lock of its own against the rest of this process.

:func:`transaction` runs a write under ``BEGIN IMMEDIATE``: it takes the
file's write lock before reading anything, so what a write reads cannot be
changed by another process before it commits; an error rolls it all back.
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
from proxy.state.stores.sqlite.file import open_database

_T = TypeVar("_T")


class Worker:
    """One connection to the file at ``path``, used from one thread only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compaction-store")
        self._connection: sqlite3.Connection | None = None  #: touched by the thread only
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
        return work(self._connection)

    async def close(self) -> None:
        """Close the connection and join the thread; a second call does nothing."""
        if self._closed:
            return
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
