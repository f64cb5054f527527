"""Small inline SVG charts: pure functions from numbers to markup.

No script and no library: a polyline per series (with a legend when there are
several), a few labelled rules, and circles with a ``<title>`` (the browser
shows it on hover). Every text is escaped here.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

WIDTH: Final = 900
HEIGHT: Final = 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 16, 28


@dataclass(frozen=True)
class Rule:
    """A horizontal line across the chart (a trigger, a limit)."""

    label: str
    value: float
    css: str


@dataclass(frozen=True)
class Series:
    """One line of the chart: its legend, its points (x: wall-clock seconds,
    y: tokens) and its class (the colour, in style.css)."""

    label: str
    points: Sequence[tuple[float, float]]
    css: str = "series"


@dataclass(frozen=True)
class Mark:
    """A point to call out (a compaction), with the text shown on hover."""

    x: float
    y: float
    title: str


def tokens(value: float) -> str:
    """``123456`` → ``123k``: axis labels stay short."""
    if abs(value) >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if abs(value) >= 1_000:
        return f"{value / 1_000:.0f}k"
    return f"{value:.0f}"


def _clock(moment: float) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(moment))


def line_chart(
    series: Sequence[Series],
    *,
    label: str,
    rules: Sequence[Rule] = (),
    marks: Sequence[Mark] = (),
) -> str:
    """An SVG line chart of ``series``, on one time axis and one token axis."""
    points = [point for line in series for point in line.points]
    if not points:
        return '<p class="empty">No requests recorded yet.</p>'
    xs = [x for x, _ in points]
    low_x, high_x = min(xs), max(xs)
    high_y = max([y for _, y in points] + [rule.value for rule in rules] + [1.0]) * 1.08
    span_x = (high_x - low_x) or 1.0
    inner_w, inner_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM

    def sx(x: float) -> float:
        return _LEFT + (x - low_x) / span_x * inner_w if high_x > low_x else _LEFT + inner_w / 2

    def sy(y: float) -> float:
        return _TOP + inner_h - y / high_y * inner_h

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{html.escape(label)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{html.escape(label)}</title>",
    ]
    for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
        value = high_y / 1.08 * fraction
        y = sy(value)
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{tokens(value)}</text>"
        )
    ends = ((low_x, "start"), (high_x, "end")) if _clock(low_x) != _clock(high_x) else ()
    for x, anchor in ends or ((low_x, "start"),):
        parts.append(
            f'<text class="axis" x="{sx(x):.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">'
            f"{html.escape(_clock(x))}</text>"
        )
    for number, rule in enumerate(rules):
        y = sy(rule.value)
        # Labels alternate right and left: a trigger close to the limit stays legible.
        x, anchor = (WIDTH - _RIGHT - 4, "end") if number % 2 == 0 else (_LEFT + 4, "start")
        parts.append(
            f'<line class="rule {html.escape(rule.css)}" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" '
            f'y1="{y:.1f}" y2="{y:.1f}"/><text class="rule-label {html.escape(rule.css)}" '
            f'x="{x}" y="{y - 4:.1f}" text-anchor="{anchor}">'
            f"{html.escape(rule.label)} {tokens(rule.value)}</text>"
        )
    for line in series:
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line.points)
        parts.append(f'<polyline class="{html.escape(line.css)}" points="{path}"/>')
    if len(series) > 1:
        for number, line in enumerate(series):
            y = _TOP + 6 + 16 * number
            parts.append(
                f'<line class="key {html.escape(line.css)}" x1="{_LEFT + 10}" '
                f'x2="{_LEFT + 34}" y1="{y}" y2="{y}"/><text class="legend" '
                f'x="{_LEFT + 40}" y="{y + 4}">{html.escape(line.label)}</text>'
            )
    for mark in marks:
        parts.append(
            f'<circle class="mark" cx="{sx(mark.x):.1f}" cy="{sy(mark.y):.1f}" r="5">'
            f"<title>{html.escape(mark.title)}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)
