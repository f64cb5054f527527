"""8. Recall: what it adds to a streamed answer that makes no recall, and what one recall costs.

Two proxies run side by side, the same but for ``compaction.recall`` (on, the
default, and ``false``), each in its own process with its own SQLite store,
at a 16k window (``gpt-4o-bench-16k``), in front of the same upstreams:

* **Streaming, no recall made.** A 24k-token tool-using conversation the
  proxies compact (briefs with refs on the recall side, so the tool is added
  there), sent again and again as it is — the checkpoint is reused on every
  request — streamed, against the fast upstream (:mod:`tests.bench.upstream`,
  :data:`CHUNKS` frames, the first at once), which answers text and never
  calls the tool. The time to the first frame is taken for the direct
  connection and both proxies in interleaved rounds (:class:`~tests.bench.rig.Rig`),
  the median of each round's streams a figure.
* **One recall round trip.** The same conversation, its last user message
  made new on each request (so that no remembered exchange is put back and
  the model asks again), not streamed, in front of the scripted model of
  :mod:`tests.proxy.recall_upstream` (served in this process): through the
  recall proxy it calls ``compaction_recall`` once and answers once it has
  the result (two upstream requests); through the other it answers at once.
  The proxy's own work per recall round is the recall proxy's time minus the
  other's minus the direct time of the second upstream request alone (the
  very bytes the proxy sent), round by round; and, apart from every wait, the
  proxy process's CPU time per request, recall minus none. Tokens are
  counted with the proxy's counter for the model.

Run alone: ``.venv/bin/python -m tests.bench.recall``.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from compaction import TokenCounter
from tests.bench import client
from tests.bench.client import Connection, Stream, Target
from tests.bench.processes import (
    BENCH_MODELS,
    MODEL_16K,
    PROXY_CORE,
    Server,
    _base_env,
    free_port,
    proxy_command,
    start,
    start_upstream,
)
from tests.bench.rig import DIRECT, Rig, Rounds, added
from tests.bench.stats import Spread, ms, spread
from tests.bench.workloads import conversation
from tests.proxy.recall_upstream import TOOL, RecallUpstream
from tests.proxy.servers import serve_in_thread

ON = "recall on"
OFF = "recall off"
#: Frames of the fast upstream's streamed answer, and the wait between them.
CHUNKS = 4
INTERVAL = 0.001
#: Tokens of the conversation the client sends (the 16k window compacts it).
TOKENS = 24_000
#: The pass-through budget a stream that makes no recall must stay within.
BUDGET_MS = 2.0

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("read_file", "bash", "edit_file")
]


@dataclass(frozen=True)
class Settings:
    rounds: int = 15
    streams: int = 20  #: streams per target per round, one after the other
    round_trips: int = 20  #: non-streamed requests per target per round


@dataclass(frozen=True)
class RecallBench:
    """The section's figures."""

    ttfb: Rounds  #: direct, ON, OFF → "ttfb" (ms), one value per round
    conversation_tokens: int  #: what the client sends
    first_tokens: int  #: the recall proxy's first upstream request (compacted, the tool added)
    tool_tokens: int  #: the recall tool's definition
    recalled_tokens: int  #: the tool's answer to the model's call
    followup_tokens: int  #: the second upstream request (the exchange appended)
    round_added: Spread  #: ms of the proxy's own work per recall round, wall
    round_cpu_ms: float  #: ms of proxy CPU per request, recall round minus none
    on_ms: Spread  #: a whole recalling request through the recall proxy
    off_ms: Spread  #: the same request through the other proxy
    followup_ms: Spread  #: the second upstream request sent directly

    @property
    def recall_ttfb(self) -> Spread:
        """TTFB added by recall: the recall proxy's round median minus the other's."""
        pairs = zip(self.ttfb[ON]["ttfb"], self.ttfb[OFF]["ttfb"], strict=True)
        return spread([on - off for on, off in pairs])


def messages(counter: TokenCounter, last: str = "Now make the failing test pass.") -> list[Any]:
    session = conversation(TOKENS, seed=3, counter=counter)
    return [*session, {"role": "user", "content": last}]


def body(conversation: list[Any], *, stream: bool) -> bytes:
    payload: dict[str, Any] = {"model": MODEL_16K, "messages": conversation, "tools": TOOLS}
    if stream:
        payload["stream"] = True
    return orjson.dumps(payload)


