"""The dashboard: its pages over a large store, and the chat path beside it.

A SQLite store is filled with 1,000 sessions of 100 requests each (100,000
per-request figures, through the store's own ``record_requests``), a proxy
process is started on it, and ``GET /ui`` and ``GET /ui/sessions/{id}`` are
timed one after the other (concurrency 1, the bench client). The target:
each page under 200 ms.

The chat path: small-request latency (concurrency 1) through this tree's
proxy on that filled store, and through the proxy of the revision before the
dashboard (``BASE``, from ``git archive``) on an empty store of its own, in
the same run: recording figures must add nothing a user could feel.

    .venv/bin/python -m tests.bench.dashboard   # this section alone
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from proxy.edge.access import owner_digest
from proxy.state.stores import RequestRecord, SQLiteStore
from tests.bench import client
from tests.bench.client import Connection, Target
from tests.bench.processes import ROOT, Server, start_proxy, start_upstream
from tests.bench.stats import Spread, ms, spread
from tests.bench.workloads import small_body

SESSIONS: Final = 1_000
PER_SESSION: Final = 100
PAGE_REQUESTS: Final = 50
CHAT_REQUESTS: Final = 1_000
TARGET_MS: Final = 200.0
#: The revision before the dashboard: the chat path as it was.
BASE: Final = "347af77"


@dataclass(frozen=True)
class Dashboard:
    sessions: int
    requests: int
    fill_seconds: float
    overview_ms: Spread  #: median, fastest, slowest of PAGE_REQUESTS
    overview_p95_ms: float
    session_ms: Spread
    session_p95_ms: float
    overview_bytes: int
    session_bytes: int
    chat_ms: Spread  #: this tree, the filled store
    chat_base_ms: Spread | None  #: BASE, an empty store
    base: str


def fill(path: Path, sessions: int = SESSIONS, per_session: int = PER_SESSION) -> float:
    """Fill a SQLite store with figures seen by the anonymous dashboard visitor."""

    async def work() -> None:
        store = SQLiteStore(path)
        owner = owner_digest("")  # the bench's GETs carry no key: the anonymous viewer
        start_at = time.time() - sessions * per_session
        try:
            for number in range(sessions):
                records = []
                for step in range(per_session):
                    tokens = 2_000 + step * 600
                    compacted = tokens > 40_000 and step % 10 == 0
                    records.append(
                        RequestRecord(
                            session=f"{number:016x}",
                            owner=owner,
                            model="bench-32k",
                            stage="condensed" if compacted else "none",
                            reason="threshold",
                            tokens_before=tokens,
                            tokens_after=tokens // 4 if compacted else min(tokens, 28_000),
                            input_limit=28_000,
                            trigger=24_000,
                            status=200,
                            ms=12.0,
                            summarizer_calls=int(compacted),
                            created_at=start_at + number * per_session + step,
                        )
                    )
                await store.record_requests(records)
        finally:
            await store.close()

    started = time.perf_counter()
    asyncio.run(work())
    return time.perf_counter() - started


def _get(target: Target, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{target.port}\r\n\r\n".encode()


async def _times(target: Target, request: bytes, count: int) -> tuple[list[float], int]:
    connection = Connection(target)
    try:
        first = await connection.call(request)
        assert first.status == 200, first.body[:300]
        replies = [await connection.call(request) for _ in range(count)]
    finally:
        await connection.close()
    return [ms(reply.seconds) for reply in replies], len(first.body)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


def _chat(server: Server) -> Spread:
    target = Target(server.name, "127.0.0.1", server.port)
    request = target.request("/chat/completions", small_body())
    replies = client.run(client.sequential(target, request, CHAT_REQUESTS, warmup=50))
    assert all(reply.status == 200 for reply in replies)
    return spread([ms(reply.seconds) for reply in replies])


def _base_proxy(upstream: Server, logs: Path) -> Server | None:
    """The proxy at :data:`BASE`, run from an exported tree; None without git."""
    try:
        archive = subprocess.run(
            ["git", "archive", BASE], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    tree = logs / "base"
    with tarfile.open(fileobj=io.BytesIO(archive)) as exported:
        exported.extractall(tree, filter="data")
    return start_proxy(upstream, logs, logs / "base.db", name="proxy-base", tree=tree)


def measure(upstream: Server, logs: Path) -> Dashboard:
    store = logs / "dashboard.db"
    fill_seconds = fill(store)
    proxy = start_proxy(upstream, logs, store, name="proxy-dashboard")
    try:
        target = Target(proxy.name, "127.0.0.1", proxy.port, prefix="")
        overview, overview_bytes = client.run(_times(target, _get(target, "/ui"), PAGE_REQUESTS))
        page = f"/ui/sessions/{SESSIONS - 1:016x}"
        session, session_bytes = client.run(_times(target, _get(target, page), PAGE_REQUESTS))
        chat = _chat(proxy)
    finally:
        proxy.stop()
    base = _base_proxy(upstream, logs)
    chat_base = None
    if base is not None:
        try:
            chat_base = _chat(base)
        finally:
            base.stop()
    return Dashboard(
        sessions=SESSIONS,
        requests=SESSIONS * PER_SESSION,
        fill_seconds=fill_seconds,
        overview_ms=spread(overview),
        overview_p95_ms=_p95(overview),
        session_ms=spread(session),
        session_p95_ms=_p95(session),
        overview_bytes=overview_bytes,
        session_bytes=session_bytes,
        chat_ms=chat,
        chat_base_ms=chat_base,
        base=BASE,
    )


def render(result: Dashboard) -> list[str]:
    def row(name: str, figures: Spread, p95: float, size: int) -> str:
        met = "met" if p95 < TARGET_MS else "**missed**"
        return (
            f"| {name} | {figures.median:.1f} | {p95:.1f} | {figures.high:.1f} | "
            f"{size / 1024:.0f} KiB | {met} |"
        )

    lines = [
        "## Dashboard pages over a large store",
        "",
        f"A SQLite store with {result.sessions:,} sessions and {result.requests:,} per-request "
        f"figures (filled in {result.fill_seconds:.1f} s through `record_requests`); each page "
        f"requested {PAGE_REQUESTS} times after one warm-up, concurrency 1. Target: < "
        f"{TARGET_MS:.0f} ms.",
        "",
        "| page | median ms | p95 ms | max ms | size | < 200 ms (p95) |",
        "|---|---|---|---|---|---|",
        row(
            "`GET /ui` (1,000 sessions)",
            result.overview_ms,
            result.overview_p95_ms,
            result.overview_bytes,
        ),
        row(
            f"`GET /ui/sessions/…` ({PER_SESSION} requests)",
            result.session_ms,
            result.session_p95_ms,
            result.session_bytes,
        ),
        "",
        f"The chat path, small request, concurrency 1, {CHAT_REQUESTS:,} requests (median, "
        "fastest–slowest): this tree on the filled store "
        f"{result.chat_ms.median:.2f} ms ({result.chat_ms.low:.2f}–{result.chat_ms.high:.2f})",
    ]
    if result.chat_base_ms is not None:
        base = result.chat_base_ms
        lines[-1] += (
            f"; git {result.base} (before the dashboard) on an empty store {base.median:.2f} ms "
            f"({base.low:.2f}–{base.high:.2f})."
        )
    else:
        lines[-1] += f"; git {result.base} could not be exported, not measured."
    return [*lines, ""]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="compaction-bench-ui-") as tmp:
        logs = Path(tmp)
        upstream = start_upstream(logs, 8, 0.0)
        try:
            result = measure(upstream, logs)
        finally:
            upstream.stop()
        with contextlib.suppress(BrokenPipeError):
            print("\n".join(render(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
