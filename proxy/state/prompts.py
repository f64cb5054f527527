"""What each conversation's client sent last: the cache it would have had
without compaction.

Without the proxy, a client's request would extend its previous one, and the
provider would read that previous prompt from its cache if it came within the
cache's lifetime. :class:`LastPrompts` keeps, per (owner, session), the size
of the previous request as the client sent it (uncompacted, in the upstream's
tokens) and when it came, so the next request's cost without compaction can
be priced as a cache read of it and a cache write of the rest
(:mod:`proxy.flow.answered.bill`).

This process's memory only, bounded (the least recently seen conversations
are forgotten past :data:`MAX_SESSIONS`): with several replicas a session's
previous request may have gone to another, and its next is then priced as a
conversation's first (all of it written).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

#: Conversations remembered; past this the least recently seen is forgotten.
MAX_SESSIONS: Final = 10_000


@dataclass(frozen=True)
class LastPrompt:
    tokens: int  #: the client's request, in the upstream's tokens (estimated)
    at: float  #: when it came (the book's clock)


class LastPrompts:
    """The previous client request of each conversation, by (owner, session)."""

    def __init__(
        self, *, max_sessions: int = MAX_SESSIONS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max = max_sessions
        self._clock = clock
        self._last: OrderedDict[tuple[str, str], LastPrompt] = OrderedDict()

    def swap(self, owner: str, session: str, tokens: int, *, within: float) -> int:
        """Remember ``tokens`` as the conversation's latest request; what its
        previous one left in the cache: its size, if it came at most
        ``within`` seconds ago, else 0."""
        key, now = (owner, session), self._clock()
        previous = self._last.pop(key, None)
        self._last[key] = LastPrompt(tokens, now)
        if len(self._last) > self._max:
            self._last.popitem(last=False)
        if previous is None or now - previous.at > within:
            return 0
        return previous.tokens

    def idle(self, owner: str, session: str) -> float | None:
        """Seconds since the conversation's previous request; ``None`` when this
        process has not seen one (the compaction plan then takes the cache for
        warm)."""
        previous = self._last.get((owner, session))
        return None if previous is None else self._clock() - previous.at

    def __len__(self) -> int:
        return len(self._last)
