"""RESULTS.md: the machine, the method, the targets with met/missed, and every table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.bench import background, clients, dashboard, recall
from tests.bench.clients import ClientCost
from tests.bench.growing import FORWARDER, TARGET_RATIO, ReadingMemory, Size
from tests.bench.large import CORPUS_WINDOW, WINDOW, Bucket, FirstCompaction
from tests.bench.memory import Memory
from tests.bench.profiling import Profile
from tests.bench.rig import DIRECT, Rounds, added, of, ratio
from tests.bench.stats import Spread, spread, verdict
from tests.bench.streaming import CHUNKS, LEVELS

PROXY = "compaction-proxy"


@dataclass
class Results:
    """Everything one run measured; ``None`` where a part was skipped."""

    machine: list[tuple[str, str]]
    method: list[tuple[str, str]]
    names: list[str]  #: targets measured: direct, compaction-proxy, maybe litellm
    latency: Rounds
    throughput: Rounds
    streams: dict[int, Rounds]
    under_trigger: Rounds
    under_trigger_tokens: int
    first: list[FirstCompaction]
    corpus: list[Bucket]
    memory: Memory
    rss: dict[str, tuple[int, int]]  #: name → (idle KiB, after the rig KiB)
    profiles: list[Profile] = field(default_factory=list)
    clients: list[ClientCost] = field(default_factory=list)
    #: Pass-through rounds of ``/messages`` and ``/responses`` (direct and the proxy).
    apis: dict[str, Rounds] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The dashboard's pages over a large store, and the chat path beside them.
    dashboard: dashboard.Dashboard | None = None
    #: Who waits for a slow summarizer with and without preparing ahead.
    background: background.Background | None = None
    #: Growing sessions beside the bare forwarder, and the small request on the same targets.
    growing: list[Size] = field(default_factory=list)
    growing_floor: Rounds | None = None
    #: The proxy's RSS before and after the growing sessions (KiB).
    growing_rss: tuple[int, int] | None = None
    #: What one 1M-token conversation's reading holds.
    reading: ReadingMemory | None = None
    #: What recall adds to a stream that makes no recall, and one recall round's cost.
    recall: recall.RecallBench | None = None


@dataclass(frozen=True)
class Check:
    figure: str
    target: str
    value: str
    met: bool | None


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _le(spread: Spread, limit: float) -> bool | None:
    return None if math.isnan(spread.median) else spread.median <= limit


def _mib(kib: int | None) -> str:
    return "—" if kib is None else f"{kib / 1024:.0f} MiB"


def checks(r: Results) -> list[Check]:
    p50 = added(r.latency, PROXY, "p50")
    p99 = added(r.latency, PROXY, "p99")
    share = ratio(r.throughput, PROXY, "rps")
    ttfb = added(r.streams[1], PROXY, "ttfb")
    lost = _lost(r.streams, PROXY)
    big = added(r.under_trigger, PROXY, "p50")
    found = [
        Check("pass-through p50 added (c=1)", "≤ 0.5 ms", p50.show(2, " ms"), _le(p50, 0.5)),
        Check("pass-through p99 added (c=1)", "≤ 2 ms", p99.show(2, " ms"), _le(p99, 2.0)),
        *(
            Check(f"`{path}` pass-through p50 added (c=1)", "≤ 1 ms", s.show(2, " ms"), _le(s, 1.0))
            for path, rounds in r.apis.items()
            for s in (added(rounds, PROXY, "p50"),)
        ),
        Check(
            "throughput at p99 ≤ 50 ms, share of direct",
            "≥ 50 %",
            share.show(3),
            None if math.isnan(share.median) else share.median >= 0.5,
        ),
        Check("streaming TTFB added (c=1)", "≤ 2 ms", ttfb.show(2, " ms"), _le(ttfb, 2.0)),
        Check("streaming frames or [DONE] lost (all levels)", "0", str(lost), lost == 0),
        Check(
            f"{r.under_trigger_tokens:,}-token conversation under the trigger, added",
            "≤ 5 ms",
            big.show(2, " ms"),
            _le(big, 5.0),
        ),
    ]
    if r.recall is not None:
        by_recall = r.recall.recall_ttfb
        found.append(
            Check(
                "streaming TTFB added by recall, no recall made (on − off, compacted)",
                f"≤ {recall.BUDGET_MS:.0f} ms",
                by_recall.show(2, " ms"),
                _le(by_recall, recall.BUDGET_MS),
            )
        )
    for session in r.growing:
        over = _over_forwarder(session)
        found.append(
            Check(
                f"growing session at {session.tokens:,} tokens: added ÷ the bare forwarder's added",
                f"≤ {TARGET_RATIO}",
                over.show(2),
                None
                if session.size < 100_000 or math.isnan(over.median)
                else over.median <= TARGET_RATIO,
            )
        )
    for first, limit in zip(r.first, (150.0, 600.0, 1200.0), strict=False):
        size = f"{first.tokens:,}-token first compaction"
        found.append(
            Check(
                f"{size}, in-process (cold)",
                f"≤ {limit:.0f} ms",
                first.cold.show(0, " ms"),
                _le(first.cold, limit),
            )
        )
        found.append(
            Check(
                f"{size}, through the server (added)",
                f"≤ {limit:.0f} ms",
                first.server_added.show(0, " ms"),
                _le(first.server_added, limit),
            )
        )
    return found


def _over_forwarder(size: Size) -> Spread:
    """The proxy's added p50 over the bare forwarder's, round by round."""
    rounds = size.rounds
    mine = zip(rounds[PROXY]["p50"], rounds[DIRECT]["p50"], strict=True)
    bare = zip(rounds[FORWARDER]["p50"], rounds[DIRECT]["p50"], strict=True)
    return spread(
        [
            (p - d) / (f - e) if f - e > 0 else math.nan
            for (p, d), (f, e) in zip(mine, bare, strict=True)
        ]
    )


def _growing(r: Results) -> list[str]:
    if not r.growing:
        return []
    names = [DIRECT, PROXY, FORWARDER]
    lines = [
        "**A growing session under the trigger**: each request resends the previous one and "
        "adds a turn (a tool call and its result, new text), to a 2M-window model; the same "
        "bodies in the same round to the direct connection, the proxy and the bare forwarder "
        "(the same server and upstream client, no work: the cost of the hop itself). "
        "p50 of each round's turns; `x-compaction-stage: none` checked.",
        "",
    ]
    rows = []
    for size in r.growing:
        rows.append(
            [
                f"{size.tokens:,} ({size.body_bytes / 1e6:.1f} MB)",
                of(size.rounds, DIRECT, "p50").show(),
                added(size.rounds, PROXY, "p50").show(),
                added(size.rounds, FORWARDER, "p50").show(),
                _over_forwarder(size).show(2),
            ]
        )
    if r.growing_floor is not None:
        floor = r.growing_floor
        rows.append(
            [
                "small pass-through request",
                of(floor, DIRECT, "p50").show(),
                added(floor, PROXY, "p50").show(),
                added(floor, FORWARDER, "p50").show(),
                "—",
            ]
        )
    lines += _table(
        [
            "tokens",
            "direct p50 (ms)",
            f"{names[1]} added (ms)",
            f"{names[2]} added (ms)",
            "proxy added ÷ forwarder added",
        ],
        rows,
    )
    return lines


def _lost(streams: dict[int, Rounds], name: str) -> int:
    total = 0
    for rounds in streams.values():
        figures = rounds[name]
        total += int(sum(figures["short"]))
        total += int(sum(figures["streams"]) - sum(figures["done"]))
    return total


def _pass_through(r: Results) -> list[str]:
    names = r.names
    rows = [
        ["p50 (ms)", *(of(r.latency, n, "p50").show() for n in names)],
        ["p99 (ms)", *(of(r.latency, n, "p99").show() for n in names)],
        ["added p50 (ms)", "—", *(added(r.latency, n, "p50").show() for n in names[1:])],
        ["added p99 (ms)", "—", *(added(r.latency, n, "p99").show() for n in names[1:])],
        ["server CPU per request (ms)", *(of(r.latency, n, "cpu_ms").show() for n in names)],
        ["errors", *(f"{sum(r.latency[n]['errors']):.0f}" for n in names)],
    ]
    return _table(["", *names], rows)


def _apis(r: Results) -> list[str]:
    rows = []
    for path, rounds in r.apis.items():
        rows.append(
            [
                f"`POST /v1{path}`",
                of(rounds, DIRECT, "p50").show(),
                of(rounds, PROXY, "p50").show(),
                added(rounds, PROXY, "p50").show(),
                added(rounds, PROXY, "p99").show(),
                f"{sum(rounds[PROXY]['errors']):.0f}",
            ]
        )
    intro = (
        "A small Anthropic Messages and OpenAI Responses request (`tests/bench/passthrough.py`), "
        "under every trigger: the proxy maps it to the engine's conversation, finds nothing to "
        "do and forwards the client's bytes. LiteLLM is not measured here (it is set up for chat)."
    )
    head = ["endpoint", "direct p50 (ms)", "proxy p50 (ms)", "added p50", "added p99", "errors"]
    return [intro, "", *_table(head, rows)]


def _throughput(r: Results) -> list[str]:
    names = r.names
    rows = [
        ["best req/s with p99 ≤ 50 ms", *(of(r.throughput, n, "rps").show(0) for n in names)],
        ["at concurrency", *(of(r.throughput, n, "concurrency").show(0) for n in names)],
        ["p99 there (ms)", *(of(r.throughput, n, "p99").show(1) for n in names)],
        ["share of direct", "1", *(ratio(r.throughput, n, "rps").show(3) for n in names[1:])],
    ]
    return _table(["", *names], rows)


def _streaming(r: Results) -> list[str]:
    head = ["streams", "target", "TTFB (ms)", "added TTFB", "gap p50 (ms)", "added gap p50"]
    head += ["gap p99 (ms)", "added gap p99", "streams run", "frames (expected)", "[DONE]"]
    rows = []
    for level in LEVELS:
        rounds = r.streams[level]
        for name in r.names:
            figures = rounds[name]
            streams = sum(figures["streams"])
            is_direct = name == DIRECT
            rows.append(
                [
                    str(level),
                    name,
                    of(rounds, name, "ttfb").show(),
                    "—" if is_direct else added(rounds, name, "ttfb").show(),
                    of(rounds, name, "gap_p50").show(),
                    "—" if is_direct else added(rounds, name, "gap_p50").show(),
                    of(rounds, name, "gap_p99").show(),
                    "—" if is_direct else added(rounds, name, "gap_p99").show(),
                    f"{streams:.0f}",
                    f"{sum(figures['frames']):.0f} ({streams * CHUNKS:.0f})",
                    f"{sum(figures['done']):.0f}",
                ]
            )
    return _table(head, rows)


def _large(r: Results) -> list[str]:
    names = r.names
    lines = [
        f"**Under the trigger**: a {r.under_trigger_tokens:,}-token synthetic agent session to "
        "`gpt-4o` (128k window), the same body again and again (warm token cache; "
        "`x-compaction-stage: none` checked).",
        "",
        *_table(
            ["", *names],
            [
                ["p50 (ms)", *(of(r.under_trigger, n, "p50").show() for n in names)],
                [
                    "added p50 (ms)",
                    "—",
                    *(added(r.under_trigger, n, "p50").show() for n in names[1:]),
                ],
            ],
        ),
        f"**First compaction** of a conversation never seen before, {WINDOW // 1000}k window, "
        "extractive summarizer. In-process: `compaction.compact` with a fresh `TokenCounter` "
        "(cold) and then again with that counter (warm: what a proxy that saw the conversation "
        "grow has cached). Through the server: the whole request, and that minus the direct "
        "request with the same body (best of 3).",
        "",
    ]
    rows = [
        [
            f"{f.tokens:,}",
            f.cold.show(0),
            f.warm.show(0),
            f.server.show(0),
            f.server_added.show(0),
            ", ".join(sorted(set(f.stages))),
            f"{f.tokens_after:,}",
        ]
        for f in r.first
    ]
    lines += _table(
        [
            "tokens",
            "in-process cold (ms)",
            "in-process warm (ms)",
            "server (ms)",
            "server added (ms)",
            "x-compaction-stage",
            "tokens after",
        ],
        rows,
    )
    if r.corpus:
        lines += [
            f"**The corpus** (`../shared/fixtures`), each compacted in-process at a "
            f"{CORPUS_WINDOW // 1000}k window with a fresh `TokenCounter`, by size:",
            "",
            *_table(
                [
                    "tokens",
                    "conversations",
                    "compacted",
                    "median tokens",
                    "median (ms)",
                    "p90 (ms)",
                    "max (ms)",
                    "stages",
                ],
                [
                    [
                        b.label,
                        str(b.count),
                        str(b.compacted),
                        f"{b.median_tokens:,}",
                        f"{b.median_ms:.1f}",
                        f"{b.p90_ms:.1f}",
                        f"{b.max_ms:.1f}",
                        ", ".join(f"{k} {v}" for k, v in sorted(b.stages.items())),
                    ]
                    for b in r.corpus
                ],
            ),
        ]
    else:
        lines += ["**The corpus**: `../shared/fixtures` is absent here; skipped.", ""]
    return [*lines, *_growing(r)]


def _memory(r: Results) -> list[str]:
    m = r.memory
    rows = [
        ["idle, just started", _mib(m.idle_kib)],
        ["after its first request (token encoding loaded)", _mib(m.first_request_kib)],
        [
            f"after {m.requests:,} distinct requests ({m.request_errors} errors, "
            f"{m.requests_seconds:.0f} s)",
            _mib(m.after_requests_kib),
        ],
    ]
    if m.after_corpus_kib is not None:
        stages = ", ".join(f"{k} {v}" for k, v in sorted(m.corpus_stages.items()))
        rows.append(
            [
                f"after compacting all {m.corpus} corpus conversations at 16k ({stages}; "
                f"{m.corpus_errors} errors; median {m.corpus_median_ms:.0f} ms, "
                f"max {m.corpus_max_ms:.0f} ms per request)",
                _mib(m.after_corpus_kib),
            ]
        )
    lines = [
        "A fresh `compaction-proxy` process of its own (SQLite store in a temp file); "
        "VmRSS from /proc/<pid>/status.",
        "",
        *_table(["compaction-proxy", "RSS"], rows),
    ]
    if r.reading is not None:
        g = r.reading
        lines += [
            "**The reading cache** (`server.incremental_cache_mb`, least recently used "
            "conversations forgotten first): what it keeps for one conversation is its latest "
            "request's bytes and what was read from them.",
            "",
            *_table(
                ["", ""],
                [
                    [
                        f"one {g.tokens:,}-token conversation ({g.body_bytes / 1e6:.1f} MB of "
                        "JSON): bytes and parsed objects (tracemalloc)",
                        f"{g.held_bytes / 2**20:.1f} MiB",
                    ],
                    ["… as the cache's bound counts it", f"{g.estimate_bytes / 2**20:.1f} MiB"],
                    *(
                        [
                            [
                                "the measured proxy's RSS before / after the growing sessions "
                                "(their readings held)",
                                f"{_mib(r.growing_rss[0])} / {_mib(r.growing_rss[1])}",
                            ]
                        ]
                        if r.growing_rss is not None
                        else []
                    ),
                ],
            ),
        ]
    if r.rss:
        lines += [
            "The processes of the rig above, for comparison:",
            "",
            *_table(
                ["process", "RSS idle", "RSS after sections 1–4"],
                [[n, _mib(a), _mib(b)] for n, (a, b) in r.rss.items()],
            ),
        ]
    return lines


def _profiles(r: Results) -> list[str]:
    lines = [
        "A separate proxy process under cProfile on the CPU clock of its main thread "
        "(`tests/bench/profiling.py`), warmed up first. cProfile's overhead inflates "
        "call-heavy code, so CPU per request here is higher than in section 1; the shares "
        "say where to look.",
        "",
    ]
    for p in r.profiles:
        lines += [
            f"**{p.label}** — {p.requests} requests, {p.cpu_ms_per_request:.2f} ms "
            "profiled CPU per request.",
            "",
            *_table(
                [
                    "the project's functions (cumulative)",
                    "share",
                    "self time by package",
                    "share",
                ],
                [
                    [
                        f"`{own.function}`" if own else "",
                        f"{own.share:.0%}" if own else "",
                        hot.function if hot else "",
                        f"{hot.share:.0%}" if hot else "",
                    ]
                    for own, hot in _pairs(p)
                ],
            ),
        ]
    return lines


def _pairs(p: Profile) -> list[tuple[object, object]]:
    size = max(len(p.own), len(p.packages))
    own = [*p.own, *[None] * (size - len(p.own))]
    hot = [*p.packages, *[None] * (size - len(p.packages))]
    return list(zip(own, hot, strict=True))


def _clients(r: Results) -> list[str]:
    rows = [
        [
            c.name,
            f"{c.cpu_ms:.3f} ({c.cpu_range[0]:.3f}–{c.cpu_range[1]:.3f})",
            f"{c.wall_ms:.3f}",
        ]
        for c in r.clients
    ]
    return [
        f"{clients.REQUESTS} sequential small chat POSTs from the bench process to the "
        "upstream, answers read whole (`tests/bench/clients.py`). The proxy pays this on "
        "every relayed request; `compaction-proxy Transport` is aiohttp with the proxy's "
        "guards.",
        "",
        *_table(["client", "CPU ms per request", "wall ms per request"], rows),
    ]


def render(r: Results) -> str:
    lines = [
        "# Benchmark results",
        "",
        "Written by the bench (`make bench`); do not edit by hand. Every figure is a median "
        "over rounds with the range of the rounds in parentheses; *added* is a proxy's "
        "figure minus the direct connection's figure of the same round.",
        "",
        "## Machine and method",
        "",
        *_table(["", ""], [*r.machine, *r.method]),
        "## Targets",
        "",
        *_table(
            ["figure", "target", "compaction-proxy", "verdict"],
            [[c.figure, c.target, c.value, verdict(c.met)] for c in checks(r)],
        ),
    ]
    if r.notes:
        lines += ["Notes:", "", *(f"* {note}" for note in r.notes), ""]
    if r.clients:
        lines += ["## 0. The upstream HTTP client", "", *_clients(r)]
    lines += ["## 1. Pass-through overhead, concurrency 1", "", *_pass_through(r)]
    if r.apis:
        lines += ["## 1b. The other compacted APIs, concurrency 1", "", *_apis(r)]
    lines += ["## 2. Throughput, one worker, p99 ≤ 50 ms", "", *_throughput(r)]
    lines += [
        f"## 3. Streaming ({CHUNKS} frames 20 ms apart, then `[DONE]`)",
        "",
        *_streaming(r),
    ]
    lines += ["## 4. Large conversations", "", *_large(r)]
    lines += ["## 5. Memory", "", *_memory(r)]
    if r.dashboard is not None:
        lines += dashboard.render(r.dashboard)
    if r.background is not None:
        lines += ["## 7. Compactions prepared in the background", ""]
        lines += [*background.report(r.background), ""]
    if r.recall is not None:
        lines += ["## 8. Recall", "", *recall.report(r.recall), ""]
    if r.profiles:
        lines += ["## Where the proxy's CPU goes", "", *_profiles(r)]
    return "\n".join(lines).rstrip() + "\n"
