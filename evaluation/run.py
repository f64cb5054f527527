"""Compact every body at every window and strategy, and score the probes.

The compaction is the engine's own entry point, :func:`compaction.compact`,
called as ``compaction-proxy compact`` calls it; only the profile changes
between runs (``context_window`` and ``strategy``). Probes are generated once
per body from its original messages (:mod:`evaluation.probes`); a body that
needed no compaction at a window is counted, not scored (every probe would
pass and the strategies could not differ), and neither is one whose head
alone cannot fit (no strategy can help it).

Beside the probes, the facts of :mod:`evaluation.facts` (drawn by rules of
the eval's own) are looked for the same way, and the tokens of the compacted
request's summaries counted — and of their ledger blocks, where a summary
has one (:func:`ledger_text`).

With a judge, each probe is also asked of the compacted conversation and the
answer graded (:mod:`evaluation.judge`).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compaction import (
    CannotFitError,
    Message,
    Profile,
    Strategy,
    Summarizer,
    TokenCounter,
    check_messages,
    compact,
    is_summary,
    message_text,
)
from evaluation.corpus import Body
from evaluation.facts import FACT_KINDS, Fact, FactKind, draw_facts
from evaluation.judge import Judge
from evaluation.probes import KINDS, Kind, Probe, generate_probes, request_text


@dataclass
class Tally:
    passed: int = 0
    total: int = 0

    def add(self, passed: bool) -> None:
        self.passed += passed
        self.total += 1

    @property
    def score(self) -> float | None:
        return self.passed / self.total if self.total else None


@dataclass
class Cell:
    """The figures of one strategy at one window."""

    strategy: Strategy
    window: int
    bodies: int = 0
    compacted: int = 0
    cannot_fit: int = 0
    tokens_before: int = 0  #: summed over the compacted bodies
    tokens_after: int = 0
    summarizer_calls: int = 0
    summarizer_tokens: int = 0
    stages: dict[str, int] = field(default_factory=dict)
    presence: dict[Kind, Tally] = field(default_factory=lambda: {k: Tally() for k in KINDS})
    judged: dict[Kind, Tally] = field(default_factory=lambda: {k: Tally() for k in KINDS})
    facts: dict[FactKind, Tally] = field(default_factory=lambda: {k: Tally() for k in FACT_KINDS})
    summary_tokens: int = 0  #: summed over the compacted bodies' summary messages
    ledgers: int = 0  #: compacted bodies whose summaries hold a ledger block
    ledger_tokens: int = 0  #: summed over those ledger blocks

    def overall(self, tallies: dict[Kind, Tally]) -> Tally:
        return Tally(
            sum(t.passed for t in tallies.values()), sum(t.total for t in tallies.values())
        )


class CountingSummarizer:
    """Wraps a summarizer to count its calls and tokens (prompt + reply)."""

    def __init__(self, inner: Summarizer, counter: TokenCounter) -> None:
        self._inner = inner
        self._counter = counter
        self.calls = 0
        self.tokens = 0

    async def __call__(self, messages: list[Message], max_tokens: int) -> str:
        self.calls += 1
        self.tokens += sum(self._counter.count_messages(messages))
        reply = await self._inner(messages, max_tokens)
        self.tokens += sum(self._counter.count_messages([{"role": "assistant", "content": reply}]))
        return reply


async def evaluate(
    bodies: Iterable[Body],
    windows: Sequence[int],
    strategies: Sequence[Strategy],
    profile_for: Callable[[str | None], Profile],
    summarizer: Summarizer | None = None,
    judge: Judge | None = None,
) -> list[Cell]:
    """One :class:`Cell` per (strategy, window), strategies first."""
    cells = {(s, w): Cell(s, w) for s, w in itertools.product(strategies, windows)}
    for body in bodies:
        request = body.request
        messages = check_messages(request.get("messages"))
        model = request.get("model")
        base = profile_for(model if isinstance(model, str) else None)
        counter = TokenCounter(model, image_tokens=base.image_tokens)
        probes = generate_probes(messages, base)
        facts = draw_facts(messages)
        for (strategy, window), cell in cells.items():
            profile = dataclasses.replace(base, context_window=window, strategy=strategy)
            counting = CountingSummarizer(summarizer, counter) if summarizer else None
            await _score(cell, request, profile, counter, probes, facts, counting, judge)
    return list(cells.values())


async def _score(
    cell: Cell,
    request: dict[str, Any],
    profile: Profile,
    counter: TokenCounter,
    probes: list[Probe],
    facts: list[Fact],
    summarizer: CountingSummarizer | None,
    judge: Judge | None,
) -> None:
    cell.bodies += 1
    try:
        result = await compact(request, profile, summarizer, counter=counter)
    except CannotFitError:
        cell.cannot_fit += 1
        return
    if result.stage == "none":
        return
    cell.compacted += 1
    cell.stages[result.stage] = cell.stages.get(result.stage, 0) + 1
    cell.tokens_before += result.tokens_before
    cell.tokens_after += result.tokens_after
    if summarizer is not None:
        cell.summarizer_calls += summarizer.calls
        cell.summarizer_tokens += summarizer.tokens
    text = request_text(result.messages)
    for probe in probes:
        cell.presence[probe.kind].add(probe.found_in(text))
    for fact in facts:
        cell.facts[fact.kind].add(fact.kept_in(text))
    summaries = [message for message in result.messages if is_summary(message)]
    cell.summary_tokens += sum(counter.count_messages(summaries))
    ledgers = [block for message in summaries for block in ledger_text(message_text(message))]
    if ledgers:
        cell.ledgers += 1
        cell.ledger_tokens += sum(counter.count_text(block) for block in ledgers)
    if judge is not None:
        for probe in probes:
            cell.judged[probe.kind].add(await judge.grade(result.messages, probe))


#: The ledger's blocks in a summary, after the prose: the engine's computed
#: facts (errors, commands, identifiers, the user's words), or any block whose
#: tag names a ledger. The file lists (``<read-files>``, ``<modified-files>``)
#: are not counted: they came before the ledger and have a bound of their own.
_LEDGER = re.compile(
    r"<((?:errors|commands|identifiers|user-messages)|[\w-]*ledger[\w-]*)\b[^>]*>.*?</\1>",
    re.DOTALL | re.IGNORECASE,
)


def ledger_text(summary: str) -> list[str]:
    """The ledger blocks of one summary's text, tags included (none: ``[]``)."""
    return [match.group(0) for match in _LEDGER.finditer(summary)]
