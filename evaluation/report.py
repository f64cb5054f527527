"""The eval's figures as a Markdown table and as JSON.

Scores are the share of probes found (micro-averaged over the compacted
bodies); ``all`` is over every probe of the cell. Tokens are means over the
compacted bodies; summarizer tokens (prompt + reply, our estimate) are the
sum, and stay 0 for the extractive summarizer, which calls no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evaluation.probes import KINDS
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


def report_json(cells: Sequence[Cell], judged: bool = False) -> dict[str, Any]:
    return {"cells": [cell_json(cell, judged) for cell in cells]}


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def report_table(cells: Sequence[Cell], judged: bool = False) -> str:
    """One row per strategy and window; scores in percent of probes found."""
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
    return "\n".join(rows)