def start_proxy(upstream_url: str, logs: Path, name: str, *, recall: bool) -> Server:
    """``compaction-proxy serve`` as :func:`tests.bench.processes.start_proxy` starts it,
    with recall on or off."""
    port = free_port()
    env = {
        **_base_env(),
        "COMPACTION_PROXY_STORE__URL": f"sqlite:///{logs / name}.db",
        "COMPACTION_PROXY_COMPACTION__SUMMARIZER": "extractive",
        "COMPACTION_PROXY_COMPACTION__RECALL": "true" if recall else "false",
        "COMPACTION_PROXY_MODELS": BENCH_MODELS,
    }
    argv = [*proxy_command(), "--port", str(port), "--upstream", upstream_url]
    return start(
        name, argv, port=port, core=PROXY_CORE, env=env, logs=logs, health="/healthz", timeout=60
    )


def _streams(target: Target, request: bytes, count: int) -> list[Stream]:
    found: list[Stream] = []
    for _ in range(count):
        found += client.run(client.concurrent_streams(target, request, 1))
    return found


def streaming(rig: Rig, payload: bytes, settings: Settings) -> Rounds:
    """Per round, each target's median time to the first frame (ms)."""
    for target in rig.targets:  # the first compaction, and imports, before the clock
        streams = _streams(target, target.request("/chat/completions", payload), 3)
        if any(s.status != 200 or not s.done for s in streams):
            raise RuntimeError(f"{target.name}: a stream failed: {streams}")

    def one_round(target: Target) -> dict[str, float]:
        streams = _streams(target, target.request("/chat/completions", payload), settings.streams)
        if any(s.status != 200 or s.frames != CHUNKS for s in streams):
            raise RuntimeError(f"{target.name}: a stream lost frames")
        return {"ttfb": ms(statistics.median(s.first_frame for s in streams))}

    return rig.interleave(settings.rounds, one_round)


async def _calls(target: Target, requests: list[bytes], expect: bytes) -> list[float]:
    connection = await Connection(target).open()
    try:
        seconds = []
        for request in requests:
            reply = await connection.call(request)
            if reply.status != 200 or expect not in reply.body:
                raise RuntimeError(f"{target.name}: {reply.status} {reply.body[:300]!r}")
            seconds.append(reply.seconds)
        return seconds
    finally:
        await connection.close()


def _bodies(counter: TokenCounter, start: int, count: int) -> Iterator[bytes]:
    base = messages(counter)
    for index in range(start, start + count):
        last = {"role": "user", "content": f"Now make the failing test pass (attempt {index})."}
        yield body([*base[:-1], last], stream=False)


def measure(logs: Path, settings: Settings | None = None) -> RecallBench:
    settings = settings or Settings()
    counter = TokenCounter(MODEL_16K)
    sent = messages(counter)
    with ExitStack() as stack:
        fast = start_upstream(logs, CHUNKS, INTERVAL)
        stack.callback(fast.stop)
        on = start_proxy(fast.base_url, logs, "recall-on", recall=True)
        stack.callback(on.stop)
        off = start_proxy(fast.base_url, logs, "recall-off", recall=False)
        stack.callback(off.stop)
        ttfb = streaming(Rig(fast, {ON: on, OFF: off}), body(sent, stream=True), settings)
        on.stop()
        off.stop()

        scripted = RecallUpstream()
        url = stack.enter_context(serve_in_thread(scripted.app())) + "/v1"
        on = start_proxy(url, logs, "recall-on-scripted", recall=True)
        stack.callback(on.stop)
        off = start_proxy(url, logs, "recall-off-scripted", recall=False)
        stack.callback(off.stop)
        targets = {
            name: Target(name, "127.0.0.1", server.port) for name, server in ((ON, on), (OFF, off))
        }
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        upstream = Target(DIRECT, "127.0.0.1", port)

        # The first request compacts; its two upstream requests are the ones measured.
        warm = list(_bodies(counter, 0, 1))
        client.run(
            _calls(
                targets[ON],
                [targets[ON].request("/chat/completions", b) for b in warm],
                b"RECALLED:",
            )
        )
        first, followup = scripted.raw[-2], scripted.raw[-1]
        if TOOL.encode() not in first or b'"role":"tool"' not in followup:
            raise RuntimeError("the recall proxy did not recall: the figures would mean nothing")
        client.run(
            _calls(
                targets[OFF],
                [targets[OFF].request("/chat/completions", b) for b in warm],
                b"NO RECALL",
            )
        )

        times: dict[str, list[float]] = {ON: [], OFF: [], DIRECT: []}
        cpu: dict[str, list[float]] = {ON: [], OFF: []}
        added_rounds = []
        index = 1
        for round_index in range(settings.rounds):
            medians = {}
            order = [ON, OFF, DIRECT]
            shift = round_index % len(order)
            for name in order[shift:] + order[:shift]:
                # The scripted model reports a prompt of 100 tokens per request it
                # has seen; the proxy calibrates its counts by that, so left to
                # grow it would soon find no room for a recall. Forgetting them
                # keeps the reported prompt below the counted one.
                scripted.received.clear()
                scripted.raw.clear()
                if name == DIRECT:
                    requests = [upstream.request("/chat/completions", followup)] * (
                        settings.round_trips
                    )
                    seconds = client.run(_calls(upstream, requests, b"RECALLED:"))
                else:
                    target = targets[name]
                    requests = [
                        target.request("/chat/completions", b)
                        for b in _bodies(counter, index, settings.round_trips)
                    ]
                    index += settings.round_trips
                    server = on if name == ON else off
                    before = server.cpu_seconds()
                    expect = b"RECALLED:" if name == ON else b"NO RECALL"
                    seconds = client.run(_calls(target, requests, expect))
                    cpu[name].append(server.cpu_seconds() - before)
                medians[name] = ms(statistics.median(seconds))
                times[name].append(medians[name])
            added_rounds.append(medians[ON] - medians[OFF] - medians[DIRECT])

    followed = orjson.loads(followup)
    recalled = str(followed["messages"][-1]["content"])
    tool = next(t for t in orjson.loads(first)["tools"] if t["function"]["name"] == TOOL)
    return RecallBench(
        ttfb=ttfb,
        conversation_tokens=counter.count_request({"messages": sent, "tools": TOOLS}),
        first_tokens=counter.count_request(orjson.loads(first)),
        tool_tokens=counter.count_text(orjson.dumps(tool).decode()),
        recalled_tokens=counter.count_text(recalled),
        followup_tokens=counter.count_request(followed),
        round_added=spread(added_rounds),
        # Summed over every round: the clock of /proc ticks every 10 ms, too
        # coarse for one round's twenty requests.
        round_cpu_ms=ms((sum(cpu[ON]) - sum(cpu[OFF])) / (settings.rounds * settings.round_trips)),
        on_ms=spread(times[ON]),
        off_ms=spread(times[OFF]),
        followup_ms=spread(times[DIRECT]),
    )


