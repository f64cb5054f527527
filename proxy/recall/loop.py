"""The loop that answers the model's recall calls: the rounds of one answer,
as the relay reads them.

The relay (:class:`proxy.flow.relay.Relay`) gives the client one answer;
this is where that answer's rounds come from. A round that calls
``compaction_recall`` is answered here (:class:`~proxy.recall.rounds.Rounds`)
and the upstream asked again; the client gets the last answer:

* whole (:meth:`RecallLoop.next_answer`): each round is read, answered and
  asked again until an answer makes no recall, which is given with the
  rounds' usage summed;
* streamed: every round's events pass through the dialect's
  :class:`~proxy.dialects.recall.RecallStream` (:meth:`RecallLoop.feed`), which
  holds back only the events of a recall call; once a round has ended
  (:meth:`RecallLoop.next_round`), the next one continues the same client
  stream.

A bound crossed or a round refused is raised as the proxy's error
(:class:`~proxy.recall.rounds.RecallLimit`, ``RecallFailed``, an unreachable
upstream); the relay answers it in the API's shape, a whole answer's error or
a stream's error event.

The next rounds are asked of a :class:`NextRounds`, one object with one
method, and not of the ``Upstream`` service's transport: a next round is more
of the client's request, so it goes the way the request went — counted in
flight on its upstream (a one-slot server runs no background summary beside
it), timed in the metrics, an error answer counted in the request's figures,
given up when the client leaves — which is what the request's own sending
does (:class:`proxy.flow.exchange.FollowUps`, over ``Exchange.send``) and the
transport alone does not. An object rather than a callback closed over the
handler: what it holds is named where it is made (the request's exchange and
its Call), and this loop needs nothing else of either.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from proxy.recall.memory import RecallMemory
from proxy.recall.rounds import PAST_LIMIT, RecallLimit, Rounds
from proxy.upstream.transport import UpstreamResponse


class NextRounds(Protocol):
    """Where a recalling answer's next rounds are asked (see the module doc)."""

    async def ask(self, body: bytes) -> UpstreamResponse:
        """Send ``body``, the next round's request, upstream; its answer, once
        its head is in (a refusal is raised, never returned)."""
        ...


class Tap(Protocol):
    """Reads the first round's usage as it passes (:class:`proxy.flow.usage.UsageTap`)."""

    def feed(self, chunk: bytes) -> None: ...

    def close(self) -> None: ...


class RecallLoop:
    """The rounds of one answer sent with the recall tool (see the module doc).

    ``tap`` sees the first round only: the usage the request's bill and the
    upstream's ratio are read from is that of what the client's request sent.
    """

    def __init__(
        self,
        rounds: Rounds,
        upstream: NextRounds,
        tap: Tap,
        memory: RecallMemory,
        *,
        streamed: bool,
    ) -> None:
        self.rounds = rounds
        #: Whether the client reads the rounds as one stream, or a whole answer.
        self.streamed = streamed
        self._upstream = upstream
        self._tap: Tap | None = tap
        self._memory = memory
        self._stream = rounds.plan.surface.stream()

    def feed(self, chunk: bytes) -> bytes:
        """The current round's next chunk; the bytes to relay now."""
        if self._tap is not None:
            self._tap.feed(chunk)
        return self._stream.feed(chunk)

    def end(self) -> bytes:
        """The current round's stream ended; what it still holds to relay."""
        return self._stream.end()

    def restart(self) -> None:
        """The first round is asked again, its stream having said nothing: the
        next chunks are its answer's, read from the start."""
        self._stream = self.rounds.plan.surface.stream()

    async def next_round(self) -> UpstreamResponse | None:
        """After a round's stream ended as its API ends one: the next round,
        or ``None`` when the client's answer is whole."""
        if self._tap is not None:
            self._tap.close()
            self._tap = None
        rounds, stream = self.rounds, self._stream
        rounds.count("dropped", stream.dropped)
        if not stream.recalled:
            rounds.remember(self._memory)
            return None
        answer = stream.answer()
        calls = rounds.plan.surface.calls(answer)
        if rounds.exhausted or not calls:
            rounds.count("limit", len(calls))
            raise RecallLimit(PAST_LIMIT)
        upstream = await self._upstream.ask(rounds.follow(answer, calls))
        stream.next_round()
        return upstream

    async def next_answer(self, body: bytes) -> UpstreamResponse | bytes:
        """After a whole round, ``body``: the next round, or the client's answer."""
        if self._tap is not None:
            self._tap.feed(body)
            self._tap.close()
            self._tap = None
        rounds, surface = self.rounds, self.rounds.plan.surface
        answer = _json(body)
        calls = surface.calls(answer) if answer is not None else []
        if answer is None or not calls:
            rounds.remember(self._memory)
            if answer is None or not rounds.answered:
                return body
            return orjson.dumps(surface.final(answer, rounds.earlier))
        if rounds.exhausted:
            rounds.count("limit", len(calls))
            raise RecallLimit(PAST_LIMIT)
        return await self._upstream.ask(rounds.follow(answer, calls))


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


__all__ = ["NextRounds", "RecallLoop", "Tap"]
