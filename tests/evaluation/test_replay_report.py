"""The replay's figures (evaluation/replay/report.py): spreads and unused summaries."""

from __future__ import annotations

import dataclasses

import pytest

from evaluation.replay.baselines import input_limit
from evaluation.replay.records import Call
from evaluation.replay.report import Spread, Unused, markdown, row, unused_lines
from evaluation.replay.run import Run

WINDOW = 8_192


def chat(session: str, step: int, tokens: int, stage: str = "none") -> Call:
    return Call(session, "chat", step + 2, step, step * 30.0, tokens, 0, 10, stage=stage)


def summary(session: str, *, used: bool, background: bool = False, prefix: bool = False) -> Call:
    return Call(
        session,
        "summary",
        -1,
        -1,
        0.0,
        100,
        0,
        20,
        summary_kind="turn-prefix" if prefix else "main",
        background=background,
        used=used,
    )


def test_the_spread_is_the_median_and_the_tenth_and_ninetieth_percentiles() -> None:
    spread = Spread.of([float(n) for n in range(1, 12)])
    assert spread == Spread(6.0, 2.0, 10.0)
    assert Spread.of([3.0]) == Spread(3.0, 3.0, 3.0)
    assert Spread.of([]) is None


def test_the_row_reports_the_fill_after_and_the_turns_between_compactions() -> None:
    limit = input_limit(WINDOW)
    calls = [
        chat("a", 0, 1_000),
        chat("a", 1, limit // 2, "condensed"),
        chat("a", 2, limit // 2 + 100),
        chat("a", 5, limit // 4, "condensed"),
        chat("b", 3, limit, "pruned"),
    ]
    figures = row(
        Run(WINDOW, "proxy (extractive)", "anthropic", 300.0, tuple(calls)), "anthropic", 1.0
    )
    assert figures.gap_spread == Spread(4.0, 4.0, 4.0)
    assert figures.fill_spread is not None
    assert figures.fill_spread.median == pytest.approx(0.5, abs=1e-3)
    assert figures.fill_spread.p10 < 0.5 < figures.fill_spread.p90
    assert "| 4.0 (4.0–4.0) | 0.50 (" in markdown([figures])


def test_unused_summaries_are_counted_by_kind_and_by_compaction() -> None:
    calls = [
        chat("a", 0, 10),
        summary("a", used=True),  # a compaction on the request's path, used
        summary("a", used=False, background=True, prefix=True),  # a preparation, unused:
        summary("a", used=False, background=True),  # its two calls are one compaction
        chat("a", 1, 10),
        summary("a", used=False),  # refused, on the request's path
        summary("b", used=False, prefix=True),
        summary("b", used=True),  # the same compaction's other call was used
        chat("b", 0, 10),
        summary("b", used=True, background=True),
    ]
    unused = Unused.of(calls)
    assert unused == Unused(main=1, turn_prefix=1, background=2, compactions=2, most_in_a_session=2)
    assert unused.total == 4
    figures = row(Run(WINDOW, "proxy (llm)", "anthropic", 300.0, tuple(calls)), "anthropic", 1.0)
    assert figures.unused == unused
    assert "| 7 (0) | 4 / 2 (2) |" in markdown([figures])
    assert unused_lines([figures]) == [
        "8,192 proxy (llm) anthropic: 4 summary calls not used (1 on a request's path, "
        "1 turn-prefix notes, 2 prepared ahead), for 2 compactions; "
        "at most 2 such compactions in one session"
    ]
    assert unused_lines([dataclasses.replace(figures, unused=Unused())]) == []
