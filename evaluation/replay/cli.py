"""``compaction-proxy eval --replay``: the command-line side of the replay benchmark.

    compaction-proxy eval --replay [--fixtures DIR] [--window N …] [--prices P,P]
                                   [--summarizer extractive|llm|llm-always …] [--limit N]
                                   [--session GLOB …] [--turn-gap S] [--concurrency N]
                                   [--synthetic N] [--json] [--output PATH]

Defaults: the fixtures at ``../shared/fixtures`` (mini-swe-agent, swe-agent and
every fifth tau-bench dialogue), windows 8192, 16384 and 32768, both price
presets, both summarizers, 30 s between turns, and a 200k window over
``--synthetic`` (2) long sessions of the project's own generator (left out,
with a line saying so, where the generator cannot be imported).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from compaction import load_encoding
from evaluation.replay.baselines import BASELINES, input_limit
from evaluation.replay.cache import SegmentTokens
from evaluation.replay.report import Row, as_json, markdown, rows, unused_lines
from evaluation.replay.run import (
    DEFAULT_CONCURRENCY,
    DEFAULT_GAP,
    DEFAULT_PRICES,
    DEFAULT_WINDOWS,
    SUMMARIZERS,
    Options,
    Run,
    prices_of,
    replay,
)
from evaluation.replay.sessions import (
    DEFAULT_SETS,
    TAU_STRIDE,
    Session,
    SyntheticUnavailable,
    load_sessions,
    synthetic_sessions,
)

DEFAULT_FIXTURES = Path("../shared/fixtures")
SYNTHETIC_WINDOW = 200_000
DEFAULT_SYNTHETIC = 2


class ReplayUsageError(Exception):
    """Bad options: the command exits 2 with this message."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy eval --replay",
        description="Replay agent sessions turn by turn through a real proxy in front of a "
        "simulated prompt cache, and price them against baselines.",
    )
    parser.add_argument("--replay", action="store_true", help="(selects this benchmark)")
    parser.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES, metavar="DIR")
    parser.add_argument(
        "--set", action="append", metavar="NAME", help="fixture folder (repeatable)"
    )
    parser.add_argument("--window", type=int, action="append", metavar="N", help="(repeatable)")
    parser.add_argument("--prices", default=",".join(DEFAULT_PRICES), metavar="P,P")
    parser.add_argument("--summarizer", action="append", choices=SUMMARIZERS, help="(repeatable)")
    parser.add_argument(
        "--baseline", action="append", choices=tuple(BASELINES), help="(repeatable)"
    )
    parser.add_argument("--limit", type=int, metavar="N", help="at most N sessions")
    parser.add_argument("--session", action="append", metavar="GLOB", help="names to replay")
    parser.add_argument("--tau-stride", type=int, default=TAU_STRIDE, metavar="N")
    parser.add_argument("--turn-gap", type=float, default=DEFAULT_GAP, metavar="S")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="N")
    parser.add_argument(
        "--synthetic",
        type=int,
        metavar="N",
        help=f"long generated sessions at a 200k window (default {DEFAULT_SYNTHETIC}; 0: none)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--output", metavar="PATH", help="also write the report here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def _options(args: argparse.Namespace) -> Options:
    prices = tuple(p.strip() for p in args.prices.split(",") if p.strip())
    try:
        for name in prices:
            prices_of(name)
    except ValueError as exc:
        raise ReplayUsageError(str(exc)) from exc
    windows = tuple(args.window or DEFAULT_WINDOWS)
    if not prices or any(w < 1024 for w in windows) or args.turn_gap < 0:
        raise ReplayUsageError("--prices needs a preset, --window ≥ 1024, --turn-gap ≥ 0")
    return Options(
        windows=windows,
        prices=prices,
        summarizers=tuple(args.summarizer or SUMMARIZERS),
        baselines=tuple(dict.fromkeys(["unlimited", *(args.baseline or BASELINES)])),
        gap=args.turn_gap,
        concurrency=args.concurrency,
    )


async def run_replay(argv: Sequence[str]) -> str:
    """The report the command prints, for its options ``argv``."""
    args = build_parser().parse_args(argv)
    options = _options(args)
    if not args.fixtures.is_dir():
        raise ReplayUsageError(f"not a folder: {args.fixtures}")
    sessions = load_sessions(
        args.fixtures,
        sets=tuple(args.set or DEFAULT_SETS),
        patterns=tuple(args.session or ()),
        tau_stride=max(1, args.tau_stride),
        limit=args.limit,
    )
    if not sessions:
        raise ReplayUsageError(f"no session to replay under {args.fixtures}")
    encoding = load_encoding("o200k_base")
    if encoding is None:
        raise ReplayUsageError("the o200k_base encoding is not available offline")
    tokens = SegmentTokens(encoding)
    started = time.perf_counter()
    say = None if args.quiet else _progress
    runs = await replay(sessions, options, tokens, say)
    synthetic: list[Session] = []
    count = DEFAULT_SYNTHETIC if args.synthetic is None else args.synthetic
    if count > 0:
        try:
            synthetic = synthetic_sessions(count)
        except SyntheticUnavailable as exc:
            if args.synthetic is not None:
                raise ReplayUsageError(str(exc)) from exc
            _progress(f"no synthetic sessions: {exc}")
    if synthetic:
        wide = dataclasses.replace(options, windows=(SYNTHETIC_WINDOW,))
        runs += await replay(synthetic, wide, tokens, say)
    elapsed = time.perf_counter() - started
    table = rows(runs, options.prices)
    if args.json:
        text = orjson.dumps(
            {
                "sessions": [s.name for s in [*sessions, *synthetic]],
                "seconds": elapsed,
                "rows": as_json(table),
            },
            option=orjson.OPT_INDENT_2,
        ).decode()
    else:
        text = _text(sessions, synthetic, runs, table, options, elapsed)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return text


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _text(
    sessions: Sequence[Session],
    synthetic: Sequence[Session],
    runs: Sequence[Run],
    table: Sequence[Row],
    options: Options,
    elapsed: float,
) -> str:
    turns = sum(len(s.cuts) for s in sessions)
    limits = ", ".join(f"{w:,} → L {input_limit(w):,}" for w in options.windows)
    lines = [
        f"Replayed {len(sessions)} sessions ({turns:,} turns each run) in {elapsed:.0f} s; "
        f"windows {limits}; {options.gap:g} s between turns.",
    ]
    if synthetic:
        lines.append(f"Plus {len(synthetic)} synthetic sessions at {SYNTHETIC_WINDOW:,}.")
    lines += ["", markdown(table)]
    notes = [
        f"{r.window:,} {r.strategy} {r.prices}: {len(r.failures)} answers not 200 "
        f"(first: {r.failures[0]})"
        for r in runs
        if r.failures
    ]
    notes += [
        f"{r.window:,} {r.strategy} {r.prices}: {r.summary_fallbacks} llm summaries refused "
        "by the proxy's checks (extractive used)"
        for r in runs
        if r.summary_fallbacks
    ]
    notes += unused_lines(table)
    skipped = {r.window: r.skipped for r in runs if r.skipped}
    notes += [
        f"{window:,}: {count} sessions left out (their head alone is above the input limit)"
        for window, count in skipped.items()
    ]
    notes += [
        f"{r.window:,} {r.strategy} {r.prices}: {r.refused} calls the upstream refused"
        for r in runs
        if r.refused
    ]
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines)
