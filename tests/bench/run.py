"""Run the whole bench and write tests/bench/RESULTS.md.

    .venv/bin/python -m tests.bench.run [--output PATH] [--quick] [--no-peer] [--no-profile]

``make bench`` runs it. Installing the peer (LiteLLM, once, into .bench-venv/)
happens before anything is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.bench import (
    background,
    clients,
    dashboard,
    growing,
    large,
    memory,
    passthrough,
    peer,
    profiling,
    recall,
    streaming,
)
from tests.bench.client import Target, run, sequential
from tests.bench.processes import (
    CLIENT_CORE,
    MODEL_2M,
    MODEL_16K,
    MODEL_32K,
    PROXY_CORE,
    ROOT,
    UPSTREAM_CORE,
    Server,
    cores,
    pin_self,
    start_forwarder,
    start_proxy,
    start_upstream,
)
from tests.bench.report import PROXY, Results, render
from tests.bench.rig import Rig
from tests.bench.workloads import chat_body, conversation, corpus, small_body

RESULTS = Path(__file__).with_name("RESULTS.md")


class Clock:
    """Prints each phase with the time since the start, so a slow phase shows."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        print(f"bench: [{self.elapsed():5.0f} s] {name} …", flush=True)
        yield

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _memory_total() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return "?"


def _load() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def _revision() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "? (not a git checkout)"
    return f"{sha}" + (" with uncommitted changes" if dirty else "")


def _command(argv: list[str]) -> str:
    invoked = os.environ.get("BENCH_COMMAND")  # set by `make bench`
    direct = shlex.join([".venv/bin/python", "-m", "tests.bench.run", *argv])
    return f"`{invoked}` (runs `{direct}`)" if invoked else f"`{direct}`"


def _profile_loads(upstream: Server, logs: Path) -> list[profiling.Profile]:
    small = small_body()
    counter = large.TokenCounter("gpt-4o")
    big = chat_body(conversation(100_000, seed=1, counter=counter))

    def pass_through(target: Target) -> int:
        run(sequential(target, target.request("/chat/completions", small), 500, 0))
        return 500

    def under_trigger(target: Target) -> int:
        run(sequential(target, target.request("/chat/completions", big), 20, 0))
        return 20

    return [
        profiling.profile_load(upstream, logs, "Pass-through, small request, c=1", pass_through),
        profiling.profile_load(
            upstream, logs, "100k-token conversation under the trigger, c=1", under_trigger
        ),
    ]


