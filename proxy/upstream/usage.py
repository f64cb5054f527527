"""What the upstream says an answer used, in one shape for the three APIs.

Each API reports the prompt in its own words:

* Chat Completions: ``prompt_tokens`` (the cached part included), of which
  ``prompt_tokens_details.cached_tokens`` were read from the prompt cache;
* Responses: ``input_tokens`` (the cached part included), of which
  ``input_tokens_details.cached_tokens`` were read;
* Anthropic: ``input_tokens`` (the cached parts left out: the prompt is the
  sum), ``cache_read_input_tokens`` read, ``cache_creation_input_tokens``
  written;

and the output as ``completion_tokens`` (Chat) or ``output_tokens``.

**Writes nobody reports.** OpenAI caches every prompt by itself and counts
only what it read back: the part of a prompt not read is taken for written
(:attr:`Usage.cache_write`), priced at the write price — 1.0 in the ``openai``
preset, the plain input price, so the convention changes nothing there; it
matters only for a write price set by hand. Anthropic writes only up to the
client's breakpoints and says how much: the rest of its prompt is
:attr:`Usage.uncached`.

**Anthropic's server-side compaction** adds ``usage.iterations``: one entry per
sampling step (``compaction``, ``message``), while the top-level counts are
those of the answer's own step only. Every step is billed, so the iterations,
where present, are what is counted; :attr:`Usage.server_compaction` says how
much of it the provider's compaction took.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from compaction import Prices

#: Anthropic's cache counts, which its ``input_tokens`` leaves out.
_CACHE_APART = frozenset({"cache_read_input_tokens", "cache_creation_input_tokens"})


@dataclasses.dataclass(frozen=True)
class Usage:
    """One or more upstream calls' tokens; parts of :attr:`prompt` never overlap."""

    #: The whole prompt as the upstream counted it, cached parts included.
    prompt: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0
    #: Tokens (in and out) of the provider's own compaction steps, already
    #: counted in the fields above.
    server_compaction: int = 0

    @property
    def uncached(self) -> int:
        """The prompt neither read from nor written to the cache."""
        return max(0, self.prompt - self.cache_read - self.cache_write)

    @property
    def tokens(self) -> int:
        return self.prompt + self.output

    def cost(self, prices: Prices) -> float:
        """Its price, in plain input tokens."""
        return prices.cost(
            uncached=self.uncached,
            cache_read=self.cache_read,
            cache_write=self.cache_write,
            output=self.output,
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt + other.prompt,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
            self.output + other.output,
            self.server_compaction + other.server_compaction,
        )


NO_USAGE = Usage()


@dataclasses.dataclass(frozen=True)
class Reported:
    """What one answer's ``usage`` object says, read once (:func:`read_usage`)."""

    #: Every step billed; ``None`` when it counts no prompt.
    usage: Usage | None
    #: The prompt of the answer's own step (the top-level counts): what the
    #: model read of the request as sent, for calibration.
    prompt: int | None


NOTHING_REPORTED = Reported(None, None)


def read_usage(usage: Any, *, cache_apart: bool = False) -> Reported:
    """A ``usage`` object read into what it bills and the prompt its answer's
    own step read. ``cache_apart``: the API leaves the cache counts out of
    ``input_tokens`` (Anthropic's does; its keys say so too)."""
    if not isinstance(usage, Mapping):
        return NOTHING_REPORTED
    top = _one(usage, cache_apart)
    prompt = None if top is None else top.prompt
    iterations = usage.get("iterations")
    if isinstance(iterations, list) and iterations:
        total, compacting = NO_USAGE, 0
        for step in iterations:
            found = _one(step, cache_apart) if isinstance(step, Mapping) else None
            if found is None:
                break  # a step it cannot read: the top-level counts, as without steps
            total += found
            if step.get("type") == "compaction":
                compacting += found.tokens
        else:
            return Reported(dataclasses.replace(total, server_compaction=compacting), prompt)
    return Reported(top, prompt)


def _one(usage: Mapping[str, Any], cache_apart: bool) -> Usage | None:
    """One step's counts, each read once; a count that is not a non-negative
    integer is missing."""
    counts: dict[str, int] = {}
    for key, value in usage.items():
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            counts[key] = value
    if "prompt_tokens" in usage:
        prompt, details = counts.get("prompt_tokens"), usage.get("prompt_tokens_details")
    elif "input_tokens" in usage:
        prompt, details = counts.get("input_tokens"), usage.get("input_tokens_details")
    else:
        return None
    if prompt is None:
        return None
    output = counts.get("completion_tokens") or counts.get("output_tokens") or 0
    apart = cache_apart or not _CACHE_APART.isdisjoint(usage)
    if apart and "prompt_tokens" not in usage:
        read = counts.get("cache_read_input_tokens", 0)
        write = counts.get("cache_creation_input_tokens", 0)
        return Usage(prompt + read + write, read, write, output)
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    read = 0
    if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0:
        read = min(cached, prompt)
    # Nothing says what was written: the rest of the prompt was (see above).
    return Usage(prompt, read, prompt - read, output)


__all__ = ["NOTHING_REPORTED", "NO_USAGE", "Reported", "Usage", "read_usage"]
