"""A summary as ranked lines under the fixed headings, fitted to a token budget.

The extractive summarizer decides what could be said and how much each line
matters; this module decides what fits. Lines are added under a section with
a score, in order; rendering writes every heading of
:data:`~compaction.prompts.SUMMARY_SECTIONS` (an empty section says
``- None recorded``) and drops the lowest-scored lines, oldest first among
equals, until the text holds at most ``budget`` tokens. Dropped Done lines
are counted in a ``(N earlier steps not listed)`` line, so the reader knows
the list is not the whole story.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compaction.prompts import PROGRESS_SUBSECTIONS, SUMMARY_SECTIONS
from compaction.text import fit_tokens
from compaction.tokens import TokenCounter

#: Tokens kept free for the "(N earlier steps not listed)" line.
_OMITTED_RESERVE = 16
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
        items = self.lines
        by_rank = sorted(items, key=lambda i: (i.score, i.order))
        frame = counter.count_text(_render([], 0, turn_prefix)) + _OMITTED_RESERVE
        # The lines kept are the highest-ranked that fit with the frame; only
        # those (and the first that does not fit) are tokenized: a long
        # session has thousands of lines, and a few hundred are kept.
        costs: dict[int, int] = {}
        kept_cost = 0
        dropped = len(by_rank)
        while dropped > 0:
            candidate = by_rank[dropped - 1]
            cost = costs[id(candidate)] = counter.count_text(candidate.text) + 1
            if frame + kept_cost + cost > budget:
                break
            kept_cost += cost
            dropped -= 1
        total = frame + kept_cost
        while True:
            while total > budget and dropped < len(by_rank):
                total -= costs[id(by_rank[dropped])]
                dropped += 1
            gone = {id(i) for i in by_rank[:dropped]}
            kept = [i for i in items if id(i) not in gone]
            omitted = sum(i.section == "Done" for i in by_rank[:dropped])
            text = _render(kept, omitted, turn_prefix)
            actual = counter.count_text(text)
            if actual <= budget or dropped >= len(by_rank):
                return fit_tokens(text, budget, counter)
            total = actual + 1  # joins tokenized differently: drop one more and retry


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
