"""A growing session under the trigger: every request resends the previous one and adds a turn.

What an agent does each turn: the whole history again, plus an assistant
message and a tool result. At 10k, 100k and 1M tokens (the last to a model
with a 2M window, as agents of the 1M-token models send them), every target
gets the same bodies in the same round — the direct connection, the proxy and
the bare forwarder (``tests/bench/forwarder.py``: the same server and upstream
client, no work) — so that what the proxy adds can be set against what the hop
itself costs. Each round's turns are new text (the token cache has not seen
them), and each target's first request of a round is not measured: for the
proxy it is a rewind to the round's start, read in full.

The small pass-through request is measured on the same three targets too:
the floor a bare hop sets for it. Also here: what the proxy's reading cache
holds for one such conversation (the bytes and parsed objects a reading
keeps, measured with tracemalloc, and the estimate its bound counts).
"""

from __future__ import annotations

import statistics
import tracemalloc
from dataclasses import dataclass
from typing import Any

import orjson

from compaction import TokenCounter
from compaction.conversation.incremental import reading_of
from compaction.conversation.reading import read_conversation
from tests.bench import client
from tests.bench.client import Target
from tests.bench.processes import MODEL_2M
from tests.bench.rig import Rig, Rounds
from tests.bench.stats import ms, percentile
from tests.bench.workloads import chat_body, conversation, small_body

SIZES = (10_000, 100_000, 1_000_000)
FORWARDER = "bare forwarder"
#: What the proxy adds may be at most this many times what the bare forwarder adds.
TARGET_RATIO = 1.5
SMALL_REQUESTS = 250


@dataclass(frozen=True)
class Settings:
    rounds: int = 5
    turns: int = 10  #: measured requests per target and round, each one turn longer


@dataclass(frozen=True)
class Size:
    size: int  #: the size asked for (one of :data:`SIZES`)
    tokens: int  #: the session's size at its first request
    body_bytes: int
    rounds: Rounds  #: per target: p50 ms and errors per round
    stages: tuple[str, ...]  #: x-compaction-stage seen on the proxy's answers


@dataclass(frozen=True)
class ReadingMemory:
    tokens: int
    body_bytes: int
    held_bytes: int  #: allocated to parse and read the body (tracemalloc), which a reading keeps
    estimate_bytes: int  #: what the cache's bound counts for it


def _turn(round_: int, step: int) -> list[dict[str, Any]]:
    """One agent turn no other round repeats: a call and its result, ~300 tokens."""
    call_id = f"call_r{round_}_{step}"
    arguments = orjson.dumps({"command": f"pytest -k case_{round_}_{step}"}).decode()
    output = " ".join(f"line {round_}.{step}.{i}: passed in {i * 7 % 13} ms" for i in range(40))
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "bash", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def _bodies(base: list[dict[str, Any]], round_: int, turns: int) -> list[bytes]:
    grown = list(base)
    bodies = [chat_body(grown, MODEL_2M)]
    for step in range(turns):
        grown += _turn(round_, step)
        bodies.append(chat_body(grown, MODEL_2M))
    return bodies


async def _session(target: Target, bodies: list[bytes]) -> list[client.Reply]:
    connection = client.Connection(target)
    try:
        await connection.call(target.request("/chat/completions", bodies[0]))
        return [
            await connection.call(target.request("/chat/completions", body)) for body in bodies[1:]
        ]
    finally:
        await connection.close()


def small(rig: Rig, settings: Settings, proxy: str) -> Rounds:
    """The small pass-through request on the same three targets, for the floor."""
    body = small_body()

    def measure(target: Target) -> dict[str, float]:
        request = target.request("/chat/completions", body)
        replies = client.run(client.sequential(target, request, SMALL_REQUESTS))
        return {"p50": ms(percentile([r.seconds for r in replies], 0.5))}

    return rig.interleave(settings.rounds, measure, only=["direct", proxy, FORWARDER])


def measure(rig: Rig, settings: Settings, proxy: str) -> list[Size]:
    counter = TokenCounter("gpt-4o")
    found = []
    for size in SIZES:
        base = conversation(size, seed=7, counter=counter)
        tokens = counter.count_request({"messages": base})
        targets = [t for t in rig.targets if t.name in ("direct", proxy, FORWARDER)]
        rounds: Rounds = {t.name: {} for t in targets}
        stages: set[str] = set()
        body_bytes = 0
        for index in range(settings.rounds):
            bodies = _bodies(base, index, settings.turns)
            body_bytes = len(bodies[-1])
            shift = index % len(targets)
            for target in targets[shift:] + targets[:shift]:
                replies = client.run(_session(target, bodies))
                if target.name == proxy:
                    stages.update(r.headers.get("x-compaction-stage", "") for r in replies)
                metrics = rounds[target.name]
                metrics.setdefault("p50", []).append(
                    ms(statistics.median(r.seconds for r in replies))
                )
                metrics.setdefault("errors", []).append(
                    float(sum(r.status != 200 for r in replies))
                )
        if stages - {"none"}:
            raise RuntimeError(f"the growing session was compacted: {stages}")
        found.append(Size(size, tokens, body_bytes, rounds, tuple(sorted(stages))))
    return found


def reading_memory(tokens: int = 1_000_000) -> ReadingMemory:
    """What one conversation's reading keeps: its parsed body and conversation
    (the body's bytes are the request's own, kept alive with it)."""
    counter = TokenCounter("gpt-4o")
    raw = chat_body(conversation(tokens, seed=7, counter=counter), MODEL_2M)
    tracemalloc.start()
    try:
        body = orjson.loads(raw)
        read = read_conversation(body, body["messages"], counter, 1)
        reading = reading_of(raw, body, read)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reading is not None
    return ReadingMemory(counter.count_request(body), len(raw), held + len(raw), reading.size)
