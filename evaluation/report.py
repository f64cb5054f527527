"""The eval's figures as a Markdown table and as JSON.

Scores are the share of probes found (micro-averaged over the compacted
bodies); ``all`` is over every probe of the cell. Tokens are means over the
compacted bodies; summarizer tokens (prompt + reply, our estimate) are the
sum, and stay 0 for the extractive summarizer, which calls no model.

With a :class:`~evaluation.repeats.RepeatReport`, a second table gives the
natural repeat rate: the share of tool calls that repeat an earlier call of
their conversation with no compaction at all, the baseline of the proxy's
re-read counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
    table = "\n".join(rows)
    return table if repeats is None else table + "\n\n" + repeats_table(repeats)


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
