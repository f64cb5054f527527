"""What only the SQLite backend promises: a file, WAL, migrations, sharing, a free loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from compaction import Checkpoint
from proxy.state.stores import (
    Event,
    SessionSettings,
    SQLiteStore,
    StoreError,
    codec,
    default_sqlite_path,
    open_store,
)
from proxy.state.stores.sqlite import MIGRATIONS, SCHEMA_VERSION, migrate, schema_version
from tests.proxy.state.stores.test_contract import ORIGINALS, checkpoint, event
from tests.proxy.state.stores.test_figures_contract import record

pytestmark = pytest.mark.anyio


def _pragma(path: Path, name: str) -> object:
    with sqlite3.connect(path) as connection:
        return connection.execute(f"PRAGMA {name}").fetchone()[0]


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {name for (name,) in rows}


def _insert_checkpoint(connection: sqlite3.Connection, made: Checkpoint) -> None:
    """``made`` as versions 1 and 2 wrote it (before owners)."""
    connection.execute(
        "INSERT INTO checkpoints (id, end_hash, session, created_at, json) VALUES (?, ?, ?, ?, ?)",
        (made.id, made.end_hash, made.session, made.created_at, codec.dump_checkpoint(made)),
    )


def _insert_event(connection: sqlite3.Connection, made: Event, raw: bytes) -> None:
    """``made`` as versions 1 and 2 wrote it (before owners), its JSON ``raw``."""
    connection.execute(
        "INSERT INTO events (id, compaction_id, session, type, created_at, instance, json) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (made.id, made.compaction_id, made.session, made.type, made.created_at, made.instance, raw),
    )


async def test_file_and_parent_directories_are_created_on_first_use(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "state.db"
    store = SQLiteStore(path)
    assert not path.parent.exists()  # opening the store touches nothing
    await store.put(checkpoint())
    assert path.is_file()
    assert _pragma(path, "journal_mode") == "wal"
    assert _pragma(path, "user_version") == SCHEMA_VERSION
    expected = {"checkpoints", "originals", "events", "learned_windows", "calibrations"}
    assert expected <= _tables(path)
    await store.close()


async def test_connection_uses_normal_sync_and_a_busy_timeout(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")

    def settings(connection: sqlite3.Connection) -> tuple[int, int]:
        sync = connection.execute("PRAGMA synchronous").fetchone()[0]
        busy = connection.execute("PRAGMA busy_timeout").fetchone()[0]
        return sync, busy

    sync, busy = await store._worker.run(settings)
    assert sync == 1  # NORMAL
    assert busy >= 1000
    await store.close()


async def test_an_empty_existing_database_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE unrelated (x)")
    assert _pragma(path, "user_version") == 0
    store = SQLiteStore(path)
    made = checkpoint()
    await store.put(made, ORIGINALS)
    assert await store.get(made.id) == made
    assert _pragma(path, "user_version") == SCHEMA_VERSION
    assert "unrelated" in _tables(path)
    await store.close()


async def test_a_database_of_the_previous_version_opens_and_keeps_its_data(
    tmp_path: Path,
) -> None:
    # Version 1 (before calibration ratios), written as that version wrote it.
    path = tmp_path / "state.db"
    made = checkpoint()
    started = event("c1", "compaction.started", instance="dead")
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        assert migrate(connection, MIGRATIONS[:1]) == 1
        _insert_checkpoint(connection, made)
        connection.execute(
            "INSERT INTO originals (checkpoint_id, created_at, json) VALUES (?, ?, ?)",
            (made.id, made.created_at, codec.dump_messages(ORIGINALS)),
        )
        _insert_event(connection, started, codec.dump_event(started))
        connection.execute(
            'INSERT INTO learned_windows (model, "window") VALUES (?, ?)', ("m", 8192)
        )
    finally:
        connection.close()
    assert "calibrations" not in _tables(path)

    store = SQLiteStore(path)
    assert await store.lookup(["h1"]) == {"h1": made}
    assert _pragma(path, "user_version") == SCHEMA_VERSION
    assert await store.originals(made.id) == ORIGINALS
    assert await store.events() == [started]
    assert await store.learned_windows() == {"m": 8192}
    assert await store.calibrations() == {}
    await store.set_calibration("upstream\x1fm", 1.1)
    await store.close()

    reopened = SQLiteStore(path)
    assert await reopened.calibrations() == {"upstream\x1fm": 1.1}
    assert await reopened.learned_windows() == {"m": 8192}
    await reopened.close()


async def test_a_database_from_before_owners_shows_its_rows_to_the_admin_only(
    tmp_path: Path,
) -> None:
    # Version 2 (before records had owners), written as that version wrote it.
    path = tmp_path / "state.db"
    made = checkpoint()
    done = event("c1", "context.compacted", checkpoint_id=made.id)
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        assert migrate(connection, MIGRATIONS[:2]) == 2
        _insert_checkpoint(connection, made)
        legacy = {k: v for k, v in codec.to_dict(done).items() if k != "owner"}
        _insert_event(connection, done, orjson.dumps(legacy))
    finally:
        connection.close()

    store = SQLiteStore(path)
    assert await store.lookup(["h1"]) == {"h1": made}  # its conversation still reuses it
    assert _pragma(path, "user_version") == SCHEMA_VERSION
    assert await store.get(made.id) == made
    assert await store.get(made.id, owner="alice") is None
    assert await store.events() == [done]
    assert await store.events(owner="alice") == []
    newer = checkpoint("h2")
    await store.put(newer, owner="alice")
    await store.add_event(event("c2", owner="alice"))
    assert await store.get(newer.id, owner="alice") == newer
    assert [item.compaction_id for item in await store.events(owner="alice")] == ["c2"]
    await store.close()


async def test_one_owners_events_are_read_through_its_index(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    await store.add_event(event("c", owner="alice"))
    statements: list[str] = []
    await store._worker.run(lambda connection: connection.set_trace_callback(statements.append))
    await store.events(owner="alice", limit=3)
    (query,) = [sql for sql in statements if sql.startswith("SELECT")]

    def plan(connection: sqlite3.Connection) -> str:
        connection.set_trace_callback(None)
        return " ".join(row[-1] for row in connection.execute(f"EXPLAIN QUERY PLAN {query}"))

    # Not a scan of everyone's events, nor a sort of all of one owner's.
    found = await store._worker.run(plan)
    assert "events_owner" in found and "TEMP B-TREE" not in found, found
    await store.close()


def test_migrations_apply_in_order_from_an_older_version(tmp_path: Path) -> None:
    extra = ("CREATE TABLE notes (id TEXT PRIMARY KEY)", "CREATE INDEX notes_id ON notes (id)")
    connection = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    try:
        assert migrate(connection) == SCHEMA_VERSION  # a file written by today's version
        assert migrate(connection, (*MIGRATIONS, extra)) == SCHEMA_VERSION + 1
        assert schema_version(connection) == SCHEMA_VERSION + 1
        connection.execute("INSERT INTO notes VALUES ('n')")
        assert migrate(connection, (*MIGRATIONS, extra)) == SCHEMA_VERSION + 1  # no-op
    finally:
        connection.close()


def test_a_failing_migration_leaves_the_previous_version_intact(tmp_path: Path) -> None:
    broken = ("CREATE TABLE half (x)", "THIS IS NOT SQL")
    connection = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    try:
        migrate(connection)
        with pytest.raises(sqlite3.OperationalError):
            migrate(connection, (*MIGRATIONS, broken))
        assert schema_version(connection) == SCHEMA_VERSION
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        assert "half" not in tables
        assert not connection.in_transaction
    finally:
        connection.close()


async def test_a_database_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    store = SQLiteStore(path)
    with pytest.raises(StoreError, match="newer"):
        await store.lookup(["h"])
    await store.close()
    # Not damage: the file is left where it is for the newer proxy.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]


async def test_two_stores_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first, second = SQLiteStore(path), SQLiteStore(path)
    made = checkpoint()
    for store in (first, second):  # each now knows the file's end hashes
        assert await store.lookup(["h1"]) == {}
    await first.put(made, ORIGINALS)
    assert await second.lookup(["h1"]) == {"h1": made}  # … and sees that they changed
    assert await first.lookup(["h0", "h1"]) == {"h1": made}  # its own write, too
    assert await second.originals(made.id) == ORIGINALS
    await second.add_event(event("c1", "compaction.started", instance="second"))
    await second.set_learned_window("m", 4096)
    assert [item.compaction_id for item in await first.events()] == ["c1"]
    assert await first.learned_windows() == {"m": 4096}
    # A restarted first process closes what the (dead) second one left open.
    assert await first.fail_interrupted("first") == 1
    assert (await second.events())[0].type == "compaction.failed"
    await first.close()
    await second.close()


async def test_concurrent_writers_on_one_file_do_not_fail(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    stores = [SQLiteStore(path) for _ in range(3)]
    await asyncio.gather(
        *(
            store.put(checkpoint(f"h{index}-{number}"), ORIGINALS)
            for index, store in enumerate(stores)
            for number in range(20)
        )
    )
    found = await stores[0].lookup([f"h{i}-{n}" for i in range(3) for n in range(20)])
    assert len(found) == 60
    for store in stores:
        await store.close()


async def test_store_io_runs_off_the_event_loop(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    threads: set[str] = set()

    def which_thread(connection: sqlite3.Connection) -> None:
        threads.add(threading.current_thread().name)
        time.sleep(0.2)  # a slow disk: the loop must keep running meanwhile

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticking = asyncio.create_task(ticker())
    await store._worker.run(which_thread)
    big = [{"role": "tool", "content": "x" * 1_000_000} for _ in range(8)]
    await store.put(checkpoint(), big)
    ticking.cancel()
    assert ticks >= 5
    assert threads and threading.current_thread().name not in threads
    assert await store.originals((await store.lookup(["h1"]))["h1"].id) == big
    await store.close()


async def test_a_closed_store_refuses_work(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.lookup(["h"])


async def test_purge_also_drops_old_checkpoints_and_events(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path / 'state.db'}", retention_seconds=10)
    now = time.time()
    await store.put(checkpoint("old", created_at=now - 100), ORIGINALS)
    await store.add_event(event("c", created_at=now - 100))
    await store.add_event(event("d", created_at=now))
    assert await store.purge(now=now) == 1
    assert await store.lookup(["old"]) == {}
    assert [item.compaction_id for item in await store.events()] == ["d"]
    await store.close()


# -- a damaged file: set aside, so that the proxy still starts ---------------------


async def _truncated_database(path: Path) -> bytes:
    """A real state file cut in half, as a full disk or a crash during a copy leaves it."""
    store = SQLiteStore(path)
    for index in range(300):
        await store.add_event(event(f"c{index}", session="s" * 500))
    await store.close()
    whole = path.read_bytes()
    return whole[: len(whole) // 2]


@pytest.mark.parametrize("damage", ["text", "random bytes", "truncated"])
async def test_a_damaged_file_is_moved_aside_and_a_fresh_one_started(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    if damage == "text":
        content = b"these are my notes, not a database\n" * 20
    elif damage == "random bytes":
        content = random.Random(7).randbytes(10_000)
    else:
        content = await _truncated_database(tmp_path / "whole.db")
    path.write_bytes(content)

    store = SQLiteStore(path)
    made = checkpoint()
    try:
        assert await store.fail_interrupted("me") == 0
        await store.put(made, ORIGINALS)
        assert await store.lookup(["h1"]) == {"h1": made}
    finally:
        await store.close()

    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("state.db.corrupt-")]
    assert aside.read_bytes() == content  # kept for whoever wants to look
    assert _pragma(path, "user_version") == SCHEMA_VERSION
    [record] = [r for r in caplog.records if "damaged" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert str(path) in record.getMessage() and str(aside) in record.getMessage()


async def test_rows_of_a_database_from_before_they_were_stamped_are_kept_past_a_purge(
    tmp_path: Path,
) -> None:
    # Version 4 knew no time of setting: what it wrote counts as set at the upgrade.
    path = tmp_path / "state.db"
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        assert migrate(connection, MIGRATIONS[:4]) == 4
        connection.execute(
            'INSERT INTO learned_windows (model, "window") VALUES (?, ?)', ("m", 8192)
        )
        connection.execute("INSERT INTO calibrations (key, ratio) VALUES (?, ?)", ("k", 1.1))
        connection.execute(
            "INSERT INTO session_settings (owner, session, json) VALUES (?, ?, ?)",
            ("ann", "s1", codec.dump(SessionSettings(enabled=False))),
        )
    finally:
        connection.close()
    store = SQLiteStore(path, retention_seconds=86400.0)
    await store.purge()
    assert await store.learned_windows() == {"m": 8192}
    assert await store.calibrations() == {"k": 1.1}
    assert (await store.session_settings("s1", "ann")).enabled is False
    await store.purge(now=time.time() + 2 * 86400.0)
    assert await store.learned_windows() == {}
    assert await store.calibrations() == {}
    assert await store.session_settings("s1", "ann") == SessionSettings()
    await store.close()


def _mode(path: Path | str) -> int:
    return os.stat(path).st_mode & 0o777


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize("mask", [0o022, 0o000], ids=["umask-022", "umask-000"])
async def test_the_database_and_its_wal_and_shm_are_its_owners_alone(
    tmp_path: Path, mask: int
) -> None:
    path = tmp_path / "made" / "here" / "state.db"
    with _umask(mask):
        store = SQLiteStore(path)
        await store.put(checkpoint(), ORIGINALS)  # written: the -wal and -shm exist
        for name in (path, f"{path}-wal", f"{path}-shm"):
            assert _mode(name) == 0o600, name
        assert _mode(path.parent) == 0o700  # made by the proxy
        await store.close()


async def test_a_database_left_readable_by_others_is_made_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first = SQLiteStore(path)
    await first.put(checkpoint(), ORIGINALS)
    await first.close()
    for name in (path, f"{path}-wal", f"{path}-shm"):
        if os.path.exists(name):
            os.chmod(name, 0o644)  # as an earlier version left it
    second = SQLiteStore(path)
    assert len(await second.events()) == 0  # opened again
    for name in (path, f"{path}-wal", f"{path}-shm"):
        if os.path.exists(name):
            assert _mode(name) == 0o600, name
    await second.close()


async def test_the_default_directory_found_open_to_others_is_tightened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = default_sqlite_path()
    path.parent.mkdir(mode=0o755)
    os.chmod(path.parent, 0o755)
    store = SQLiteStore(path)
    await store.put(checkpoint())
    assert _mode(path.parent) == 0o700
    assert _mode(path) == 0o600
    await store.close()


async def test_a_directory_the_user_chose_is_left_as_it_is_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    store = SQLiteStore(shared / "state.db")
    with caplog.at_level(logging.WARNING, logger="proxy.state.stores.sqlite"):
        await store.put(checkpoint())
    assert _mode(shared) == 0o755
    assert _mode(shared / "state.db") == 0o600
    assert any("open to other users" in record.getMessage() for record in caplog.records)
    await store.close()


async def test_a_chain_with_no_checkpoint_is_answered_without_the_thread_until_a_commit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    store = SQLiteStore(path)
    chain = [f"h{i}" for i in range(1000)]
    try:
        assert store.lookup_now(chain) is None  # nothing read yet: ask
        assert await store.lookup(chain) == {}  # opens the file
        assert store.lookup_now(chain) is None
        assert await store.lookup(chain) == {}
        assert store.lookup_now(chain) == {}  # nothing committed since
        assert store.lookup_now([*chain, "h1000"]) == {}  # the next turn's chain

        # This process's own figures: what the loop knows is brought up to
        # date as they are written, not by the next lookup's trip to the thread.
        await store.record_requests([record()])
        assert store.lookup_now(chain) == {}
        assert store.holds_checkpoints_now("", "s1") is False

        # Another process (here: a connection of its own, as an older proxy
        # would write it) stores a checkpoint on the chain: never answered "none".
        made = checkpoint("h500")
        with sqlite3.connect(path) as other:
            _insert_checkpoint(other, made)
        assert store.lookup_now(chain) is None
        assert await store.lookup(chain) == {"h500": made}
        assert store.lookup_now(chain) is None  # a hit needs its row: the thread reads it
        assert store.lookup_now(chain[:500]) == {}

        # Another process commits, then this one writes its figures: its own
        # commit does not vouch for the other's, which the loop has not read.
        theirs = checkpoint("h100")
        with sqlite3.connect(path) as other:
            _insert_checkpoint(other, theirs)
        await store.record_requests([record()])
        assert store.lookup_now(chain[:500]) is None
        assert await store.lookup(chain[:500]) == {"h100": theirs}
    finally:
        await store.close()
    assert store.lookup_now(chain[:500]) is None  # closed: nothing is known


async def test_a_lookup_made_while_a_checkpoint_is_being_written_waits_for_it(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    chain = ["x", "y"]
    gate = threading.Event()
    try:
        await store.lookup(chain)
        await store.lookup(chain)
        assert store.lookup_now(chain) == {}
        # The worker is busy: the put waits in its queue, nothing committed yet.
        busy = asyncio.ensure_future(store._worker.run(lambda connection: gate.wait(10)))
        mine = checkpoint("y")
        writing = asyncio.create_task(store.put(mine))
        await asyncio.sleep(0)
        assert store.lookup_now(chain) is None  # not "none": the put was asked for first
        asking = asyncio.create_task(store.lookup(chain))
        gate.set()
        await busy
        await writing
        assert await asking == {"y": mine}  # the thread's queue keeps the order
    finally:
        gate.set()
        await store.close()


async def test_a_settle_that_cannot_read_its_version_claims_nothing_and_fails_nothing(
    tmp_path: Path,
) -> None:
    """The worker settles after work that is done: reading its own connection's
    version failing must neither fail that work nor vouch for anything."""
    store = SQLiteStore(tmp_path / "state.db")
    try:
        await store.lookup(["x"])  # the ends read, the file open
        before = store._checked_at
        broken = sqlite3.connect(tmp_path / "other.db")
        broken.close()  # any statement on it raises sqlite3.ProgrammingError
        store._settle(broken, 12345)
        assert store._checked_at == before
    finally:
        await store.close()
