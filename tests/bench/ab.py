"""Two revisions of the proxy side by side, on the three figures a change of the
request path moves most: the small pass-through request's added p50, the time
to first frame added at one stream, and the 100k-token growing session's cost
against the bare forwarder's.

    .venv/bin/python -m tests.bench.ab BASE [OTHER] [--rounds N]

``BASE`` and ``OTHER`` are git revisions, exported with ``git archive`` to
temporary directories; ``OTHER`` defaults to the working tree (``.``), with
whatever it holds uncommitted. Both proxies run at once against one upstream
and one bare forwarder, pinned as in the full bench, and every round measures
every target in an order that rotates (``tests.bench.rig``): on a shared
machine a difference between two runs is mostly the machine, a difference
within one run is mostly the code. Each figure is the median of the rounds,
with their range. A revision against itself shows how far apart two equal
trees land in one run: read a difference smaller than that as none.

    .venv/bin/python -m tests.bench.ab --history REV [REV ...] [--rounds N]

measures the pass-through alone for any number of revisions, all running at
once beside the bare forwarder, each started with only the settings every
revision since the first bench reads: where along the history a small
request's cost moved, read in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from compaction import TokenCounter
from tests.bench import client, growing, passthrough, streaming
from tests.bench.client import Stream, Target
from tests.bench.processes import (
    CLIENT_CORE,
    ROOT,
    Server,
    pin_self,
    start_forwarder,
    start_proxy,
    start_upstream,
)
from tests.bench.rig import DIRECT, Rig, Rounds, added
from tests.bench.stats import Spread, ms, spread
from tests.bench.workloads import conversation, small_body

#: The growing session's size: the figure with a target (:data:`growing.TARGET_RATIO`).
GROWING_TOKENS = 100_000
#: Streams one after the other per target and round (their first frames' median counts).
STREAMS_PER_ROUND = 4


@contextlib.contextmanager
def exported(revision: str) -> Iterator[Path]:
    """The tree of ``revision`` in a temporary directory (``.``: this working tree)."""
    if revision == ".":
        yield ROOT
        return
    with tempfile.TemporaryDirectory(prefix="compaction-ab-") as tmp:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", revision],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


def _streams(rig: Rig, rounds: int, names: list[str]) -> Rounds:
    body = small_body(stream=True)
    for target in rig.targets:  # the first stream through a proxy pays for imports
        client.run(client.concurrent_streams(target, target.request("/chat/completions", body), 1))

    def measure(target: Target) -> dict[str, float]:
        request = target.request("/chat/completions", body)
        found: list[Stream] = []
        for _ in range(STREAMS_PER_ROUND):
            found += client.run(client.concurrent_streams(target, request, 1))
        return {"ttfb": ms(statistics.median(s.first_frame for s in found))}

    return rig.interleave(rounds, measure, only=[DIRECT, *names, growing.FORWARDER])


def _growing(rig: Rig, rounds: int, turns: int) -> Rounds:
    """Per target and round, the median ms of a session's requests (each the
    previous one and a turn), the first (a rewind, read in full) not counted."""
    counter = TokenCounter("gpt-4o")
    base = conversation(GROWING_TOKENS, seed=7, counter=counter)
    targets = rig.targets
    results: Rounds = {t.name: {} for t in targets}
    for index in range(rounds):
        bodies = growing._bodies(base, index, turns)
        shift = index % len(targets)
        for target in targets[shift:] + targets[:shift]:
            replies = client.run(growing._session(target, bodies))
            stages = {r.headers.get("x-compaction-stage", "") for r in replies}
            if any(r.status != 200 for r in replies) or stages - {"", "none"}:
                raise RuntimeError(f"{target.name}: the growing session was not forwarded")
            median = ms(statistics.median(r.seconds for r in replies))
            results[target.name].setdefault("p50", []).append(median)
    return results


def _ratio(results: Rounds, name: str) -> Spread:
    """What ``name`` adds over the direct connection as a multiple of what the
    bare forwarder adds, round by round."""
    direct, forwarder = results[DIRECT]["p50"], results[growing.FORWARDER]["p50"]
    mine = results[name]["p50"]
    return spread(
        [(m - d) / (f - d) for m, f, d in zip(mine, forwarder, direct, strict=True) if f > d]
    )


def _cell(value: Spread, unit: str = " ms") -> str:
    return value.show(3, unit)


#: The two proxies' target names (their columns are titled with their revisions).
NAMES = ("A", "B")


@contextlib.contextmanager
def _rig(trees: Mapping[str, Path], *, minimal: bool = False) -> Iterator[Rig]:
    """One upstream, a proxy of each tree (by target name) and the bare
    forwarder, pinned as in the full bench; stopped on the way out.
    ``minimal``: see :func:`~tests.bench.processes.start_proxy`."""
    pin_self(CLIENT_CORE)
    with (
        tempfile.TemporaryDirectory(prefix="compaction-ab-run-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        logs = Path(tmp)
        upstream = start_upstream(logs, streaming.CHUNKS, streaming.INTERVAL)
        stack.callback(upstream.stop)
        servers: dict[str, Server] = {}
        for index, (name, tree) in enumerate(trees.items()):
            store = logs / f"{index}.db"
            server = start_proxy(upstream, logs, store, str(index), tree, minimal=minimal)
            stack.callback(server.stop)
            servers[name] = server
        forwarder = start_forwarder(upstream, logs)
        stack.callback(forwarder.stop)
        yield Rig(upstream, {**servers, growing.FORWARDER: forwarder})


def compare(base: Path, other: Path, titles: tuple[str, str], rounds: int) -> str:
    """The three figures of both trees, measured together; a markdown table."""
    names = NAMES
    with _rig(dict(zip(names, (base, other), strict=True))) as rig:
        small = passthrough.latency(rig, passthrough.Settings(rounds=rounds))
        first = _streams(rig, rounds, list(names))
        grown = _growing(rig, rounds, growing.Settings().turns)
    rows = [
        "| figure | target | " + " | ".join(titles) + f" | {growing.FORWARDER} |",
        "|---|---|" + "---|" * (len(names) + 1),
        "| pass-through added p50, c=1 | ≤ 0.5 ms | "
        + " | ".join(_cell(added(small, n, "p50")) for n in names)
        + f" | {_cell(added(small, growing.FORWARDER, 'p50'))} |",
        "| time to first frame added, 1 stream | ≤ 2 ms | "
        + " | ".join(_cell(added(first, n, "ttfb")) for n in names)
        + f" | {_cell(added(first, growing.FORWARDER, 'ttfb'))} |",
        f"| growing session at {GROWING_TOKENS // 1000}k tokens, added | — | "
        + " | ".join(_cell(added(grown, n, "p50")) for n in names)
        + f" | {_cell(added(grown, growing.FORWARDER, 'p50'))} |",
        "| … as a multiple of the bare forwarder's | ≤ 1.5 × | "
        + " | ".join(_cell(_ratio(grown, n), " ×") for n in names)
        + " | 1 × |",
    ]
    return "\n".join(rows)


def history(trees: list[Path], titles: list[str], rounds: int) -> str:
    """The pass-through of every tree, measured together; a markdown table."""
    with _rig(dict(zip(titles, trees, strict=True)), minimal=True) as rig:
        small = passthrough.latency(rig, passthrough.Settings(rounds=rounds))
    rows = [
        "| revision | pass-through added p50, c=1 | server CPU per request |",
        "|---|---|---|",
    ]
    for title in [*titles, growing.FORWARDER]:
        cpu = spread(small[title]["cpu_ms"])
        rows.append(f"| {title} | {_cell(added(small, title, 'p50'))} | {_cell(cpu)} |")
    return "\n".join(rows)


def _title(revision: str) -> str:
    """A revision with its commit's date and subject (cut short), for a table's row."""
    if revision == ".":
        return ". (the working tree)"
    shown = subprocess.run(
        ["git", "log", "-1", "--format=%h %cs %s", revision],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return shown if len(shown) <= 72 else shown[:71] + "…"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.ab", description=__doc__)
    parser.add_argument(
        "revisions",
        nargs="+",
        metavar="REV",
        help="BASE [OTHER]: git revisions, . for the working tree (OTHER's default); "
        "with --history, any number of them",
    )
    parser.add_argument(
        "--history",
        action="store_true",
        help="the pass-through alone, for every revision given",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every figure (default 5)")
    args = parser.parse_args(argv)
    if args.history:
        with contextlib.ExitStack() as stack:
            trees = [stack.enter_context(exported(revision)) for revision in args.revisions]
            print(history(trees, [_title(r) for r in args.revisions], args.rounds))
        return 0
    if len(args.revisions) > 2:
        parser.error("two revisions at most, unless --history")
    base, other = (*args.revisions, ".")[:2]
    titles = (f"A: {base}", f"B: {other}")
    with exported(base) as base_tree, exported(other) as other_tree:
        print(compare(base_tree, other_tree, titles, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
