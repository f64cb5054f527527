"""What each API answers for recall: the tool the proxy adds, and its calls read back.

Once compaction has shortened a conversation, the proxy adds one tool,
``compaction_recall`` (:mod:`compaction.recall`), to a request that declares
tools, and answers the model's calls to it itself (:mod:`proxy.recall`).
The loop is the same for every API; what differs — how a tool is declared,
where a call sits in an answer, how its result is written, how a stream is
continued over several upstream answers — is each dialect's
:class:`RecallSurface`.

A stream is read through a :class:`RecallStream`: every event is relayed as
soon as it is whole, but for the events of a call to ``compaction_recall``.
Once such a call starts, the rest of that answer (a *round*) is read, not
relayed, and put together as a whole answer to build the next round from;
the next round's events are rewritten so that the client reads one stream.
A recall call that comes after one of the client's own tool calls was already
relayed is dropped: answering it would mean showing the client that call twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from compaction import RECALL_TOOL_NAME


@dataclass(frozen=True)
class RecallCall:
    """One call the model made to ``compaction_recall``."""

    #: The API's id of the call (``tool_calls[].id``, ``tool_use.id``,
    #: ``function_call.call_id``), which its result names.
    id: str
    #: The arguments as the model wrote them (JSON text).
    arguments: str


@dataclass(frozen=True)
class Usage:
    """What one round cost, as the API counts it."""

    prompt: int = 0  #: the input (Anthropic: ``input_tokens`` alone)
    output: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt + other.prompt, self.output + other.output)


def token_count(usage: Any, key: str) -> int:
    """The count an API's usage object gives under ``key``; 0 when there is no
    such object, no such key, or no whole number there."""
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _name(tool: Any) -> Any:
    return tool.get("name") if isinstance(tool, dict) else None


def without_recall_tool(body: dict[str, Any], name: Callable[[Any], Any] = _name) -> dict[str, Any]:
    """``body`` with every tool ``name`` calls ``compaction_recall`` left out of
    ``tools`` (by default its ``name``: Anthropic's and Responses' shape).

    The history keeps the model's calls to it: none of the three APIs checks
    a call in the history against the tools declared (Anthropic asks only
    that ``tools`` be there at all when the history holds ``tool_use``
    blocks, and the client's own are). A ``tool_choice`` of none would have
    forbidden the client's tools too, and the model would have ended the
    client's turn with text where it meant to go on working. The tools block
    differs from the earlier rounds', so this round is not served from their
    prompt cache: the price of a rare round, the one after ``recall_rounds``.
    """
    tools = body.get("tools")
    if not isinstance(tools, list):
        return dict(body)
    return {**body, "tools": [tool for tool in tools if name(tool) != RECALL_TOOL_NAME]}


class RecallStream(Protocol):
    """Reads one client stream over the rounds of its answer."""

    def feed(self, chunk: bytes) -> bytes:
        """Take the upstream's next chunk of the current round; return the bytes to
        relay now: whole events, each the upstream's own bytes unless rewritten to
        continue the client's stream."""
        ...

    @property
    def recalled(self) -> bool:
        """Whether the current round called ``compaction_recall`` (to be answered)."""
        ...

    @property
    def dropped(self) -> int:
        """Recall calls left out because a client tool call was relayed before them."""
        ...

    def answer(self) -> dict[str, Any]:
        """The current round put together as a whole answer (once its stream ended)."""
        ...

    def next_round(self) -> None:
        """The chunks fed next are the next round's; they continue the client's stream."""
        ...

    def end(self) -> bytes:
        """What to relay when the current round's stream ended (a held partial event)."""
        ...


class RecallSurface(Protocol):
    """One API's side of recall (see the module doc)."""

    #: The request's conversation list: ``"messages"`` or ``"input"``.
    items_key: str

    def with_tool(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """``body`` with the recall tool appended at the end of ``tools``, in bytes
        that never change; ``None`` when the body declares no tools or already has
        one of that name."""
        ...

    def calls(self, answer: dict[str, Any]) -> list[RecallCall]:
        """The recall calls in a whole answer, in order."""
        ...

    def followup(
        self,
        sent: dict[str, Any],
        answer: dict[str, Any],
        results: Sequence[tuple[RecallCall, str]],
    ) -> tuple[dict[str, Any], list[Any]]:
        """The next round's request: ``sent`` with the model's turn from ``answer``
        (its recall calls, no other tool call, everything else as the API returned
        it) and one result per call appended to its conversation; and the items
        appended (the exchange, put back on the conversation's next turn)."""
        ...

    def without_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` for the last recall round: the recall tool taken out of
        ``tools``, everything else — the client's tools, its ``tool_choice`` —
        as it was, so the model may still call the client's tools but can
        recall no more (see :func:`without_recall_tool`)."""
        ...

    def usage(self, answer: dict[str, Any]) -> Usage:
        """What the round of a whole answer cost."""
        ...

    def final(self, answer: dict[str, Any], earlier: Usage) -> dict[str, Any]:
        """The whole answer the client gets: the last round's ``answer``, with the
        ``earlier`` rounds' usage added to its own."""
        ...

    def stream(self) -> RecallStream:
        """A fresh reader for one client stream."""
        ...


__all__ = [
    "RecallCall",
    "RecallStream",
    "RecallSurface",
    "Usage",
    "token_count",
    "without_recall_tool",
]
