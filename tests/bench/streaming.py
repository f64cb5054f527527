"""Streaming: time to the first frame, gaps between frames, and frames delivered.

The upstream sends ``CHUNKS`` frames 20 ms apart and ``[DONE]``; every stream
through a proxy must deliver as many frames (a proxy may re-frame, never lose
one) and the ``[DONE]``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tests.bench import client
from tests.bench.client import Stream, Target
from tests.bench.rig import Rig, Rounds
from tests.bench.stats import ms, percentile
from tests.bench.workloads import small_body

CHUNKS = 64
INTERVAL = 0.020
LEVELS = (1, 10, 50)


@dataclass(frozen=True)
class Settings:
    rounds: int = 3
    sequential_at_1: int = 2  #: streams one after the other per round at concurrency 1


def _summary(streams: list[Stream]) -> dict[str, float]:
    gaps = [gap for stream in streams for gap in stream.gaps]
    return {
        "ttfb": ms(statistics.median(s.first_frame for s in streams)),
        "gap_p50": ms(percentile(gaps, 0.50)),
        "gap_p99": ms(percentile(gaps, 0.99)),
        "streams": float(len(streams)),
        "frames": float(sum(s.frames for s in streams)),
        "short": float(sum(s.frames < CHUNKS for s in streams)),
        "done": float(sum(s.done for s in streams)),
        "errors": float(sum(s.status != 200 for s in streams)),
    }


def measure(rig: Rig, settings: Settings) -> dict[int, Rounds]:
    """Per concurrency level, the per-round figures of every target."""
    body = small_body(stream=True)
    for target in rig.targets:  # the first stream through a proxy pays for imports
        request = target.request("/chat/completions", body)
        client.run(client.concurrent_streams(target, request, 1))

    results: dict[int, Rounds] = {}
    for level in LEVELS:

        def one_round(target: Target, level: int = level) -> dict[str, float]:
            request = target.request("/chat/completions", body)
            if level == 1:
                streams: list[Stream] = []
                for _ in range(settings.sequential_at_1):
                    streams += client.run(client.concurrent_streams(target, request, 1))
            else:
                streams = client.run(client.concurrent_streams(target, request, level))
            return _summary(streams)

        results[level] = rig.interleave(settings.rounds, one_round)
    return results
