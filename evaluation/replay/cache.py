"""A provider's prompt cache, simulated in virtual time.

The contract, per request of a session at virtual time ``now``::

    live     = the session's cached prompts whose expiry is after now
    cached   = max over live p of  LCP_tokens(p, prompt)        (0 if none)
    written  = tokens(prompt) − cached
    then     the entry that gave ``cached`` expires at now + lifetime (a read
             refreshes it), and the prompt itself is stored, expiring then too

``LCP_tokens`` is the longest common token prefix. A prompt is a sequence of
segments (:mod:`evaluation.replay.prompts`), each tokenized on its own, so two
prompts agree segment by segment up to the first that differs and only that
one is compared token by token. Sessions never share entries (a provider's
cache is keyed by the organisation and the prompt; here each session stands
for one caller). An entry that is a prefix of the new prompt adds nothing the
new one does not give longer and for as long, so it is dropped; a session
keeps at most :data:`MAX_ENTRIES` prompts, the soonest to expire dropped first.

What the simulator does not model: a minimum cacheable length (1,024 tokens
with both providers), the granularity of cache hits (OpenAI's 128-token
steps), explicit breakpoints (Anthropic's ``cache_control``, of which a real
client sets at most four), and eviction under load. It is the ideal cache of a
provider that caches every prompt: the upper bound of what any prompt can read.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import tiktoken

#: Prompts remembered per session; the soonest to expire go first past it.
MAX_ENTRIES = 64
#: Distinct segment texts whose tokens are remembered (least recently used go first).
MAX_TOKENIZED_SEGMENTS = 100_000


class SegmentTokens:
    """The tokens of a segment's text, with a bounded cache: a resent history
    is tokenized only for what is new."""

    def __init__(self, encoding: tiktoken.Encoding, max_segments: int = MAX_TOKENIZED_SEGMENTS):
        self._encoding = encoding
        self._cache: OrderedDict[str, array[int]] = OrderedDict()
        self._max = max_segments

    def __call__(self, text: str) -> array[int]:
        tokens = self._cache.get(text)
        if tokens is not None:
            self._cache.move_to_end(text)
            return tokens
        tokens = array("I", self._encoding.encode_ordinary(text))
        self._cache[text] = tokens
        if len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return tokens

    def count(self, text: str) -> int:
        return len(self(text))


@dataclass(frozen=True)
class CacheRead:
    """What one prompt cost in cache terms."""

    tokens: int  #: the prompt's length
    cached: int  #: its first tokens, read from the cache

    @property
    def written(self) -> int:
        """Tokens not read from the cache (written to it, for the next request)."""
        return self.tokens - self.cached


class _Entry:
    __slots__ = ("counts", "expiry", "segments", "tokens")

    def __init__(self, segments: tuple[str, ...], counts: list[int], expiry: float) -> None:
        self.segments = segments
        self.counts = counts
        self.tokens = sum(counts)
        self.expiry = expiry


class PromptCache:
    """The cached prompts of every session (see the module docstring)."""

    def __init__(
        self, tokens: SegmentTokens, lifetime: float, max_entries: int = MAX_ENTRIES
    ) -> None:
        self._tokens = tokens
        self.lifetime = lifetime
        self._max_entries = max_entries
        self._sessions: dict[str, list[_Entry]] = {}

    def read(self, session: str, segments: Sequence[str], now: float) -> CacheRead:
        """Price ``segments`` against ``session``'s live prompts at ``now``, then cache it."""
        prompt = tuple(segments)
        counts = [self._tokens.count(segment) for segment in prompt]
        live = [entry for entry in self._sessions.get(session, ()) if entry.expiry > now]
        best: _Entry | None = None
        cached = 0
        kept: list[_Entry] = []
        for entry in live:
            common = self._common(entry, prompt, counts)
            if common > cached:
                best, cached = entry, common
            if common < entry.tokens:
                kept.append(entry)
        expiry = now + self.lifetime
        if best is not None:
            best.expiry = expiry
        kept.append(_Entry(prompt, counts, expiry))
        if len(kept) > self._max_entries:
            kept.sort(key=lambda entry: entry.expiry)
            kept = kept[-self._max_entries :]
        self._sessions[session] = kept
        return CacheRead(sum(counts), cached)

    def entries(self, session: str) -> int:
        """How many prompts ``session`` has cached (live or not yet dropped)."""
        return len(self._sessions.get(session, ()))

    def _common(self, entry: _Entry, prompt: tuple[str, ...], counts: list[int]) -> int:
        shared = min(len(entry.segments), len(prompt))
        total = 0
        for i in range(shared):
            if entry.segments[i] == prompt[i]:
                total += counts[i]
                continue
            return total + _token_prefix(self._tokens(entry.segments[i]), self._tokens(prompt[i]))
        return total


def _token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
