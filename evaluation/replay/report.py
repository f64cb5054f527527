"""The replay's figures: one row per window × price preset × strategy.

From a :class:`~evaluation.replay.run.Run`'s calls, priced with the preset::

    cost            Σ call cost ÷ the unlimited baseline's (same window, preset)
    compactions     proxy: chat calls whose x-compaction-stage is not none/reused;
                    a baseline: calls whose prompt is not the previous one plus
                    the new turns (a rewrite: truncation again, a new mask, a summary)
    breaks          chat calls that read less from the cache than the previous
                    one sent; "between" = those not on a compaction
    summary share   Σ summary-call cost ÷ Σ cost
    summaries       summary calls, and of those, prompts the session asked before
    not used        summary calls whose reply no later prompt of the session
                    carried, by kind (a span's summary on the request's path,
                    a turn prefix's note, one prepared in the background); the
                    compactions none of whose calls was used, and the most of
                    those in one session
    gap             steps between two compactions of one session: median, p10, p90
    fill            a compaction's prompt tokens ÷ the input limit L: mean,
                    median, p10, p90
    over L          chat calls whose prompt was above L
    facts           Σ kept ÷ Σ facts; "+ ref" adds those reachable by a ref sent

Pure functions over plain data: :func:`rows` computes, :func:`markdown` and
:func:`as_json` print.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from evaluation.replay.baselines import input_limit
from evaluation.replay.records import Call
from evaluation.replay.run import Run, prices_of

#: Stages of the proxy's answers that did not change what it sends.
_NOT_COMPACTED = ("none", "reused", "")


@dataclass(frozen=True)
class Row:
    window: int
    prices: str
    strategy: str
    sessions: int
    requests: int
    cost: float  #: in plain input tokens
    relative_cost: float  #: ÷ the unlimited baseline's
    compactions: int
    breaks: int
    breaks_between: int
    summary_share: float
    summaries: int
    repeated_summaries: int
    median_gap: float | None
    fill: float | None  #: the mean
    gap_spread: Spread | None
    fill_spread: Spread | None
    unused: Unused
    over_limit: int
    facts: int
    facts_kept: float | None
    facts_reachable: float | None
    failures: int
    summary_fallbacks: int
    seconds: float


@dataclass(frozen=True)
class Spread:
    """The median and the 10th and 90th percentiles of some figures."""

    median: float
    p10: float
    p90: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        if len(values) == 1:
            return cls(values[0], values[0], values[0])
        cuts = statistics.quantiles(values, n=10, method="inclusive")
        return cls(statistics.median(values), cuts[0], cuts[-1])


@dataclass(frozen=True)
class Unused:
    """Summary calls whose reply never reached the model, by kind, and the
    compactions they were made for.

    One compaction may ask two calls (the span's summary and the note of the
    turn it cuts into): the calls of a session asked after the same chat call,
    on a request's path or in the background, are one compaction's. A
    compaction is unused when none of its calls was."""

    main: int = 0  #: a span's summary asked on a request's path
    turn_prefix: int = 0  #: a turn prefix's note
    background: int = 0  #: a summary prepared ahead of need
    compactions: int = 0  #: compactions whose summaries were all unused
    most_in_a_session: int = 0  #: of those compactions, the most in one session

    @property
    def total(self) -> int:
        return self.main + self.turn_prefix + self.background

    @classmethod
    def of(cls, calls: Sequence[Call]) -> Unused:
        """From a run's calls, in the order they came."""
        chats: Counter[str] = Counter()
        made: dict[tuple[str, int, bool], bool] = {}  # a compaction's calls: any used?
        for call in calls:
            if call.kind == "chat":
                chats[call.session] += 1
                continue
            key = (call.session, chats[call.session], call.background)
            made[key] = made.get(key, False) or call.used
        unused = [c for c in calls if c.kind == "summary" and not c.used]
        wasted = Counter(session for (session, _, _), used in made.items() if not used)
        return cls(
            main=sum(1 for c in unused if not c.background and c.summary_kind != "turn-prefix"),
            turn_prefix=sum(
                1 for c in unused if not c.background and c.summary_kind == "turn-prefix"
            ),
            background=sum(1 for c in unused if c.background),
            compactions=sum(wasted.values()),
            most_in_a_session=max(wasted.values(), default=0),
        )


def compacted(call: Call) -> bool:
    return call.kind == "chat" and call.stage not in _NOT_COMPACTED


