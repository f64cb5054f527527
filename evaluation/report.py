"""The eval's figures as a Markdown table and as JSON.

Scores are the share of probes found (micro-averaged over the compacted
bodies); ``all`` is over every probe of the cell. Tokens are means over the
compacted bodies; summarizer tokens (prompt + reply, our estimate) are the
sum, and stay 0 for the extractive summarizer, which calls no model.

The facts drawn by the eval's own rules (:mod:`evaluation.facts`) have a
table of their own: the share of touched paths, of the last five distinct
error lines and of the user's typed messages the compacted requests still
hold, with the mean tokens after, of the summaries, and of their ledger
blocks (:func:`evaluation.run.ledger_text`; "pending" while no summary
holds one).

With a :class:`~evaluation.repeats.RepeatReport`, a second table gives the
natural repeat rate: the share of tool calls that repeat an earlier call of
their conversation with no compaction at all, the baseline of the proxy's
re-read counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evaluation.facts import ERROR_CHARS, FACT_KINDS, TYPED_CHARS
from evaluation.probes import KINDS
from evaluation.repeats import RepeatReport, Repeats
from evaluation.run import Cell, Tally


def _share(tally: Tally) -> float | None:
    return None if tally.score is None else round(tally.score, 4)


def cell_json(cell: Cell, judged: bool) -> dict[str, Any]:
    mean = (lambda n: round(n / cell.compacted)) if cell.compacted else (lambda n: None)
    out: dict[str, Any] = {
        "strategy": cell.strategy,
        "window": cell.window,
        "bodies": cell.bodies,
        "compacted": cell.compacted,
        "cannot_fit": cell.cannot_fit,
        "stages": dict(sorted(cell.stages.items())),
        "tokens_before_mean": mean(cell.tokens_before),
        "tokens_after_mean": mean(cell.tokens_after),
        "summarizer_calls": cell.summarizer_calls,
        "summarizer_tokens": cell.summarizer_tokens,
        "scores": {kind: _share(cell.presence[kind]) for kind in KINDS},
        "probes": {kind: cell.presence[kind].total for kind in KINDS},
        "all": _share(cell.overall(cell.presence)),
        "facts": {kind: _share(cell.facts[kind]) for kind in FACT_KINDS},
        "fact_counts": {kind: cell.facts[kind].total for kind in FACT_KINDS},
        "summary_tokens_mean": mean(cell.summary_tokens),
        "ledgers": cell.ledgers,
        "ledger_tokens_mean": (round(cell.ledger_tokens / cell.ledgers) if cell.ledgers else None),
    }
    if judged:
        out["judge_scores"] = {kind: _share(cell.judged[kind]) for kind in KINDS}
        out["judge_all"] = _share(cell.overall(cell.judged))
    return out


def repeats_json(repeats: Repeats) -> dict[str, Any]:
    return {
        "conversations": repeats.bodies,
        "calls": repeats.calls,
        "repeats": repeats.repeats,
        "rate": None if repeats.rate is None else round(repeats.rate, 4),
        "by_tool": repeats.by_tool,
    }


def report_json(
    cells: Sequence[Cell], judged: bool = False, repeats: RepeatReport | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"cells": [cell_json(cell, judged) for cell in cells]}
    if repeats is not None:
        out["repeats"] = {
            **repeats_json(repeats.total),
            "by_source": {name: repeats_json(r) for name, r in repeats.by_source.items()},
        }
    return out


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def report_table(
    cells: Sequence[Cell], judged: bool = False, repeats: RepeatReport | None = None
) -> str:
    """One row per strategy and window; scores in percent of probes found.
    Then, with ``repeats``, the natural repeat rate (:func:`repeats_table`)."""
    head = ["strategy", "window", "compacted", *KINDS, "all", "tokens after", "summarizer tokens"]
    if judged:
        head += [f"judge {kind}" for kind in KINDS] + ["judge all"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in cells:
        data = cell_json(cell, judged)
        row = [
            data["strategy"],
            f"{cell.window:,}",
            f"{cell.compacted}/{cell.bodies}",
            *(_percent(data["scores"][kind]) for kind in KINDS),
            _percent(data["all"]),
            "—" if data["tokens_after_mean"] is None else f"{data['tokens_after_mean']:,}",
            f"{cell.summarizer_tokens:,}",
        ]
        if judged:
            row += [_percent(data["judge_scores"][kind]) for kind in KINDS]
            row.append(_percent(data["judge_all"]))
        rows.append("| " + " | ".join(row) + " |")
    table = "\n".join(rows) + "\n\n" + facts_table(cells)
    return table if repeats is None else table + "\n\n" + repeats_table(repeats)


def _tokens(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def facts_table(cells: Sequence[Cell]) -> str:
    """Per strategy and window: the facts of :mod:`evaluation.facts` kept, and tokens."""
    rows = [
        "Facts drawn by the eval's own rules (evaluation/facts.py), in percent of those of "
        f"the compacted conversations: every touched path; the last five distinct error "
        f"lines (the whole line, or its first {ERROR_CHARS} characters); every message the "
        f"user typed (the whole message, or its first {TYPED_CHARS} characters). Tokens are "
        "means over the compacted requests.",
        "",
        "| strategy | window | compacted | paths | last errors | user typed "
        "| tokens after | summary tokens | ledger tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        data = cell_json(cell, judged=False)
        facts, counts = data["facts"], data["fact_counts"]
        ledger = (
            "pending (no ledger block)"
            if data["ledger_tokens_mean"] is None
            else f"{data['ledger_tokens_mean']:,} ({cell.ledgers})"
        )
        row = [
            data["strategy"],
            f"{cell.window:,}",
            f"{cell.compacted}/{cell.bodies}",
            *(f"{_percent(facts[kind])} of {counts[kind]}" for kind in FACT_KINDS),
            _tokens(data["tokens_after_mean"]),
            _tokens(data["summary_tokens_mean"]),
            ledger,
        ]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def repeats_table(repeats: RepeatReport) -> str:
    """Tool calls repeating an earlier call, with no compaction: all, then by source."""
    rows = [
        "Tool calls that repeat an earlier call of their conversation (the same tool and "
        "arguments, or a read of a file already read), with no compaction: the baseline "
        "of `compaction_proxy_rereads_total`.",
        "",
        "| source | conversations | tool calls | repeats | % of calls |",
        "|---|---|---|---|---|",
    ]
    for name, found in (("all", repeats.total), *repeats.by_source.items()):
        row = [name, str(found.bodies), f"{found.calls:,}", f"{found.repeats:,}"]
        rows.append("| " + " | ".join([*row, _percent(found.rate)]) + " |")
    return "\n".join(rows)
