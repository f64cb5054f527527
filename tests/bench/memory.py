"""Memory: the proxy's RSS at idle, after 10,000 requests, after compacting the corpus.

A proxy process of its own (same settings as the measured one, its own SQLite
file), so the figures do not depend on what the other measurements sent. The
10,000 requests are all different (each has a message no other has), the
worst case for the per-message token cache.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from tests.bench import client
from tests.bench.client import Target
from tests.bench.processes import MODEL_16K, Server, start_proxy
from tests.bench.stats import ms
from tests.bench.workloads import Fixture, distinct_body

REQUESTS = 10_000
CONCURRENCY = 2


@dataclass(frozen=True)
class Memory:
    idle_kib: int
    first_request_kib: int
    after_requests_kib: int
    requests: int
    request_errors: int
    requests_seconds: float
    after_corpus_kib: int | None
    corpus: int
    corpus_stages: dict[str, int]
    corpus_errors: int
    corpus_median_ms: float
    corpus_max_ms: float


def measure(upstream: Server, logs: Path, fixtures: list[Fixture]) -> Memory:
    proxy = start_proxy(upstream, logs, logs / "memory.db", name="proxy-memory")
    try:
        time.sleep(1.0)
        idle = proxy.rss_kib()
        target = Target("proxy-memory", "127.0.0.1", proxy.port)
        numbers = itertools.count()

        def next_request() -> bytes:
            return target.request("/chat/completions", distinct_body(next(numbers)))

        client.run(client.sequential(target, next_request(), 1, 0))
        first = proxy.rss_kib()

        started = time.perf_counter()
        load = client.run(
            client.closed_loop(target, next_request, concurrency=CONCURRENCY, total=REQUESTS)
        )
        seconds = time.perf_counter() - started
        after_requests = proxy.rss_kib()

        stages: dict[str, int] = {}
        times: list[float] = []
        errors = 0

        async def compact_corpus() -> None:
            nonlocal errors
            connection = client.Connection(target)
            try:
                for fixture in fixtures:
                    body = orjson.dumps({**fixture.body, "model": MODEL_16K})
                    reply = await connection.call(target.request("/chat/completions", body))
                    stage = reply.headers.get("x-compaction-stage", "?")
                    stages[stage] = stages.get(stage, 0) + 1
                    times.append(ms(reply.seconds))
                    errors += reply.status != 200
            finally:
                await connection.close()

        client.run(compact_corpus())
        return Memory(
            idle_kib=idle,
            first_request_kib=first,
            after_requests_kib=after_requests,
            requests=load.requests,
            request_errors=load.errors,
            requests_seconds=seconds,
            after_corpus_kib=proxy.rss_kib() if fixtures else None,
            corpus=len(fixtures),
            corpus_stages=stages,
            corpus_errors=errors,
            corpus_median_ms=statistics.median(times) if times else 0.0,
            corpus_max_ms=max(times, default=0.0),
        )
    finally:
        proxy.stop()
