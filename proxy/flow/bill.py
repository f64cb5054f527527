"""What one request cost the user, and what it would have cost without compaction.

    bill = bill_of(call, resolved, tap.usage, answered=status == 200)
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
from proxy.upstream.usage import NO_USAGE, Usage


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

    @property
    def cost(self) -> float:
        return self.own + self.summarizer_cost

    @property
    def priced(self) -> bool:
        return self.usage is not None

    def dollars(self, cost: float) -> float | None:
        return self.prices.dollars(cost)

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
        if self.summarizer.tokens:
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
            dollars, without = self.dollars(self.cost), self.dollars(self.without)
            if dollars is not None and without is not None:
                found.update(
                    cost_usd=round(dollars, 6), cost_without_compaction_usd=round(without, 6)
                )
        return found


def bill_of(call: Call, resolved: Resolved, usage: Usage | None, *, answered: bool) -> Bill:
    """The bill of a request whose answer reported ``usage``; ``answered``: the
    upstream took it (a 200), so it extended the conversation's cache."""
    tally = call.tally
    prices = call.prices()
    if not answered:
        return Bill(prices, usage, tally.summarizer, tally.summarizer_cost)
    client = math.ceil(
        resolved.tokens_before * call.services.conversations.models.ratio(call.config, call.owner)
    )
    cached = call.services.conversations.prompts.swap(
        call.owner, resolved.session, client, within=prices.cache_lifetime
    )
    if usage is None:
        return Bill(prices, None, tally.summarizer, tally.summarizer_cost)
    own = usage.cost(prices)
    if call.unchanged(resolved):
        without = own + tally.summarizer_cost  # what was sent is what came: no saving
    else:
        without = prices.prompt(client, cached) + usage.output * prices.output
    return Bill(prices, usage, tally.summarizer, tally.summarizer_cost, own, without)


def untouched_bill(call: Call, usage: Usage | None) -> Bill:
    """A request forwarded byte for byte, outside compaction: it costs what it costs."""
    prices = call.prices()
    own = usage.cost(prices) if usage is not None else 0.0
    return Bill(prices, usage, own=own, without=own)


def spent_headers(call: Call) -> dict[str, str]:
    """What the response's head can truly say of the money when it is sent:
    the summarizer calls this request made (the answer's usage comes later)."""
    tally = call.tally
    if not tally.summarizer_calls:
        return {}
    return {
        "x-compaction-summarizer-calls": str(tally.summarizer_calls),
        "x-compaction-summarizer-tokens": str(tally.summarizer.tokens),
        "x-compaction-summarizer-cost": f"{tally.summarizer_cost:.1f}",
    }
