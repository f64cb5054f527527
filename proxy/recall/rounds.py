"""The recall rounds of one request: each call answered from the client's own
originals, the next round's request built, the bounds held.

Bounds, per model (:class:`compaction.Profile`): ``recall_rounds`` answered
rounds (the last follow-up no longer offers the recall tool, so the client
gets an answer or a call to one of its own tools, never one to a tool it
never declared), ``recall_slice_chars`` per answer, ``recall_max_tokens``
added to a request over all its rounds (the model's turns and the tool's
answers) — and never more than the room the request has left under its input
limit (:class:`~proxy.recall.plan.Plan`). An unknown ref, or one of another
caller (refs are keyed by the caller), is answered "not found" alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import orjson

from compaction import RecallRequest, TokenCounter, find_original, parse_request, recalled_text
from proxy.dialects.recall import RecallCall, Usage
from proxy.edge.errors import ProxyError
from proxy.recall.memory import RecallMemory
from proxy.recall.plan import Plan

#: Recalled text too short to be worth a round is not sent: the model is told
#: the budget is spent instead.
_MIN_ROOM = 64
#: What the client is told when the model recalled past the last round.
PAST_LIMIT = "The upstream called a tool the last request no longer offered."


class RecallLimit(ProxyError):
    """The upstream went on calling ``compaction_recall`` in the last round,
    which no longer offered it, or its calling turn left no room for another
    round: there is no answer to give.

    Its message, like :class:`RecallFailed`'s, never names the tool or a ref:
    the client never declared either."""

    status = 502
    type = "upstream_error"
    code = "recall_limit"


class RecallFailed(ProxyError):
    """The upstream refused a follow-up round (its body, which may quote the
    hidden tool's exchange, is logged by status only and never relayed)."""

    status = 502
    type = "upstream_error"
    code = "recall_failed"

    def __init__(self, status: int) -> None:
        super().__init__(f"The upstream refused a follow-up request ({status}).")


@dataclasses.dataclass
class Rounds:
    """The recall rounds of one request: what was answered, and what is left."""

    plan: Plan
    counter: TokenCounter
    #: The request sent in the current round, and the exchanges appended so far.
    body: dict[str, Any]
    exchanges: list[Any] = dataclasses.field(default_factory=list)
    answered: int = 0  #: rounds answered
    outcomes: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Tokens the rounds added to the request: the model's turns and the
    #: tool's answers (held to ``plan.room``).
    used: int = 0
    earlier: Usage = dataclasses.field(default_factory=Usage)

    @property
    def exhausted(self) -> bool:
        return self.answered >= self.plan.rounds

    def count(self, outcome: str, n: int = 1) -> None:
        if n:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n

    def answer(self, calls: Sequence[RecallCall]) -> list[tuple[RecallCall, str]]:
        """What the tool says to each call."""
        return [(call, self._one(call)) for call in calls]

    def _one(self, call: RecallCall) -> str:
        request = parse_request(call.arguments)
        if isinstance(request, str):
            self.count("invalid")
            return request
        left = self.plan.room - self.used
        if left < _MIN_ROOM:
            self.count("budget")
            return (
                "The recall budget of this turn is spent; go on with what you have, "
                "or recall a smaller line range next turn."
            )
        original = find_original(self.plan.messages, self.plan.salt, request.ref)
        text = self._within(original, request, left)
        self.count("answered" if original is not None else "not_found")
        self.used += self.counter.count_text(text)
        return text

    def _within(self, original: str | None, request: RecallRequest, left: int) -> str:
        """The answer to ``request``, cut to the tokens ``left``."""
        chars = self.plan.slice_chars
        text = recalled_text(original, request, chars)
        tokens = self.counter.count_text(text)
        while tokens > left and chars > 200:
            chars = max(200, int(chars * left / tokens * 0.9))
            text = recalled_text(original, request, chars)
            tokens = self.counter.count_text(text)
        return text

    def follow(self, answer: dict[str, Any], calls: Sequence[RecallCall]) -> bytes:
        """The next round's request: the exchange appended, and — on the last
        round the model may have — no more tool calls allowed.

        The model's turn is appended with the answers, so it is counted
        against the room first; the answers get what is left.
        """
        surface = self.plan.surface
        _, bare = surface.followup(self.body, answer, [(call, "") for call in calls])
        self.used += sum(self.counter.count_text(orjson.dumps(item).decode()) for item in bare)
        if self.used > self.plan.room:
            raise RecallLimit(
                "The model's turn leaves no room under the request's limits for another round."
            )
        results = self.answer(calls)
        self.answered += 1
        self.earlier = self.earlier + surface.usage(answer)
        body, added = surface.followup(self.body, answer, results)
        self.exchanges.extend(added)
        self.body = body
        if self.exhausted:
            body = surface.without_tool(body)
        return orjson.dumps(body)

    def remember(self, memory: RecallMemory) -> None:
        """Keep the exchanges for the conversation's next turn."""
        if not self.exchanges:
            return
        items = self.plan.body[self.plan.surface.items_key]
        memory.remember(self.plan.owner, items, self.exchanges)


__all__ = ["PAST_LIMIT", "RecallFailed", "RecallLimit", "Rounds"]