def row(run: Run, prices: str, unlimited: float | None) -> Row:
    """The figures of ``run`` priced with the preset ``prices``."""
    price = prices_of(prices)
    chats = [c for c in run.calls if c.kind == "chat"]
    summaries = [c for c in run.calls if c.kind == "summary"]
    cost = sum(c.cost(price) for c in run.calls)
    limit = input_limit(run.window)
    compactions = [c for c in chats if compacted(c)]
    gaps: list[int] = []
    by_session: dict[str, list[int]] = defaultdict(list)
    for call in compactions:
        by_session[call.session].append(call.step)
    for steps in by_session.values():
        ordered = sorted(set(steps))
        gaps.extend(b - a for a, b in itertools.pairwise(ordered))
    scored = [c.facts for c in chats if c.facts is not None]
    total = sum(f.total for f in scored)
    kept = sum(f.kept for f in scored)
    reachable = sum(f.reachable for f in scored)
    return Row(
        window=run.window,
        prices=prices,
        strategy=run.strategy,
        sessions=len({c.session for c in chats}),
        requests=len(chats),
        cost=cost,
        relative_cost=cost / unlimited if unlimited else float("nan"),
        compactions=len(compactions),
        breaks=sum(1 for c in chats if c.broke),
        breaks_between=sum(1 for c in chats if c.broke and not compacted(c)),
        summary_share=sum(c.cost(price) for c in summaries) / cost if cost else 0.0,
        summaries=len(summaries),
        repeated_summaries=sum(1 for c in summaries if c.repeat),
        median_gap=statistics.median(gaps) if gaps else None,
        fill=statistics.fmean(c.tokens for c in compactions) / limit if compactions else None,
        gap_spread=Spread.of(gaps),
        fill_spread=Spread.of([c.tokens / limit for c in compactions]),
        unused=Unused.of(run.calls),
        over_limit=sum(1 for c in chats if c.tokens > limit),
        facts=total,
        facts_kept=kept / total if total else None,
        facts_reachable=(kept + reachable) / total if total else None,
        failures=len(run.failures),
        summary_fallbacks=run.summary_fallbacks,
        seconds=run.seconds,
    )


def rows(runs: Sequence[Run], presets: Sequence[str]) -> list[Row]:
    """Every run priced with every preset it applies to, unlimited first in each group."""
    out: list[Row] = []
    for window in dict.fromkeys(r.window for r in runs):
        for preset in presets:
            lifetime = prices_of(preset).cache_lifetime
            mine = [
                r
                for r in runs
                if r.window == window
                and (r.prices == preset or (r.prices is None and r.lifetime == lifetime))
            ]
            reference = next((r for r in mine if r.strategy == "unlimited"), None)
            unlimited = (
                sum(c.cost(prices_of(preset)) for c in reference.calls) if reference else None
            )
            out.extend(row(r, preset, unlimited) for r in mine)
    return out


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _spread(spread: Spread | None, digits: int) -> str:
    if spread is None:
        return "—"
    return f"{spread.median:.{digits}f} ({spread.p10:.{digits}f}–{spread.p90:.{digits}f})"


def markdown(table: Sequence[Row]) -> str:
    head = (
        "| window | prices | strategy | cost ÷ unlimited | compactions | prefix breaks "
        "(between) | summary cost % | summaries (repeated) | "
        "not used: calls / compactions (most in a session) | "
        "turns between, median (p10–p90) | fill after, median (p10–p90) | over L | "
        "facts kept % | + by ref % |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in table:
        lines.append(
            f"| {r.window:,} | {r.prices} | {r.strategy} | {r.relative_cost:.3f} | "
            f"{r.compactions:,} | {r.breaks:,} ({r.breaks_between:,}) | "
            f"{_pct(r.summary_share)} | {r.summaries:,} ({r.repeated_summaries:,}) | "
            f"{r.unused.total:,} / {r.unused.compactions:,} ({r.unused.most_in_a_session:,}) | "
            f"{_spread(r.gap_spread, 1)} | {_spread(r.fill_spread, 2)} | {r.over_limit:,} | "
            f"{_pct(r.facts_kept)} | {_pct(r.facts_reachable)} |"
        )
    return "\n".join(lines)


def unused_lines(table: Sequence[Row]) -> list[str]:
    """Where the unused summaries of each row came from, for the rows with any."""
    return [
        f"{r.window:,} {r.strategy} {r.prices}: {r.unused.total} summary calls not used "
        f"({r.unused.main} on a request's path, {r.unused.turn_prefix} turn-prefix notes, "
        f"{r.unused.background} prepared ahead), for {r.unused.compactions} compactions; "
        f"at most {r.unused.most_in_a_session} such compactions in one session"
        for r in table
        if r.unused.total
    ]


def as_json(table: Sequence[Row]) -> list[dict[str, object]]:
    return [asdict(r) for r in table]
