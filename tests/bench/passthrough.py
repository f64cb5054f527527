"""Pass-through overhead (concurrency 1) and throughput at p99 ≤ 50 ms.

A small chat request, under every trigger, so the proxy forwards the client's
bytes untouched: what is measured is the cost of the extra hop itself. The
same for the other two compacted APIs (Anthropic Messages, OpenAI Responses).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from tests.bench import client
from tests.bench.client import Target
from tests.bench.rig import DIRECT, Rig, Rounds
from tests.bench.stats import ms, percentile
from tests.bench.workloads import small_body

#: Closed-loop concurrency ladder for the throughput search.
LADDER = (1, 2, 4, 8, 16, 32, 64)
P99_LIMIT = 0.050


@dataclass(frozen=True)
class Settings:
    rounds: int = 5
    requests: int = 250  #: per target and round, after a warm-up
    throughput_rounds: int = 3
    step_seconds: float = 1.0  #: measured time per concurrency step


def latency(rig: Rig, settings: Settings) -> Rounds:
    """p50 / p99 in ms, errors, and the server's CPU ms per request, per round."""
    body = small_body()

    def measure(target: Target) -> dict[str, float]:
        request = target.request("/chat/completions", body)
        server = rig.server(target.name)
        cpu = server.cpu_seconds()
        replies = client.run(client.sequential(target, request, settings.requests))
        used = server.cpu_seconds() - cpu
        seconds = [reply.seconds for reply in replies]
        return {
            "p50": ms(percentile(seconds, 0.50)),
            "p99": ms(percentile(seconds, 0.99)),
            "errors": float(sum(reply.status != 200 for reply in replies)),
            "cpu_ms": ms(used) / (settings.requests + 20),
        }

    return rig.interleave(settings.rounds, measure)


PROXY_NAME = "compaction-proxy"
#: A small request of each compacted API besides chat, the same conversation.
API_BODIES = {
    "/messages": {
        "model": "claude-bench",
        "max_tokens": 256,
        "system": [{"type": "text", "text": "You are a helpful assistant."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
    },
    "/responses": {
        "model": "gpt-4o",
        "instructions": "You are a helpful assistant.",
        "input": [{"type": "message", "role": "user", "content": "Say hello."}],
        "store": False,
    },
}


def api_latency(rig: Rig, settings: Settings) -> dict[str, Rounds]:
    """:func:`latency` for ``POST /v1/messages`` and ``/v1/responses`` (direct and
    compaction-proxy only: the peer is configured for chat)."""
    results = {}
    for path, body in API_BODIES.items():
        request_body = orjson.dumps(body)

        def measure(
            target: Target, path: str = path, raw: bytes = request_body
        ) -> dict[str, float]:
            replies = client.run(
                client.sequential(target, target.request(path, raw), settings.requests)
            )
            seconds = [reply.seconds for reply in replies]
            return {
                "p50": ms(percentile(seconds, 0.50)),
                "p99": ms(percentile(seconds, 0.99)),
                "errors": float(sum(reply.status != 200 for reply in replies)),
            }

        results[path] = rig.interleave(settings.rounds, measure, only=[DIRECT, PROXY_NAME])
    return results


def throughput(rig: Rig, settings: Settings) -> Rounds:
    """The best requests/s with p99 ≤ 50 ms over the concurrency ladder, per round.

    The ladder stops at the first step whose p99 exceeds the limit or that
    had errors: past it, latency only grows.
    """
    body = small_body()

    def measure(target: Target) -> dict[str, float]:
        request = target.request("/chat/completions", body)
        best = {"rps": 0.0, "concurrency": 0.0, "p99": 0.0}
        for concurrency in LADDER:
            load = client.run(
                client.closed_loop(
                    target, lambda: request, concurrency=concurrency, seconds=settings.step_seconds
                )
            )
            p99 = percentile(load.latencies, 0.99)
            if load.errors or p99 > P99_LIMIT:
                break
            if load.rps > best["rps"]:
                best = {"rps": load.rps, "concurrency": float(concurrency), "p99": ms(p99)}
        return best

    return rig.interleave(settings.throughput_rounds, measure)
