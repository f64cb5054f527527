"""The SQLite store's per-request figures and sessions: each request's figures,
each session's summary folded in the same write transaction (so two proxies
on one file lose nothing), tokens saved by hour, per-session settings, and
whose a session is. :class:`SQLiteFigures` is a part of
:class:`~proxy.state.stores.sqlite.store.SQLiteStore`, as the Redis store's
figures are :class:`~proxy.state.stores.redis.figures.RedisFigures`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

from proxy.state.stores import codec
from proxy.state.stores.figures import (
    DEFAULT_REQUESTS_LIMIT,
    DEFAULT_SESSIONS_LIMIT,
    RequestRecord,
    SessionSettings,
    SessionSummary,
    by_session,
    fold,
    savings_of,
)
from proxy.state.stores.sqlite.worker import Worker, transaction


class SQLiteFigures:
    """Request figures, session summaries and settings, on the store's worker."""

    # Set by SQLiteStore's constructor.
    _worker: Worker

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

            transaction(connection, write)

        # A commit of this process's own, once a second: the worker settles
        # what the loop knows of the checkpoints as it ends (_settle), so the
        # next request does not wait for the thread because of it.
        await self._worker.run(work)

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

        return await self._worker.run(work)

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

        return await self._worker.run(work)

    async def session_count(self, *, owner: str | None = None) -> int:
        def work(connection: sqlite3.Connection) -> int:
            if owner is None:
                row = connection.execute("SELECT COUNT(*) FROM sessions").fetchone()
            else:
                row = connection.execute(
                    "SELECT COUNT(*) FROM sessions WHERE owner = ?", (owner,)
                ).fetchone()
            return int(row[0])

        return await self._worker.run(work)

    async def savings(self, *, owner: str | None = None) -> list[tuple[float, int]]:
        def work(connection: sqlite3.Connection) -> list[tuple[float, int]]:
            rows = connection.execute(
                "SELECT bucket, SUM(saved) FROM savings WHERE (? IS NULL OR owner = ?) "
                "GROUP BY bucket ORDER BY bucket",
                (owner, owner),
            )
            return [(bucket, saved) for bucket, saved in rows]

        return await self._worker.run(work)

    async def session_settings(self, session: str, owner: str) -> SessionSettings:
        def work(connection: sqlite3.Connection) -> SessionSettings:
            row = connection.execute(
                "SELECT json FROM session_settings WHERE owner = ? AND session = ?",
                (owner, session),
            ).fetchone()
            return SessionSettings() if row is None else codec.load(SessionSettings, row[0])

        return await self._worker.run(work)

    async def set_session_settings(
        self, session: str, owner: str, settings: SessionSettings
    ) -> None:
        def work(connection: sqlite3.Connection) -> None:
            connection.execute(
                "INSERT OR REPLACE INTO session_settings (owner, session, json, updated_at) "
                "VALUES (?, ?, ?, ?)",
                (owner, session, codec.dump(settings), time.time()),
            )

        await self._worker.run(work)

    async def owners_of_session(self, session: str) -> list[str]:
        def work(connection: sqlite3.Connection) -> list[str]:
            rows = connection.execute(
                "SELECT owner FROM sessions WHERE session = ? "
                "UNION SELECT owner FROM events WHERE session = ? ORDER BY owner",
                (session, session),
            )
            return [str(owner) for (owner,) in rows]

        return await self._worker.run(work)
