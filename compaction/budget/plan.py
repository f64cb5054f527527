"""How deep to compact: the fill a compacted request starts at, priced in the
user's money.

Pure. :func:`depth` answers one question — how many tokens should the
request hold right after this compaction — from what a compaction costs and
what it buys. Providers keep the prompts they saw in a cache for a while
(:mod:`compaction.budget.pricing`): a request that extends the previous one reads
that prefix at a fraction of the input price, and every token after the first
change is written again at the full price (dearer still with Anthropic). So
between two compactions a conversation is cheap — each turn reads its prefix
and writes what it added — and each compaction rewrites the whole request
after the head. With ``T`` the trigger, ``F`` the fill after compaction, ``H``
the head, ``g`` the tokens a turn adds, ``r`` and ``w`` the cache read and
write prices and ``S`` the summary's own price, one cycle of
``n = (T − F) / g`` turns costs, per turn::

    cost(F) = [w·(F − H) + r·H + S] / n    the compaction's rewrite, spread
            + r·(F + T) / 2                 reading the prefix, on average
            + w·g                           writing what each turn adds

It only grows with ``F``: the cheapest compaction is the deepest. What a
deeper compaction costs instead is context — the turns summarized or briefed
away. So the plan spends a little money for context: it takes the largest
fill whose cost per turn is within ``slack`` (:attr:`Profile.plan_slack`) of
the cheapest fill's, between a floor that keeps a working set (a share of
the trigger, and room for two turns) and ``prune_target`` × the trigger —
and no more than ``working_set`` tokens (:attr:`Profile.plan_working_set`)
where the floor is lower: what an agent uses next (its newest outputs, its
own recent turns) does not grow with the window, the cost of keeping it does,
so a large window compacts deeper and more rarely.

Three more things change the answer:

* **a cold cache** — when the session was idle longer than the cache lives,
  the next request is written whole anyway: a compaction then rewrites
  nothing that was not to be written, so one due within a few turns is done
  now (:func:`compacts_early`);
* **the turn's size** — read from the conversation itself (:func:`growth_of`):
  a turn is an assistant message and what answers it, as a client resends it;
* **the summary's price** — a model's summary is asked only where it costs
  less than the reads the compaction saves (:func:`model_summary_pays`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from compaction.budget.pricing import Prices
from compaction.types import Message

#: The fill is never planned below this share of the trigger: the working set
#: (the newest outputs, the agent's own recent commands) needs room whatever
#: the prices say.
FILL_FLOOR_SHARE = 0.3
#: Turns looked at to measure the pace.
PACE_TURNS = 8
#: Fills tried between the floor and the ceiling.
_STEPS = 40


@dataclass(frozen=True)
class Pace:
    """How the session moves, as the caller saw it."""

    #: Tokens a turn adds (median of the newest turns; :func:`growth_of`).
    growth: int
    #: Seconds since the session's previous request; ``None`` when unknown
    #: (the first request seen, or a caller that keeps no clock).
    idle: float | None = None
    #: Seconds a summary takes at this upstream (a high percentile of those
    #: measured); ``None`` before the first.
    summary: float | None = None


def lead_turns(pace: Pace | None) -> int | None:
    """Turns a compaction must be prepared ahead, for its summary to be ready
    in time: the summary's seconds (already a high percentile of those
    measured) over the session's seconds a turn (:attr:`Pace.idle`), and the
    turn it starts in; ``None`` while either is unknown."""
    if pace is None or pace.summary is None or not pace.idle or pace.idle <= 0:
        return None
    return math.ceil(pace.summary / pace.idle) + 1


@dataclass(frozen=True)
class Depth:
    """How deep a compaction goes, and why."""

    fill: int  #: tokens the compacted request aims at (estimated, with the overhead)
    turns: float  #: turns expected before the next compaction
    cost: float  #: expected cost per turn at that fill, in plain input tokens
    cheapest: float  #: the same at the floor: what the slack is measured against
    cold: bool  #: the upstream's cache of the conversation has expired
    growth: int  #: the tokens a turn adds, as planned with
    summary_price: float = 0.0  #: what one summary was priced at (0: extractive)


def growth_of(messages: Sequence[Message], counts: Sequence[int], head: int) -> int:
    """Tokens a turn adds: the median of the newest :data:`PACE_TURNS` turns
    after the head, a turn being an assistant message with what follows it up
    to the next one (its tool results, the user's next message). 0 when the
    conversation has no assistant message after its head."""
    sizes: list[int] = []
    size, started = 0, False
    for message, count in zip(messages[head:], counts[head:], strict=False):
        if message.get("role") == "assistant":
            if started:
                sizes.append(size)
            size, started = 0, True
        size += count
    if started:
        sizes.append(size)
    return round(statistics.median(sizes[-PACE_TURNS:])) if sizes else 0


def cold(pace: Pace, prices: Prices) -> bool:
    """Whether the upstream's cache of the conversation has expired."""
    return pace.idle is not None and pace.idle > prices.cache_lifetime


def cost_per_turn(
    fill: float, *, trigger: int, head: int, growth: int, prices: Prices, summary: float = 0.0
) -> float:
    """The module docstring's ``cost(F)``, in plain input tokens per turn."""
    g = max(growth, 1)
    turns = max((trigger - fill) / g, 1.0)
    rewrite = prices.cache_write * max(fill - head, 0) + prices.cache_read * min(head, fill)
    return (
        (rewrite + summary) / turns
        + prices.cache_read * (fill + trigger) / 2
        + (prices.cache_write * g)
    )


def depth(
    *,
    trigger: int,
    head: int,
    pace: Pace,
    prices: Prices,
    ceiling: float,
    slack: float,
    summary_price: float = 0.0,
    working_set: int = 0,
) -> Depth:
    """The fill to compact to (see the module docstring).

    ``head`` is the tokens nothing removes (the head and the request's
    overhead), ``ceiling`` the largest share of ``trigger`` a compaction may
    leave (``Profile.prune_target``), ``summary_price`` what one summary costs
    (0 for the extractive one), ``slack`` the share above the cheapest cost
    per turn the plan may spend to keep more, ``working_set`` the most tokens
    it keeps where the floor is lower (0: no such bound).
    """
    g = max(pace.growth, 1)
    floor = max(FILL_FLOOR_SHARE * trigger, head + 2 * g)
    top = max(min(ceiling * trigger, trigger - g), floor)
    fills = [floor + (top - floor) * i / _STEPS for i in range(_STEPS + 1)]

    def priced(fill: float) -> float:
        return cost_per_turn(
            fill, trigger=trigger, head=head, growth=g, prices=prices, summary=summary_price
        )

    cheapest = priced(floor)
    chosen = max((f for f in fills if priced(f) <= cheapest * (1 + slack)), default=floor)
    if working_set > 0:
        chosen = min(chosen, max(floor, working_set))
    fill = math.floor(min(chosen, trigger))
    return Depth(
        fill=fill,
        turns=max((trigger - fill) / g, 1.0),
        cost=priced(fill),
        cheapest=cheapest,
        cold=cold(pace, prices),
        growth=g,
        summary_price=summary_price,
    )


#: The share of the reads a compaction is expected to save that a model's
#: summary may cost. Not all of it: the extractive summary saves the same reads
#: for nothing, and a session may end before the turns expected run out (on
#: the replay benchmark at 32k, with the whole saving allowed, the llm
#: summarizer's run cost 1.037 × not compacting; with half, 0.993).
SUMMARY_PAYBACK_SHARE = 0.5


def model_summary_pays(plan: Depth, tokens: int, prices: Prices) -> bool:
    """Whether a model's summary is worth its price here: no more than
    :data:`SUMMARY_PAYBACK_SHARE` of the reads the compaction saves until the
    next one — the tokens it removes, read from the cache on each of the turns
    expected before the next compaction. Where it is not, the extractive
    summary (free) is used: on a small window compactions come every few turns
    and a model's summary of a few thousand tokens costs more than the reads it
    spares."""
    removed = max(tokens - plan.fill, 0)
    saved = prices.cache_read * removed * plan.turns
    return plan.summary_price <= SUMMARY_PAYBACK_SHARE * saved


def compacts_early(plan: Depth, tokens: int, trigger: int) -> bool:
    """Whether a request still under its trigger is compacted now: the cache
    is cold (the request is written whole anyway), and the compaction would
    be due within two turns and would gain at least two turns."""
    g = plan.growth
    return plan.cold and tokens + 2 * g > trigger and tokens - plan.fill >= 2 * g


__all__ = [
    "FILL_FLOOR_SHARE",
    "SUMMARY_PAYBACK_SHARE",
    "Depth",
    "Pace",
    "cold",
    "compacts_early",
    "cost_per_turn",
    "depth",
    "growth_of",
    "lead_turns",
    "model_summary_pays",
]
