"""The store fails, the requests do not: stored state saves work, it never costs an answer.

A full disk, a Redis killed or hung mid-session, a state file that is not a
database: in each the proxy still starts and serves — a compacting request is
compacted afresh and nothing is stored — counts the failures, and says
``degraded`` on /healthz until the store answers again. Real SQLite files and
real redis-server processes; the time-box is checked by counting timeouts,
never by the clock.
"""

from __future__ import annotations

import resource
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from config import load_settings
from proxy.app import create_app
from proxy.state.stores import SQLiteStore, Store
from tests.proxy.servers import FakeUpstream, ProxyProcess, serve_in_thread
from tests.proxy.state.stores.conftest import free_port, start_redis
from tests.proxy.state.stores.outage import (
    LONG,
    MODELS,
    SHORT,
    answered,
    chat,
    healthz,
    process_env,
)
from tests.proxy.state.stores.test_resilient import FaultyStore
from tests.synthetic import agent_session


def _root(url: str) -> str:
    return url.removesuffix("/v1")


def _store_errors(url: str) -> dict[tuple[str, str], float]:
    """``compaction_proxy_store_errors_total`` by (operation, kind)."""
    text = httpx.get(f"{_root(url)}/metrics", timeout=10).text
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "compaction_proxy_store_errors_total":
                found[sample.labels["operation"], sample.labels["kind"]] = sample.value
    return found


# --- SQLite: a full disk, a damaged file -----------------------------------------


