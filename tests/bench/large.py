"""Large conversations: forwarding one under the trigger, and first compactions.

* Under the trigger: a ~100k-token conversation to gpt-4o (128k window), sent
  again and again, so the proxy's token cache is warm — the steady state of a
  long agent session that still fits.
* First compaction, at 100k, 500k and 1M tokens: a conversation the proxy
  has never seen (nothing cached, no checkpoint), to a model with a 32k
  window, so the whole pipeline runs with the extractive summarizer:
  in-process (``compaction.compact`` with a fresh ``TokenCounter``, then again
  with that counter warm) and through the server (``x-compaction-stage``
  confirms it compacted).
* The corpus: every fixture compacted in-process at a 16k window.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from compaction import CannotFitError, CompactionResult, Profile, TokenCounter, compact
from tests.bench import client
from tests.bench.client import Reply, Target
from tests.bench.processes import MODEL_32K
from tests.bench.rig import DIRECT, Rig, Rounds
from tests.bench.stats import Spread, ms, percentile, spread
from tests.bench.workloads import Fixture, chat_body, conversation

SIZES = (100_000, 500_000, 1_000_000)
WINDOW = 32_000
CORPUS_WINDOW = 16_384
#: Corpus size buckets, in tokens (upper bounds).
BUCKETS = (4_000, 8_000, 16_000, 32_000, 64_000, 10**9)


@dataclass(frozen=True)
class Settings:
    rounds: int = 5
    requests: int = 10  #: per target and round, under the trigger
    runs: int = 3  #: first compactions per size


def under_trigger(rig: Rig, settings: Settings, tokens: int = 100_000) -> tuple[Rounds, int]:
    """p50 per round of a ~``tokens`` conversation that fits gpt-4o; and its token count."""
    counter = TokenCounter("gpt-4o")
    messages = conversation(tokens, seed=1, counter=counter)
    counted = counter.count_request({"messages": messages})
    body = chat_body(messages)
    stages: set[str] = set()

    def measure(target: Target) -> dict[str, float]:
        request = target.request("/chat/completions", body)
        replies = client.run(client.sequential(target, request, settings.requests, 3))
        stages.update(r.headers.get("x-compaction-stage", "") for r in replies)
        return {
            "p50": ms(statistics.median(r.seconds for r in replies)),
            "errors": float(sum(r.status != 200 for r in replies)),
        }

    results = rig.interleave(settings.rounds, measure)
    if stages - {"", "none"}:
        raise RuntimeError(f"the under-trigger conversation was compacted: {stages}")
    return results, counted


@dataclass(frozen=True)
class FirstCompaction:
    tokens: int  #: median size of the conversations
    cold: Spread  #: in-process ms, fresh TokenCounter
    warm: Spread  #: in-process ms, the same conversation again with its counts cached
    server: Spread  #: ms through the proxy (whole request)
    server_added: Spread  #: … minus the direct request with the same body
    stages: tuple[str, ...]  #: x-compaction-stage of each server run
    tokens_after: int


async def _timed(body: dict[str, Any], counter: TokenCounter) -> tuple[float, CompactionResult]:
    profile = Profile(context_window=WINDOW, summarizer="extractive")
    started = time.perf_counter()
    result = await compact(body, profile, counter=counter)
    return time.perf_counter() - started, result


def first_compaction(rig: Rig, settings: Settings, name: str) -> list[FirstCompaction]:
    proxy = next(t for t in rig.targets if t.name == name)
    direct = next(t for t in rig.targets if t.name == DIRECT)
    calibration = TokenCounter("gpt-4o")
    found = []
    for size in SIZES:
        cold, warm, server, added, sizes, after = [], [], [], [], [], []
        stages = []
        for run in range(settings.runs):
            messages = conversation(size, seed=1000 * size + run, counter=calibration)
            body = {"model": MODEL_32K, "messages": messages}
            counter = TokenCounter("gpt-4o")
            seconds, result = client.run(_timed(body, counter))
            cold.append(ms(seconds))
            warm.append(ms(client.run(_timed(body, counter))[0]))
            sizes.append(result.tokens_before)
            after.append(result.tokens_after)

            raw = chat_body(messages, MODEL_32K)
            base = client.run(_best(direct, direct.request("/chat/completions", raw)))
            reply = client.run(_once(proxy, proxy.request("/chat/completions", raw)))
            stages.append(reply.headers.get("x-compaction-stage", "?"))
            server.append(ms(reply.seconds))
            added.append(ms(reply.seconds - base))
        found.append(
            FirstCompaction(
                tokens=int(statistics.median(sizes)),
                cold=spread(cold),
                warm=spread(warm),
                server=spread(server),
                server_added=spread(added),
                stages=tuple(stages),
                tokens_after=int(statistics.median(after)),
            )
        )
    return found


async def _once(target: Target, request: bytes) -> Reply:
    connection = client.Connection(target)
    try:
        return await connection.call(request)
    finally:
        await connection.close()


async def _best(target: Target, request: bytes, tries: int = 3) -> float:
    """The fastest of a few sends of the same body: the direct figure to subtract."""
    return min([(await _once(target, request)).seconds for _ in range(tries)])


@dataclass(frozen=True)
class Bucket:
    label: str
    count: int
    compacted: int
    median_tokens: int
    median_ms: float
    p90_ms: float
    max_ms: float
    stages: dict[str, int]


def corpus_table(fixtures: list[Fixture]) -> list[Bucket]:
    """Every fixture compacted in-process at a 16k window, fresh counter each, by size."""
    profile = Profile(context_window=CORPUS_WINDOW, summarizer="extractive")
    rows: list[tuple[int, float, str]] = []

    async def run_all() -> None:
        for fixture in fixtures:
            counter = TokenCounter(fixture.body.get("model"))
            started = time.perf_counter()
            try:
                result = await compact(fixture.body, profile, counter=counter)
            except CannotFitError:  # its system prompt and tools alone exceed the limit
                tokens = counter.count_request(fixture.body)
                rows.append((tokens, ms(time.perf_counter() - started), "cannot fit"))
                continue
            rows.append((result.tokens_before, ms(time.perf_counter() - started), result.stage))

    client.run(run_all())
    buckets = []
    low = 0
    for high in BUCKETS:
        inside = [row for row in rows if low <= row[0] < high]
        if inside:
            times = [row[1] for row in inside]
            stages: dict[str, int] = {}
            for row in inside:
                stages[row[2]] = stages.get(row[2], 0) + 1
            label = f"{low // 1000}k – {high // 1000}k" if high < 10**9 else f"≥ {low // 1000}k"
            buckets.append(
                Bucket(
                    label=label,
                    count=len(inside),
                    compacted=sum(row[2] not in ("none", "cannot fit") for row in inside),
                    median_tokens=int(statistics.median(row[0] for row in inside)),
                    median_ms=statistics.median(times),
                    p90_ms=percentile(times, 0.9),
                    max_ms=max(times),
                    stages=stages,
                )
            )
        low = high
    return buckets
