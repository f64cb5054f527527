"""What one request cost the user, and what it would have cost without compaction.

    bill = account(conversations, metrics, call, resolved, spent, tap.usage,
                   answered=status == 200)
    log_fields.update(bill.fields())        # and the request's figures, its metrics

Prices are the request's model profile's, for its API and the host its
upstream URL names (:meth:`compaction.Profile.prices`): one rule for the
request, its summarizer calls and the estimate.

**Cost** is the answer's ``usage`` (:class:`~proxy.upstream.usage.Usage`)
priced part by part — uncached prompt, cache read, cache written, output —
plus the summarizer calls this request made. An answer that reported no
usage leaves its own part unknown: only its summarizer calls count, and the
request is counted as unpriced.

**Without compaction** is what the client's request would have cost sent as
it came: its prompt, the proxy's estimate ``tokens_before`` scaled to the
upstream's count by the calibration ratio, priced as a cache read of the
conversation's previous client request (its size, the same estimate, if it
came within the cache's lifetime; :class:`proxy.state.prompts.LastPrompts`)
and a cache write of the rest, plus the same output. A request forwarded as
the client sent it cost exactly that: its two figures are one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compaction import Prices
from proxy.flow.read import Call
from proxy.session.conversation import Resolved
from proxy.session.service import Conversations
from proxy.state.metrics import Metrics
from proxy.upstream.usage import NO_USAGE, Usage


@dataclass
class Spent:
    """What a request's work beside its answer spent, added up as it happens:
    its summarizer calls and their price, the upstream's error answers. The
    handler keeps one per request; the :class:`~proxy.flow.read.Call` it serves
    stays the plain description of what was asked."""

    #: What the summarizer's calls made for this request cost, as the upstream
    #: reported it (those of a compaction it started in the background not included).
    summarizer_tokens: int = 0
    #: The same calls' usage, part by part, and their price (plain input tokens).
    summarizer: Usage = NO_USAGE
    summarizer_cost: float = 0.0
    #: The summarizer's requests made for this request, and the upstream's error
    #: answers to it (an overflow retried, an empty stream), for its figures.
    summarizer_calls: int = 0
    upstream_errors: int = 0


@dataclass(frozen=True)
class Bill:
    """One request's money, in plain input tokens of its upstream's price."""

    prices: Prices
    #: The answer's usage as the upstream reported it; ``None``: it reported none.
    usage: Usage | None
    #: The summarizer calls this request made, and their price.
    summarizer: Usage = NO_USAGE
    summarizer_cost: float = 0.0
    #: The answer's own price (0 when its usage is unknown).
    own: float = 0.0
    #: The estimated price of the client's request sent as it came (0 when unknown).
    without: float = 0.0
    #: ``own`` with the summarizer calls: what the request cost.
    cost: float = 0.0
    #: ``cost``, ``own`` and ``without`` in US dollars (``None``: no dollar price).
    cost_dollars: float | None = None
    own_dollars: float | None = None
    without_dollars: float | None = None

    def fields(self) -> dict[str, object]:
        """The request log line's figures (those known)."""
        found: dict[str, object] = {}
        usage = self.usage
        if usage is not None:
            found.update(
                prompt_tokens=usage.prompt,
                cache_read_tokens=usage.cache_read,
                cache_write_tokens=usage.cache_write,
                output_tokens=usage.output,
            )
            if usage.server_compaction:
                found["server_compaction_tokens"] = usage.server_compaction
        if self.summarizer.prompt or self.summarizer.output:
            found.update(
                summarizer_prompt_tokens=self.summarizer.prompt,
                summarizer_output_tokens=self.summarizer.output,
            )
        if usage is not None or self.summarizer_cost:
            found.update(
                pricing=self.prices.name,
                cost=round(self.cost, 1),
                cost_without_compaction=round(self.without, 1),
            )
            dollars, without = self.cost_dollars, self.without_dollars
            if dollars is not None and without is not None:
                found.update(
                    cost_usd=round(dollars, 6), cost_without_compaction_usd=round(without, 6)
                )
        return found


def account(
    conversations: Conversations,
    metrics: Metrics,
    call: Call,
    resolved: Resolved,
    spent: Spent,
    usage: Usage | None,
    *,
    answered: bool,
) -> Bill:
    """The bill of a request whose answer reported ``usage`` and whose work
    beside it ``spent`` what it did; ``answered``: the upstream took it (a
    200), so it extended the conversation's cache, and the bill is counted in
    /metrics. Its summarizer calls were counted there as they came back: only
    the answer's own cost is added."""
    prices = call.prices()
    if not answered:
        return _bill(prices, usage, spent.summarizer, spent.summarizer_cost)
    client = math.ceil(
        resolved.result.tokens_before * conversations.models.ratio(call.config, call.owner)
    )
    cached = conversations.prompts.swap(
        call.owner, resolved.session, client, within=prices.cache_lifetime
    )
    if usage is None:
        bill = _bill(prices, None, spent.summarizer, spent.summarizer_cost)
    else:
        own = usage.cost(prices)
        if call.unchanged(resolved):
            without = own + spent.summarizer_cost  # what was sent is what came: no saving
        else:
            without = prices.prompt(client, cached) + usage.output * prices.output
        bill = _bill(prices, usage, spent.summarizer, spent.summarizer_cost, own, without)
    own_dollars, without_dollars = bill.own_dollars, bill.without_dollars
    dollars = (
        (own_dollars, without_dollars)
        if own_dollars is not None and without_dollars is not None
        else None
    )
    metrics.record_usage(call.config.model, usage, bill.own, bill.without, dollars)
    return bill


def untouched_bill(call: Call, usage: Usage | None) -> Bill:
    """A request forwarded byte for byte, outside compaction: it costs what it costs."""
    prices = call.prices()
    own = usage.cost(prices) if usage is not None else 0.0
    return _bill(prices, usage, own=own, without=own)


def _bill(
    prices: Prices,
    usage: Usage | None,
    summarizer: Usage = NO_USAGE,
    summarizer_cost: float = 0.0,
    own: float = 0.0,
    without: float = 0.0,
) -> Bill:
    """The bill, with its sums and dollars worked out once (the log line, the
    metrics and the figures all read them)."""
    cost = own + summarizer_cost
    if prices.input_per_mtok is None:  # no dollar price (no preset has one): no dollars
        return Bill(prices, usage, summarizer, summarizer_cost, own, without, cost)
    return Bill(
        prices,
        usage,
        summarizer,
        summarizer_cost,
        own,
        without,
        cost,
        prices.dollars(cost),
        prices.dollars(own),
        prices.dollars(without),
    )


def spent_headers(spent: Spent) -> dict[str, str]:
    """What the response's head can truly say of the money when it is sent:
    the summarizer calls this request made (the answer's usage comes later)."""
    if not spent.summarizer_calls:
        return {}
    return {
        "x-compaction-summarizer-calls": str(spent.summarizer_calls),
        "x-compaction-summarizer-tokens": str(spent.summarizer.tokens),
        "x-compaction-summarizer-cost": f"{spent.summarizer_cost:.1f}",
    }
