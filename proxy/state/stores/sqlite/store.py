"""The default store: one SQLite file under the user's state directory.

:class:`SQLiteStore` is the :class:`~proxy.state.stores.protocols.Store`
contract as SQL: every operation is one function of the connection, run on
the store's worker thread (:mod:`.worker`), and every write is one
transaction. How the file is opened, kept owner-only and replaced when it is
damaged is :mod:`.file`; its tables and their migrations are :mod:`.schema`;
the per-request figures and sessions are :mod:`.figures`' part of the store.

Two proxies may share the file (WAL mode), so nothing here assumes this
process is the only writer: the cache of checkpoint end hashes is re-read
when another connection has committed (and trusted without the worker's
thread only while none has: :meth:`SQLiteStore.lookup_now`), and open
compactions of another instance are closed only at start-up
(:meth:`SQLiteStore.fail_interrupted`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import Final

from compaction import Checkpoint, Message
from proxy.state.stores import codec
from proxy.state.stores.base import (
    DEFAULT_EVENTS_LIMIT,
    DEFAULT_MAX_MODEL_ROWS,
    DEFAULT_RETENTION_SECONDS,
    INTERRUPTED,
    Event,
    checked_ratio,
    interrupted,
)
from proxy.state.stores.figures import (
    DEFAULT_REQUESTS_RETENTION_SECONDS,
    SAVINGS_BUCKET_SECONDS,
)
from proxy.state.stores.locks import LeaseLocks
from proxy.state.stores.sqlite.figures import SQLiteFigures
from proxy.state.stores.sqlite.worker import Worker, transaction

_OPEN_TYPES_SQL: Final = "('compaction.queued', 'compaction.started')"


class SQLiteStore(SQLiteFigures):
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
        self._worker = Worker(self.path, settle=self._settle)
        #: Every checkpoint end hash in the file (a superset: rows deleted
        #: since are dropped at the next reload), and the ``data_version`` it
        #: was read at; touched by the worker only. See :meth:`_known_ends`.
        self._ends: set[str] | None = None
        #: (owner, session) of every checkpoint in the file, read with
        #: :attr:`_ends` (see :meth:`holds_checkpoints_now`).
        self._held: set[tuple[str, str]] | None = None
        self._ends_version = -1
        #: A watching connection's ``data_version`` as of which :attr:`_ends`
        #: is known current (set by the loop before the worker re-checks it,
        #: and by the worker after its own commits: :meth:`_settle`), and this
        #: process's writes of checkpoints not yet committed. See :meth:`lookup_now`.
        self._checked_at: int | None = None
        self._putting = 0
        self._locks = LeaseLocks()

    # -- checkpoints -------------------------------------------------------

    def lookup_now(self, hashes: Sequence[str]) -> dict[str, Checkpoint] | None:
        """Answers "none of these" without the worker's thread, when that is sure.

        A growing conversation's lookup almost always finds nothing, and
        waiting for the thread to say so was most of its cost (~0.2 ms of a
        request at 100k tokens, the proxy on one core). The answer is sure
        when no connection has committed since the worker last brought
        :attr:`_ends` up to date (:meth:`Worker.version` unchanged: not
        another process; this one's own commits are settled by the worker,
        :meth:`_settle`), no checkpoint of this
        process is being written (:attr:`_putting`: a lookup made after a put
        was asked for must see it, as the thread's queue would), and no hash
        is among the ends. A hit still needs its row: the thread reads it.
        """
        ends, checked_at = self._ends, self._checked_at
        if not hashes:
            return {}
        if ends is None or checked_at is None or self._putting:
            return None
        if self._worker.version() != checked_at:
            return None
        # The worker replaces the set rather than changing it, but while a put
        # runs (``_putting``, refused above): this set is not being changed.
        return {} if ends.isdisjoint(hashes) else None

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        if not hashes:
            return {}
        # Read before the worker looks: a commit after this shows as a change.
        seen = self._worker.version()

        def work(connection: sqlite3.Connection) -> dict[str, Checkpoint]:
            found: dict[str, Checkpoint] = {}
            # A set's intersection with the chain, not a walk of it: a long
            # conversation's chain has a thousand hashes or more and at most a
            # few are checkpoints, and this runs on every request (the answer
            # is a mapping: the order the hits are found in is not part of it).
            hits = list(self._known_ends(connection).intersection(hashes))
            for start in range(0, len(hits), 500):  # below SQLite's variable limit
                chunk = hits[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                rows = connection.execute(
                    f"SELECT end_hash, json FROM checkpoints WHERE end_hash IN ({marks})", chunk
                )
                for end_hash, raw in rows:
                    found[end_hash] = codec.load_checkpoint(raw)
            return found

        found = await self._worker.run(work)
        self._checked_at = seen
        return found

    def holds_checkpoints_now(self, owner: str, session: str) -> bool | None:
        """Answered from :attr:`_held` under :meth:`lookup_now`'s rule: only when
        nothing was committed since the worker last brought it up to date."""
        held, checked_at = self._held, self._checked_at
        if held is None or checked_at is None or self._putting:
            return None
        if self._worker.version() != checked_at:
            return None
        return (owner, session) in held

    async def holds_checkpoints(self, owner: str, session: str) -> bool:
        await self._brought_up_to_date()
        return self._held is not None and (owner, session) in self._held

    async def _brought_up_to_date(self) -> None:
        """:attr:`_ends` and :attr:`_held` read again if anything was committed
        since, and known current as of now (:meth:`lookup_now`'s rule)."""
        seen = self._worker.version()  # before the worker looks: a commit after shows
        await self._worker.run(self._known_ends)
        self._checked_at = seen

    def _settle(self, connection: sqlite3.Connection, version: int) -> None:
        """After a piece of work, on the thread: :attr:`_ends` known current as
        of the watching connection's ``version`` (read just before this), when
        no other connection has committed since the worker last read it.

        Without this, each commit of this process's own — the recorder's
        figures, once a second — moved the watching connection's version, and
        the loop's next lookup waited for the thread to learn that nothing had
        changed: the first request after a pause, always. This connection's
        own ``data_version`` changes only for other connections' commits, and
        it is read after ``version``: unchanged since :attr:`_ends` was read,
        no commit that ``version`` saw is missing from it (this process's own
        checkpoints are added as they are written, its purges drop the set).
        A commit between the two reads changes it, and then nothing is claimed.
        """
        if self._ends is None:
            return
        try:
            own: int = connection.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:  # the work itself is done: its caller is told so, nothing claimed
            return
        if own == self._ends_version:
            self._checked_at = version

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
            rows = connection.execute("SELECT end_hash, owner, session FROM checkpoints").fetchall()
            # Both replaced, never changed in place: the loop reads them meanwhile.
            self._held = {(owner, session) for _, owner, session in rows}
            self._ends = {row[0] for row in rows}
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

            transaction(connection, write)
            if self._ends is not None:
                self._ends.add(checkpoint.end_hash)
            if self._held is not None:
                self._held.add((owner, checkpoint.session))

        self._putting += 1
        try:
            await self._worker.run(work)
        finally:
            self._putting -= 1

    async def get(self, checkpoint_id: str, *, owner: str | None = None) -> Checkpoint | None:
        def work(connection: sqlite3.Connection) -> Checkpoint | None:
            row = connection.execute(
                "SELECT json FROM checkpoints WHERE id = ? AND (? IS NULL OR owner = ?)",
                (checkpoint_id, owner, owner),
            ).fetchone()
            return None if row is None else codec.load_checkpoint(row[0])

        return await self._worker.run(work)

    async def originals(self, checkpoint_id: str) -> list[Message] | None:
        def work(connection: sqlite3.Connection) -> list[Message] | None:
            row = connection.execute(
                "SELECT json FROM originals WHERE checkpoint_id = ?", (checkpoint_id,)
            ).fetchone()
            return None if row is None else codec.load_messages(row[0])

        return await self._worker.run(work)

    async def owner_of(self, checkpoint_id: str) -> str | None:
        def work(connection: sqlite3.Connection) -> str | None:
            row = connection.execute(
                "SELECT owner FROM checkpoints WHERE id = ?", (checkpoint_id,)
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._worker.run(work)

    # -- events ------------------------------------------------------------

    async def add_event(self, event: Event) -> None:
        await self._worker.run(partial(self._insert_event, event=event))

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

        return await self._worker.run(work)

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

            return transaction(connection, write)

        return await self._worker.run(work)

    async def heartbeat(self, instance: str, ttl: float) -> None:
        return None

    def lock(self, key: str, ttl: float) -> AbstractAsyncContextManager[None]:
        return self._locks.hold(key, ttl)

    # -- learned windows ---------------------------------------------------

    async def learned_windows(self) -> dict[str, int]:
        def work(connection: sqlite3.Connection) -> dict[str, int]:
            rows = connection.execute('SELECT model, "window" FROM learned_windows')
            return {model: window for model, window in rows}

        return await self._worker.run(work)

    async def set_learned_window(self, model: str, window: int) -> None:
        def work(connection: sqlite3.Connection) -> None:
            def write() -> None:
                connection.execute(
                    'INSERT OR REPLACE INTO learned_windows (model, "window", updated_at) '
                    "VALUES (?, ?, ?)",
                    (model, window, time.time()),
                )
                self._cap(connection, "learned_windows")

            transaction(connection, write)

        await self._worker.run(work)

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

        return await self._worker.run(work)

    async def set_calibration(self, key: str, ratio: float) -> None:
        value = checked_ratio(ratio)

        def work(connection: sqlite3.Connection) -> None:
            def write() -> None:
                connection.execute(
                    "INSERT OR REPLACE INTO calibrations (key, ratio, updated_at) VALUES (?, ?, ?)",
                    (key, value, time.time()),
                )
                self._cap(connection, "calibrations")

            transaction(connection, write)

        await self._worker.run(work)

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

            self._ends = self._held = None  # re-read without the purged ones at the next lookup
            return transaction(connection, write)

        return await self._worker.run(work)

    async def close(self) -> None:
        await self._worker.close()
