"""Percentiles, medians of round medians, and how figures are printed."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0–1) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Spread:
    """The median of per-round figures and the range they spanned."""

    median: float
    low: float
    high: float

    def show(self, digits: int = 2, unit: str = "") -> str:
        if math.isnan(self.median):
            return "—"
        if self.low == self.high:
            return f"{self.median:.{digits}f}{unit}"
        return f"{self.median:.{digits}f}{unit} ({self.low:.{digits}f} – {self.high:.{digits}f})"


def spread(values: Sequence[float]) -> Spread:
    kept = [v for v in values if not math.isnan(v)]
    if not kept:
        return Spread(math.nan, math.nan, math.nan)
    return Spread(statistics.median(kept), min(kept), max(kept))


def ms(seconds: float) -> float:
    return seconds * 1000.0


def verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "—"}[met]
