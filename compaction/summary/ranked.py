"""A summary as ranked lines under the fixed headings, fitted to a token budget.

The extractive summarizer decides what could be said and how much each line
matters; this module decides what fits. Lines are added under a section with
a score, in order; rendering writes every heading of
:data:`~compaction.summary.prompts.SUMMARY_SECTIONS` (an empty section says
``- None recorded``) and keeps the highest-scored lines, newest first among
equals, that fit in ``budget`` tokens. A line too long for the room left is
passed over, not the end of the list: a short error line ranked below a long
command line still fits. Dropped Done lines are counted in a ``(N earlier
steps not listed)`` line, so the reader knows the list is not the whole story.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compaction.summary.prompts import PROGRESS_SUBSECTIONS, SUMMARY_SECTIONS
from compaction.tokens.counter import TokenCounter, fit_tokens

#: Tokens kept free for the "(N earlier steps not listed)" line.
_OMITTED_RESERVE = 16
#: Below this much room no line fits: stop looking.
_MIN_LINE_TOKENS = 4
#: Lines passed over in a row before the rest are taken not to fit either:
#: bounds the tokenizing on a session of thousands of lines.
_MAX_MISSES = 50
#: Sections a turn-prefix summary leaves out: the request is kept verbatim above it.
_TURN_PREFIX_OMITS = ("Goal", "Constraints & Preferences")


@dataclass(frozen=True)
class RankedLine:
    section: str
    text: str
    score: float  #: lowest is dropped first
    order: int  #: position in which it was added


class RankedLines:
    """Collects bullet lines, in order, skipping one already under the same section."""

    def __init__(self) -> None:
        self.lines: list[RankedLine] = []
        self._seen: set[tuple[str, str]] = set()

    def add(self, section: str, text: str, score: float) -> None:
        text = text if text.startswith("- ") else f"- {text}"
        key = (section, text)
        if key in self._seen:
            return
        self._seen.add(key)
        self.lines.append(RankedLine(section, text, score, len(self._seen)))

    def render(self, budget: int, counter: TokenCounter, *, turn_prefix: bool = False) -> str:
        """The summary text in at most ``budget`` tokens, the lowest-ranked lines left out."""
        best_first = sorted(self.lines, key=lambda i: (i.score, i.order), reverse=True)
        frame = counter.count_text(_render([], 0, turn_prefix)) + _OMITTED_RESERVE
        # Only the lines looked at are tokenized: a long session has thousands
        # of lines, and a few hundred are kept.
        kept: list[RankedLine] = []
        room = budget - frame
        misses = 0
        for item in best_first:
            if room < _MIN_LINE_TOKENS or misses >= _MAX_MISSES:
                break
            cost = counter.count_text(item.text) + 1
            if cost <= room:
                kept.append(item)
                room -= cost
                misses = 0
            else:
                misses += 1
        while True:
            chosen = {id(i) for i in kept}
            omitted = sum(i.section == "Done" and id(i) not in chosen for i in self.lines)
            in_order = [i for i in self.lines if id(i) in chosen]
            text = _render(in_order, omitted, turn_prefix)
            if not kept or counter.count_text(text) <= budget:
                return fit_tokens(text, budget, counter)
            kept.pop()  # joins tokenized differently: drop the lowest kept and retry


def _render(items: Sequence[RankedLine], omitted_steps: int, turn_prefix: bool) -> str:
    by_section: dict[str, list[RankedLine]] = {}
    for item in items:
        by_section.setdefault(item.section, []).append(item)

    def lines(section: str) -> list[str]:
        found = sorted(by_section.get(section, []), key=lambda i: i.order)
        out = [i.text for i in found]
        if section == "Done" and omitted_steps:
            out.insert(0, f"- ({omitted_steps:,} earlier steps not listed)")
        return out or ["- None recorded"]

    out: list[str] = []
    for section in SUMMARY_SECTIONS:
        if turn_prefix and section in _TURN_PREFIX_OMITS:
            continue
        out.append(f"## {section}")
        if section == "Progress":
            for sub in PROGRESS_SUBSECTIONS:
                out.append(f"### {sub}")
                out.extend(lines(sub))
        else:
            out.extend(lines(section))
        out.append("")
    return "\n".join(out).strip()