def bench(args: argparse.Namespace, argv: list[str]) -> Results:
    notes: list[str] = []
    if not args.no_peer:
        problem = peer.ensure_installed()  # before the clock starts
        if problem:
            notes.append(f"LiteLLM not measured: {problem}.")
    clock = Clock()
    available = cores()
    pinned = pin_self(CLIENT_CORE)
    load_before = _load()
    quick = args.quick
    pass_settings = (
        passthrough.Settings(rounds=2, requests=100, throughput_rounds=1, step_seconds=0.5)
        if quick
        else passthrough.Settings()
    )
    stream_settings = streaming.Settings(rounds=1 if quick else 3)
    large_settings = large.Settings(rounds=2, runs=1) if quick else large.Settings()
    grow_settings = growing.Settings(rounds=2, turns=5) if quick else growing.Settings()

    with (
        tempfile.TemporaryDirectory(prefix="compaction-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        logs = Path(tmp)
        with clock.phase("starting the upstream, compaction-proxy and LiteLLM"):
            upstream = start_upstream(logs, streaming.CHUNKS, streaming.INTERVAL)
            stack.callback(upstream.stop)
            proxy = start_proxy(upstream, logs, logs / "state.db")
            stack.callback(proxy.stop)
            rig = Rig(upstream, {PROXY: proxy})
            litellm = None
            if not args.no_peer and not notes:
                found = peer.start_peer(upstream, logs)
                if found.server is None:
                    notes.append(found.note)
                else:
                    litellm = found.server
                    stack.callback(litellm.stop)
                    rig.proxies["litellm"] = litellm
            idle = {name: server.rss_kib() for name, server in rig.proxies.items()}

        with clock.phase("0. what each HTTP client costs per request"):
            client_costs = clients.measure(upstream.base_url, rounds=1 if quick else 3)
        with clock.phase("1. pass-through latency, concurrency 1"):
            latency = passthrough.latency(rig, pass_settings)
        with clock.phase("1b. the other compacted APIs, concurrency 1"):
            apis = passthrough.api_latency(rig, pass_settings)
        with clock.phase("2. throughput ladder"):
            throughput = passthrough.throughput(rig, pass_settings)
        with clock.phase("3. streaming at 1, 10 and 50 streams"):
            streams = streaming.measure(rig, stream_settings)
        with clock.phase("4a. 100k-token conversation under the trigger"):
            under, under_tokens = large.under_trigger(rig, large_settings)
        rss = {name: (idle[name], server.rss_kib()) for name, server in rig.proxies.items()}
        if litellm is not None:
            litellm.stop()
        with clock.phase("4d. growing sessions at 10k, 100k and 1M tokens, and a bare forwarder"):
            forwarder = start_forwarder(upstream, logs)
            stack.callback(forwarder.stop)
            beside = Rig(upstream, {PROXY: proxy, growing.FORWARDER: forwarder})
            before = proxy.rss_kib()
            grown = growing.measure(beside, grow_settings, PROXY)
            grown_rss = (before, proxy.rss_kib())
            floor = growing.small(beside, grow_settings, PROXY)
            forwarder.stop()
        with clock.phase("4b. first compactions, 100k, 500k and 1M tokens"):
            first = large.first_compaction(rig, large_settings, PROXY)
        fixtures = corpus()
        if not fixtures:
            notes.append("`../shared/fixtures` is absent: the corpus table and run are skipped.")
        with clock.phase(f"4c. the corpus ({len(fixtures)} conversations) in-process"):
            buckets = large.corpus_table(fixtures)
        proxy.stop()
        with clock.phase("5. memory: idle, 10,000 requests, the corpus"):
            mem = memory.measure(upstream, logs, fixtures)
            reading = growing.reading_memory()
        with clock.phase("6. the dashboard over 1,000 sessions, 100,000 requests"):
            board = dashboard.measure(upstream, logs)
        with clock.phase("7. compactions prepared in the background (a 4 s summarizer)"):
            ahead = background.measure(logs)
        with clock.phase("8. recall: streamed TTFB with no recall made, one recall round"):
            recalled = recall.measure(
                logs, recall.Settings(rounds=3, streams=5, round_trips=5) if quick else None
            )
        profiles = []
        if not args.no_profile:
            with clock.phase("profiling a proxy process under load"):
                profiles = _profile_loads(upstream, logs)
        names = [t.name for t in rig.targets]

    seconds = clock.elapsed()
    machine = [
        ("date", datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
        ("command", _command(argv)),
        ("code", f"git {_revision()}"),
        ("duration", f"{seconds / 60:.1f} min (LiteLLM's install excluded)"),
        ("machine", f"{available} cores (nproc), {_cpu_model()}, {_memory_total()}"),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        ("load average at start / end", f"{load_before} / {_load()} (the machine is shared)"),
    ]
    peer_line = (
        f"LiteLLM {peer.version()} (`litellm --num_workers 1`, default logging, "
        "master key set), pointed at the same upstream; column `litellm`"
        if "litellm" in names
        else "not measured (see the notes)"
    )
    method = [
        (
            "pinning",
            f"upstream on core {UPSTREAM_CORE}, each proxy on core {PROXY_CORE}, the client "
            f"(the bench process) on core {CLIENT_CORE}"
            if pinned
            else "none (a single core)",
        ),
        (
            "upstream",
            "raw ASGI app under uvicorn (uvloop, httptools), own process "
            "(`tests/bench/upstream.py`): a fixed JSON completion, or "
            f"{streaming.CHUNKS} SSE frames {streaming.INTERVAL * 1000:.0f} ms apart",
        ),
        (
            "compaction-proxy",
            "`compaction-proxy serve --port P --upstream URL`, default log level (info, to a "
            "file), store `sqlite:///<temp dir>/state.db`, summarizer `extractive`, "
            f"`COMPACTION_PROXY_MODELS` adds {MODEL_32K} (32k window), {MODEL_16K} (16k) "
            f"and {MODEL_2M} (2M)",
        ),
        ("peer", peer_line),
        (
            "bare forwarder",
            "raw ASGI app under uvicorn that sends the client's bytes on with aiohttp and "
            "streams the answer back (`tests/bench/forwarder.py`), pinned like the proxies; "
            "section 4d only",
        ),
        (
            "client",
            "a minimal asyncio/uvloop HTTP/1.1 keep-alive client (`tests/bench/client.py`); "
            "each stream on its own connection, opened before the clock starts",
        ),
        (
            "rounds",
            f"latency {pass_settings.rounds}×{pass_settings.requests} requests; throughput "
            f"{pass_settings.throughput_rounds}× ladder {passthrough.LADDER} at "
            f"{pass_settings.step_seconds:.1f} s a step; streaming {stream_settings.rounds}×; "
            f"large {large_settings.rounds}×{large_settings.requests}; first compactions "
            f"{large_settings.runs} per size; growing sessions {grow_settings.rounds}×"
            f"{grow_settings.turns} turns" + (" (--quick)" if quick else ""),
        ),
    ]
    return Results(
        machine=machine,
        method=method,
        names=names,
        latency=latency,
        throughput=throughput,
        streams=streams,
        under_trigger=under,
        under_trigger_tokens=under_tokens,
        first=first,
        corpus=buckets,
        memory=mem,
        rss=rss,
        profiles=profiles,
        clients=client_costs,
        apis=apis,
        notes=notes,
        dashboard=board,
        background=ahead,
        growing=grown,
        growing_floor=floor,
        growing_rss=grown_rss,
        reading=reading,
        recall=recalled,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__)
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the results")
    parser.add_argument("--quick", action="store_true", help="fewer rounds: to try the bench")
    parser.add_argument("--no-peer", action="store_true", help="skip LiteLLM")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile section")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    results = bench(args, argv)
    args.output.write_text(render(results))
    print(f"bench: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
