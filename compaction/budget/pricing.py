"""What a request costs the user: input, prompt-cache reads and writes, output.

Pure data. Providers bill the prompt in up to three parts — tokens read from
their prompt cache (cheap), tokens written to it (dear, with Anthropic), and
the rest at the plain input price — and the output at its own price. A
compaction rewrites the prompt from the point it changes, so its worth is
what it saves minus the cache it breaks (:mod:`compaction.budget.plan`); the same
prices turn the upstream's usage into the money the proxy shows.

Prices are **multiples of the plain input price** (``input = 1``), so the
plan needs no currency; ``input_per_mtok`` (US dollars per million input
tokens, optional) turns them into money for display.

The presets, as the providers documented them when they were written down
(read again before relying on a figure; any field can be set per model):

========== ========== =========== ======== ========= ====================================
preset     cache read cache write output   lifetime  source
========== ========== =========== ======== ========= ====================================
anthropic  0.1        1.25        5.0      300 s     Anthropic's prompt caching: 5-minute
                                                     writes 1.25 × input, reads 0.1 ×, the
                                                     lifetime refreshed on each hit;
                                                     Sonnet's $3 in / $15 out
openai     0.1        1.0         8.0      300 s     OpenAI's automatic caching (GPT-5
                                                     family): cached input at a tenth, no
                                                     write premium before gpt-5.6, kept
                                                     5–10 minutes idle; $1.25 in / $10 out
local      0.02       1.0         5.0      3600 s    a local server (llama.cpp, vLLM,
                                                     Ollama): no bill, but a prompt its
                                                     KV cache holds is nearly free and one
                                                     it must evaluate again costs time in
                                                     proportion to its length
none       1.0        1.0         5.0      0 s       no prompt cache at all
========== ========== =========== ======== ========= ====================================

``auto`` (the default) picks by where the request goes: a loopback or
private address → ``local``; Anthropic's API or the Messages dialect →
``anthropic``; anything else → ``openai``.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
from dataclasses import dataclass
from typing import Literal

PricingPreset = Literal["auto", "anthropic", "openai", "local", "none"]
PRICING_PRESETS: tuple[PricingPreset, ...] = ("auto", "anthropic", "openai", "local", "none")


@dataclass(frozen=True)
class Prices:
    """One upstream's prices, as multiples of its plain input price."""

    cache_read: float = 0.1
    cache_write: float = 1.25
    output: float = 5.0
    #: Seconds an unused cached prefix lives (refreshed each time it is read).
    cache_lifetime: float = 300.0
    #: US dollars per million plain input tokens, for display; ``None``: unknown.
    input_per_mtok: float | None = None
    #: The preset these came from, for display ("anthropic", "custom", …).
    name: str = "anthropic"

    def cost(
        self, *, uncached: int, cache_read: int = 0, cache_write: int = 0, output: int = 0
    ) -> float:
        """The price of one upstream call, in plain input tokens."""
        return (
            uncached
            + cache_read * self.cache_read
            + cache_write * self.cache_write
            + output * self.output
        )

    def dollars(self, cost: float) -> float | None:
        """``cost`` (in plain input tokens) in US dollars, where the price is known."""
        if self.input_per_mtok is None:
            return None
        return cost * self.input_per_mtok / 1_000_000

    def prompt(self, tokens: int, cached: int) -> float:
        """A prompt of ``tokens`` whose first ``cached`` were read from the cache
        and whose rest was written to it (what a provider that caches every
        prompt bills): the price of sending it."""
        cached = max(0, min(cached, tokens))
        return cached * self.cache_read + (tokens - cached) * self.cache_write


PRESETS: dict[str, Prices] = {
    "anthropic": Prices(0.1, 1.25, 5.0, 300.0, None, "anthropic"),
    "openai": Prices(0.1, 1.0, 8.0, 300.0, None, "openai"),
    "local": Prices(0.02, 1.0, 5.0, 3600.0, None, "local"),
    "none": Prices(1.0, 1.0, 5.0, 0.0, None, "none"),
}


@functools.lru_cache(maxsize=256)
def preset_for(preset: str, *, api: str = "chat", host: str = "") -> Prices:
    """The preset ``preset`` names, ``auto`` resolved by the upstream's ``host``
    and the request's ``api`` (``chat``, ``anthropic``, ``responses``).

    Asked on every request, of a handful of hosts: remembered (telling an
    address from a name costs an exception each time)."""
    if preset != "auto":
        return PRESETS[preset]
    if _is_local(host):
        return PRESETS["local"]
    if host.endswith("anthropic.com") or api == "anthropic":
        return PRESETS["anthropic"]
    return PRESETS["openai"]


@functools.lru_cache(maxsize=256)
def priced(
    base: Prices,
    *,
    cache_read: float | None = None,
    cache_write: float | None = None,
    output: float | None = None,
    cache_lifetime: float | None = None,
    input_per_mtok: float | None = None,
) -> Prices:
    """``base`` with the fields a user set (``None``: keep the preset's).

    Asked on every request, of the few profiles a process has: remembered."""
    changes = {
        key: value
        for key, value in (
            ("cache_read", cache_read),
            ("cache_write", cache_write),
            ("output", output),
            ("cache_lifetime", cache_lifetime),
            ("input_per_mtok", input_per_mtok),
        )
        if value is not None
    }
    if not changes:
        return base
    name = "custom" if set(changes) - {"input_per_mtok"} else base.name
    return dataclasses.replace(base, **changes, name=name)


def _is_local(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in ("localhost", "") or host.endswith(".localhost") or host.endswith(".local"):
        return host != ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.startswith("host.docker.internal")
    return address.is_loopback or address.is_private or address.is_link_local


__all__ = ["PRESETS", "PRICING_PRESETS", "Prices", "PricingPreset", "preset_for", "priced"]