def test_a_full_disk_serves_compacting_requests_without_storing(
    fake: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    """The proxy process may grow no file past 4 KiB (RLIMIT_FSIZE, set on the
    running process after its start-up): the kernel refuses every write to the
    WAL as a full disk would (EFBIG for ENOSPC; SQLite reports "database or
    disk is full" or a write I/O error, one path in the proxy). Reads work."""
    _, upstream_url = fake
    db = tmp_path / "state.db"
    anyio.run(_create_database, db)  # the schema is written before the limit
    proxy = ProxyProcess(upstream_url, process_env(f"sqlite:///{db}"), str(tmp_path))
    try:
        limit = 4096  # not one WAL frame more (the -shm exists already)
        resource.prlimit(proxy.process.pid, resource.RLIMIT_FSIZE, (limit, limit))

        response = chat(proxy.url, LONG)
        answered(response, "condensed")
        again = chat(proxy.url, [*LONG, {"role": "user", "content": "and then?"}])
        answered(again, "condensed")  # nothing was stored: compacted afresh

        errors = _store_errors(proxy.url)
        assert errors.get(("put", "error"), 0) + errors.get(("add_event", "error"), 0) >= 2
        health = healthz(proxy.url)
        assert health["status"] == "degraded"
        assert health["store"]["error"] in ("OperationalError", "DatabaseError")
    finally:
        proxy.stop(kill=True)


async def _create_database(path: Path) -> None:
    store = SQLiteStore(path)
    await store.purge()
    await store.close()


@pytest.mark.parametrize("damage", ["text", "random bytes"])
def test_a_damaged_state_file_is_moved_aside_and_the_proxy_starts(
    fake: tuple[FakeUpstream, str], tmp_path: Path, damage: str
) -> None:
    _, upstream_url = fake
    db = tmp_path / "state" / "state.db"
    db.parent.mkdir()
    content = b"not a database\n" * 100 if damage == "text" else bytes(range(256)) * 40
    db.write_bytes(content)

    proxy = ProxyProcess(upstream_url, process_env(f"sqlite:///{db}"), str(tmp_path))
    try:
        response = chat(proxy.url, LONG)
        answered(response, "condensed")
        ident = response.headers["x-compaction-id"]
        stored = httpx.get(
            f"{proxy.url}/compaction/checkpoints/{ident}",
            headers={"authorization": "Bearer sk-test"},
            timeout=10,
        )
        assert stored.status_code == 200  # the fresh file works
        assert healthz(proxy.url) == {"status": "ok"}
    finally:
        proxy.process.terminate()
        _, stderr = proxy.process.communicate(timeout=30)

    [aside] = [p for p in db.parent.iterdir() if p.name.startswith("state.db.corrupt-")]
    assert aside.read_bytes() == content
    [line] = [line for line in stderr.decode().splitlines() if "is damaged" in line]
    assert str(db) in line and str(aside) in line


# --- Redis: killed, hung ------------------------------------------------------------


@contextmanager
def _redis() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (CI installs it)")
    port = free_port()
    process = start_redis(binary, port)
    try:
        yield process, port
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(timeout=10)


@contextmanager
def _proxy(upstream_url: str, store: dict[str, Any]) -> Iterator[str]:
    settings = load_settings(None, upstream={"base_url": upstream_url}, store=store, models=MODELS)
    with serve_in_thread(create_app(settings)) as url:
        yield url + "/v1"


def test_redis_killed_mid_session_degrades_and_recovers(
    fake: tuple[FakeUpstream, str],
) -> None:
    _, upstream_url = fake
    with (
        _redis() as (server, port),
        _proxy(upstream_url, {"url": f"redis://127.0.0.1:{port}/0"}) as url,
    ):
        answered(chat(url, LONG), "condensed")
        assert healthz(url) == {"status": "ok"}
        server.kill()
        server.wait(timeout=10)

        known = chat(url, [*LONG, {"role": "user", "content": "one more thing"}])
        answered(known, "condensed")  # its checkpoint is out of reach: compacted afresh
        answered(chat(url, agent_session(seed=32, steps=120)), "condensed")  # a new one
        answered(chat(url, SHORT), "none")

        events = httpx.get(f"{url}/compaction/events", timeout=10)
        assert events.status_code == 503
        assert events.json()["error"]["code"] == "store_unavailable"
        health = healthz(url)
        assert health["status"] == "degraded"
        assert health["store"]["operation"] == "lookup"
        assert _store_errors(url)[("lookup", "error")] >= 3

        restarted = start_redis(cast(str, shutil.which("redis-server")), port)
        try:
            # Reads and writes again (a read alone proves nothing of the writes).
            answered(chat(url, agent_session(seed=33, steps=120)), "condensed")
            assert healthz(url) == {"status": "ok"}
            assert httpx.get(f"{url}/compaction/events", timeout=10).status_code == 200
        finally:
            restarted.kill()
            restarted.wait(timeout=10)


def test_a_hung_redis_costs_a_request_one_timeout(fake: tuple[FakeUpstream, str]) -> None:
    _, upstream_url = fake
    with (
        _redis() as (server, port),
        _proxy(upstream_url, {"url": f"redis://127.0.0.1:{port}/0"}) as url,
    ):
        assert chat(url, SHORT).status_code == 200
        server.send_signal(signal.SIGSTOP)  # accepts, never answers

        answered(chat(url, LONG), "condensed")
        errors = _store_errors(url)
        # The request waited on the store once; every later call of it
        # (lock, events, the checkpoint) skipped the hung store.
        assert errors[("lookup", "timeout")] == 1
        assert errors[("put", "skipped")] == 1
        assert errors[("add_event", "skipped")] == 3
        health = healthz(url)
        assert health["status"] == "degraded" and health["store"]["error"] == "timeout"


# --- /healthz -----------------------------------------------------------------------


def test_healthz_says_degraded_from_a_failure_until_the_store_answers(
    fake: tuple[FakeUpstream, str],
) -> None:
    _, upstream_url = fake
    faulty = FaultyStore()
    settings = load_settings(
        None, upstream={"base_url": upstream_url}, store={"url": "memory://"}, models=MODELS
    )
    with serve_in_thread(create_app(settings, store=cast(Store, faulty))) as root:
        url = root + "/v1"
        assert healthz(url) == {"status": "ok"}
        faulty.fault = "error"
        answered(chat(url, LONG), "condensed")
        health = healthz(url)
        assert health["status"] == "degraded"
        assert health["store"]["operation"] == "lookup"
        assert health["store"]["error"] == "OSError"
        assert health["store"]["failed_calls"] >= 5

        faulty.fault = "hang"  # /healthz answers from what it knows, never asks
        asked = len(faulty.calls)
        assert healthz(url)["status"] == "degraded"
        assert len(faulty.calls) == asked

        faulty.fault = None
        answered(chat(url, LONG), "condensed")  # reads and writes
        assert healthz(url) == {"status": "ok"}
