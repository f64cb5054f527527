"""How fast each upstream writes summaries, measured, and one call at a time
where the server serves one request at a time.

A fixed deadline for a summary call is wrong for most servers: a 1.5B model
on two CPU cores reads a 5,500-token prompt at ~30 tokens/s, three minutes
before it writes a word, while a hosted model answers in seconds. So every
answered summary call is a sample (:meth:`Pace.answered`): the prompt's
size and the seconds the whole call took. The next call's deadline
(:meth:`Pace.deadline`) is its prompt's size at the slowest speed of the
recent samples, times :data:`MARGIN`, and never under the configured
``upstream.summarizer_timeout_seconds`` (the deadline while nothing is
measured) nor over :data:`MAX_DEADLINE`. A call that ran out of time is a
sample too: the server is slower than that call allowed, so it counts at half
the speed the deadline assumed — the next deadline for a prompt of that size
is twice as long. Sizes are the prompt's bytes as sent, which the server's
tokens follow in proportion for one model.

The same samples say how long a summary takes (:meth:`Pace.duration`, a high
percentile): what a compaction prepared ahead of need must start before
(:mod:`proxy.session.ahead`).

On a server with one slot (llama.cpp's default) two summary calls at once
queue one behind the other in the server, each one's time counted against
its own deadline; so there the calls take :attr:`Pace.one_at_a_time` in
turn — the turn-prefix summary after the main one — and a call's deadline
starts once it is its turn.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

#: A call's deadline: the time its prompt takes at the slowest speed measured, times this.
MARGIN: Final = 3.0
#: The longest deadline measuring can give a call (seconds).
MAX_DEADLINE: Final = 1800.0
#: Samples kept per upstream and model: the recent ones speak for the server as it is now.
SAMPLES: Final = 16
#: Upstreams and models measured; the oldest are forgotten past this (model
#: names are the client's to invent).
PACE_KEYS: Final = 1024


@dataclass(frozen=True)
class Sample:
    """One summary call: its prompt's bytes, and the seconds it took (or was allowed)."""

    sent: int
    seconds: float

    @property
    def speed(self) -> float:
        """Bytes a second, never zero."""
        return max(self.sent, 1) / max(self.seconds, 1e-3)


@dataclass
class Pace:
    """One upstream and model's summary calls (see the module doc)."""

    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    #: Answered calls' seconds alone (a timed-out call's are not its duration).
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    #: Taken around each call to a server with one slot.
    one_at_a_time: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: What a call's seconds are read from.
    clock: Callable[[], float] = time.monotonic

    def answered(self, sent: int, seconds: float) -> None:
        self.samples.append(Sample(sent, seconds))
        self.durations.append(seconds)

    def timed_out(self, sent: int, seconds: float) -> None:
        """A call that had ``seconds`` and no whole reply: slower than that, by
        a factor unknown; taken as twice."""
        self.samples.append(Sample(sent, 2 * seconds))

    def deadline(self, sent: int, floor: float) -> float:
        """Seconds a call of ``sent`` bytes may take (see the module doc)."""
        if not self.samples:
            return floor
        slowest = min(sample.speed for sample in self.samples)
        return min(max(floor, sent / slowest * MARGIN), max(floor, MAX_DEADLINE))

    def duration(self, quantile: float = 0.9) -> float | None:
        """The ``quantile`` of the answered calls' seconds (nearest rank);
        ``None`` before the first."""
        if not self.durations:
            return None
        ordered = sorted(self.durations)
        rank = min(len(ordered) - 1, max(0, math.ceil(quantile * len(ordered)) - 1))
        return ordered[rank]


class Paces:
    """Every upstream and model's :class:`Pace`, by
    :func:`~proxy.state.models.calibration_key`, at most :data:`PACE_KEYS`."""

    def __init__(
        self, max_keys: int = PACE_KEYS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._paces: dict[str, Pace] = {}
        self._max_keys = max_keys
        self._clock = clock

    def of(self, key: str) -> Pace:
        pace = self._paces.pop(key, None) or Pace(clock=self._clock)
        self._paces[key] = pace  # the most recently used last
        while len(self._paces) > self._max_keys:
            del self._paces[next(iter(self._paces))]
        return pace


__all__ = ["MARGIN", "MAX_DEADLINE", "PACE_KEYS", "SAMPLES", "Pace", "Paces", "Sample"]