def report(figures: RecallBench) -> list[str]:
    """The section's lines for RESULTS.md."""
    r = figures.ttfb
    rows = [
        (DIRECT, spread(r[DIRECT]["ttfb"]).show(2, " ms"), "—"),
        (ON, spread(r[ON]["ttfb"]).show(2, " ms"), added(r, ON, "ttfb").show(2, " ms")),
        (OFF, spread(r[OFF]["ttfb"]).show(2, " ms"), added(r, OFF, "ttfb").show(2, " ms")),
    ]
    lines = [
        f"A {figures.conversation_tokens:,}-token tool-using conversation at a 16k window "
        "(compacted once, its checkpoint reused on every request), streamed; the upstream "
        f"answers text ({CHUNKS} frames) and never calls the tool. Time to the first frame:",
        "",
        "| target | TTFB | added |",
        "|---|---|---|",
        *(f"| {name} | {value} | {more} |" for name, value, more in rows),
        "",
        f"**Recall adds {figures.recall_ttfb.show(2, ' ms')}** to the first frame "
        f"(recall on minus off, round by round; budget ≤ {BUDGET_MS:.0f} ms).",
        "",
        "One recall round trip (the scripted model calls `compaction_recall` once, then "
        "answers; not streamed):",
        "",
        "| figure | value |",
        "|---|---|",
        f"| whole request, recall proxy (2 upstream requests) | {figures.on_ms.show(2, ' ms')} |",
        f"| whole request, recall off (1 upstream request) | {figures.off_ms.show(2, ' ms')} |",
        f"| the second upstream request alone, direct | {figures.followup_ms.show(2, ' ms')} |",
        f"| **proxy's own work per recall round** (on − off − second request) | "
        f"**{figures.round_added.show(2, ' ms')}** |",
        f"| proxy CPU per request, recall minus none | {figures.round_cpu_ms:.2f} ms |",
        f"| tokens: first request sent (compacted, tool added) | {figures.first_tokens:,} |",
        f"| tokens: the tool's definition | {figures.tool_tokens:,} |",
        f"| tokens: the recalled text | {figures.recalled_tokens:,} |",
        f"| tokens: the second request (what the provider reads again) | "
        f"{figures.followup_tokens:,} |",
    ]
    return lines


if __name__ == "__main__":  # python -m tests.bench.recall: this section alone
    import tempfile

    from tests.bench.processes import CLIENT_CORE, pin_self

    pin_self(CLIENT_CORE)
    quick = "--quick" in sys.argv
    with tempfile.TemporaryDirectory() as folder:
        chosen = Settings(rounds=3, streams=5, round_trips=5) if quick else Settings()
        print("\n".join(report(measure(Path(folder), chosen))))
        sys.stdout.flush()
