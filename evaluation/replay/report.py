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
    median gap      median steps between two compactions of one session
    fill            mean prompt tokens of a compaction ÷ the input limit L
    over L          chat calls whose prompt was above L
    facts           Σ kept ÷ Σ facts; "+ ref" adds those reachable by a ref sent

Pure functions over plain data: :func:`rows` computes, :func:`markdown` and
:func:`as_json` print.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
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
    fill: float | None
    over_limit: int
    facts: int
    facts_kept: float | None
    facts_reachable: float | None
    failures: int
    summary_fallbacks: int
    seconds: float


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


def markdown(table: Sequence[Row]) -> str:
    head = (
        "| window | prices | strategy | cost ÷ unlimited | compactions | prefix breaks "
        "(between) | summary cost % | summaries (repeated) | median turns between | "
        "fill after | over L | facts kept % | + by ref % |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in table:
        lines.append(
            f"| {r.window:,} | {r.prices} | {r.strategy} | {r.relative_cost:.3f} | "
            f"{r.compactions:,} | {r.breaks:,} ({r.breaks_between:,}) | "
            f"{_pct(r.summary_share)} | {r.summaries:,} ({r.repeated_summaries:,}) | "
            f"{_num(r.median_gap)} | {_num(r.fill, 2)} | {r.over_limit:,} | "
            f"{_pct(r.facts_kept)} | {_pct(r.facts_reachable)} |"
        )
    return "\n".join(lines)


def as_json(table: Sequence[Row]) -> list[dict[str, object]]:
    return [asdict(r) for r in table]
