"""Anthropic Messages' side of recall (:mod:`proxy.dialects.recall`).

The tool is declared as the API declares any client tool (``name``,
``description``, ``input_schema``), appended after the client's own — after
a ``cache_control`` the client put on its last tool too, so no breakpoint
moves. A call is a ``tool_use`` block of the answer's ``content``; its result
is a ``tool_result`` block, all of one turn's results in one user message.

A stream is a run of named events (``event: x`` / ``data: {...}`` / blank
line), split by :class:`sse.EventSplitter`. Each is relayed as soon as its
blank line arrives, in the upstream's own bytes, unless it must be rewritten:

* the first round is relayed untouched until a ``content_block_start`` of a
  ``tool_use`` named ``compaction_recall``; from there the round is read and
  not relayed (:attr:`AnthropicRecallStream.recalled`). Only block starts are
  parsed until then: a text delta costs a few substring tests, and the round's
  raw events are kept to put the whole answer together only if it is needed;
* a recall block that starts after a client ``tool_use`` block was relayed
  cannot be answered (the client already has its turn's tool call): its events
  are left out (:attr:`~AnthropicRecallStream.dropped`) and the blocks after it
  renumbered so the client sees contiguous indices;
* a later round continues the client's one message: its ``message_start`` is
  left out (the client has had one), every block index is moved past the
  blocks already relayed, and ``message_delta``'s usage counts the earlier
  rounds' output (and input, where the event carries it) as well.

``error`` and ``ping`` events are always relayed; a recalled round's
``message_delta`` and ``message_stop`` never are, since the message goes on.

What a round keeps is bounded (:data:`sse.MAX_KEPT_BYTES`): past it, a recall
block that starts later is dropped like one after a client call. An event too
long to hold (:data:`sse.MAX_EVENT_BYTES`) is relayed in pieces as it comes
(its block's index moved, or left out with its block), and its round can no
longer recall; in a round that has recalled, it stays hidden.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from compaction import RECALL_TOOL_DESCRIPTION, RECALL_TOOL_NAME, RECALL_TOOL_PARAMETERS
from proxy.dialects import sse
from proxy.dialects.recall import (
    RecallCall,
    RecallSurface,
    Usage,
    token_count,
    without_recall_tool,
)

#: The recall tool as the API declares a client tool; the same object, and so
#: the same bytes, in every request it is added to.
RECALL_TOOL: Final[dict[str, Any]] = {
    "name": RECALL_TOOL_NAME,
    "description": RECALL_TOOL_DESCRIPTION,
    "input_schema": RECALL_TOOL_PARAMETERS,
}

#: The block index in the first piece of an event too long to parse. Inside a
#: JSON string every quote is escaped, so this can only be a key, and the
#: API writes the top-level ``index`` before the delta.
_INDEX_KEY = re.compile(rb'"index"\s*:\s*(\d+)')

# What an event's bytes must hold to be worth parsing. Inside a JSON string a
# quote is escaped, so a model's text cannot hold one of these.
_BLOCK_START = b'"content_block_start"'
_MESSAGE_START = b'"message_start"'
_MESSAGE_DELTA = b'"message_delta"'
_INDEX = b'"index"'
_ALWAYS_RELAYED = (b'"error"', b'"ping"')


class AnthropicRecall:
    """The :class:`~proxy.dialects.recall.RecallSurface` of ``POST /v1/messages``."""

    items_key: str = "messages"

    def with_tool(self, body: dict[str, Any]) -> dict[str, Any] | None:
        tools = body.get("tools")
        if not isinstance(tools, list) or not tools:
            return None
        if any(isinstance(tool, dict) and tool.get("name") == RECALL_TOOL_NAME for tool in tools):
            return None
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "none":
            return None  # the model may call no tool at all
        # Server tools (web search, code execution) stay where the client put them.
        return {**body, "tools": [*tools, RECALL_TOOL]}

    def calls(self, answer: dict[str, Any]) -> list[RecallCall]:
        return [
            RecallCall(str(block.get("id", "")), orjson.dumps(block.get("input", {})).decode())
            for block in _content(answer)
            if _is_recall(block)
        ]

    def followup(
        self,
        sent: dict[str, Any],
        answer: dict[str, Any],
        results: Sequence[tuple[RecallCall, str]],
    ) -> tuple[dict[str, Any], list[Any]]:
        """``sent`` with the model's turn and the results appended.

        The turn keeps every block as the API returned it (thinking and
        redacted thinking with their signatures: the API checks them) but the
        client's own tool calls, which the next round may make again, a recall
        call given no result (the API refuses a call left unanswered), and text
        blocks of nothing but white space, which it refuses too. ``sent`` is
        expected to end with a user turn: were it an assistant prefill, the body
        returned would hold two assistant turns in a row, which the API refuses.
        """
        answered = {call.id for call, _ in results}
        kept = [block for block in _content(answer) if _kept(block, answered)]
        turn = {"role": "assistant", "content": kept}
        replies = {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": text}
                for call, text in results
            ],
        }
        exchange: list[Any] = [turn, replies]
        messages = sent.get(self.items_key)
        before = messages if isinstance(messages, list) else []
        return {**sent, self.items_key: [*before, *exchange]}, exchange

    def without_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        return without_recall_tool(body)

    def usage(self, answer: dict[str, Any]) -> Usage:
        usage = answer.get("usage")
        if not isinstance(usage, dict):
            return Usage()
        return Usage(token_count(usage, "input_tokens"), token_count(usage, "output_tokens"))

    def final(self, answer: dict[str, Any], earlier: Usage) -> dict[str, Any]:
        usage = answer.get("usage")
        own = usage if isinstance(usage, dict) else {}
        summed = {
            **own,
            "input_tokens": token_count(own, "input_tokens") + earlier.prompt,
            "output_tokens": token_count(own, "output_tokens") + earlier.output,
        }
        return {**answer, "usage": summed}

    def stream(self) -> AnthropicRecallStream:
        return AnthropicRecallStream()


@dataclass(frozen=True)
class _Event:
    """One whole event: its bytes as they came, its name, and its data when JSON."""

    raw: bytes
    name: str | None
    data: dict[str, Any] | None

    @property
    def kind(self) -> str | None:
        kind = self.data.get("type") if self.data is not None else None
        return kind if isinstance(kind, str) else self.name

    def index(self) -> int | None:
        index = self.data.get("index") if self.data is not None else None
        return index if isinstance(index, int) and not isinstance(index, bool) else None

    def rewritten(self, **changes: Any) -> bytes:
        assert self.data is not None
        return sse.json_frame({**self.data, **changes}, self.name)


@dataclass
class _Round:
    """What one round's stream showed so far."""

    #: Every event's bytes, from the round's first: the answer is put together
    #: from them only when the round recalled.
    events: list[bytes] = field(default_factory=list)
    #: Whether the pieces of the event too long to hold now coming are relayed.
    relaying_pieces: bool = True
    #: Where each relayed block is in the client's stream, by the upstream's index.
    placed: dict[int, int] = field(default_factory=dict)
    #: Upstream indices of the recall blocks left out of the stream.
    left_out: set[int] = field(default_factory=set)
    client_tool: bool = False


class AnthropicRecallStream(sse.RoundReader):
    """Relays one client's Messages stream over the rounds of its answer."""

    def __init__(self, **bounds: int) -> None:
        super().__init__(**bounds)  # max_event_bytes, max_kept_bytes
        self._round = _Round()
        self._rounds = 0  # rounds before this one
        #: Blocks the client got in earlier rounds: this round's first index.
        self._offset = 0
        self._earlier = Usage()

    def next_round(self) -> None:
        done = self.answer()
        self._earlier += ANTHROPIC_RECALL.usage(done)
        self._offset += len(self._round.placed)
        self._rounds += 1
        self._round = _Round()
        self._next_round_events()

    def answer(self) -> dict[str, Any]:
        return _assemble([_read(raw) for raw in self._round.events])

    # --- one event ------------------------------------------------------------

    def _whole(self, raw: bytes) -> bytes:
        now = self._round
        if self._keeps(raw):
            now.events.append(raw)
        if self._recalled:
            return self._hidden(raw)
        later = self._rounds > 0
        renumbering = self._offset > 0 or bool(now.left_out)
        if not (
            _BLOCK_START in raw
            or (later and (_MESSAGE_START in raw or _MESSAGE_DELTA in raw))
            or (renumbering and _INDEX in raw)
        ):
            return raw
        event = _read(raw)
        kind = event.kind
        if kind == "content_block_start":
            return self._block_start(event)
        if kind == "message_start":
            return b"" if later else raw  # the client's message started in round one
        if kind == "message_delta":
            return self._message_delta(event)
        return self._placed(event)

    def _block_start(self, event: _Event) -> bytes:
        now = self._round
        index = event.index()
        block = (event.data or {}).get("content_block")
        if index is None or not isinstance(block, dict):
            return event.raw
        if _is_recall(block):
            if not now.client_tool and self._keeping:
                self._recalled = True
                return b""
            # The client has this turn's tool call already: answering the recall
            # would start a round that makes that call again, shown twice. Or
            # the round is past what is kept of it: it cannot be put together.
            now.left_out.add(index)
            self._dropped += 1
            return b""
        if _is_tool_use(block):
            now.client_tool = True
        now.placed[index] = self._offset + len(now.placed)
        return self._placed(event)

    def _placed(self, event: _Event) -> bytes:
        """A block's event at the block's place in the client's stream."""
        index = event.index()
        if index is None:
            return event.raw
        if index in self._round.left_out:
            return b""
        place = self._round.placed.get(index, index)
        return event.raw if place == index else event.rewritten(index=place)

    def _message_delta(self, event: _Event) -> bytes:
        usage = (event.data or {}).get("usage")
        if not isinstance(usage, dict) or self._earlier == Usage():
            return event.raw
        summed = {
            **usage,
            "output_tokens": token_count(usage, "output_tokens") + self._earlier.output,
        }
        if "input_tokens" in usage:
            summed["input_tokens"] = token_count(usage, "input_tokens") + self._earlier.prompt
        return event.rewritten(usage=summed)

    def _stop_keeping(self) -> None:
        super()._stop_keeping()
        if not self._recalled:
            self._round.events.clear()  # the round cannot recall: its answer is not needed

    def _piece(self, event: sse.Event) -> bytes:
        """A piece of an event too long to hold, relayed as it comes (its block's
        index moved), or left out with its block or its recalled round."""
        now = self._round
        if event.piece == 1:
            self._stop_keeping()
            found = _INDEX_KEY.search(event.raw)
            index = int(found.group(1)) if found else None
            now.relaying_pieces = not self._recalled and index not in now.left_out
            place = now.placed.get(index, index) if index is not None else None
            if found and now.relaying_pieces and place != index:
                raw = event.raw
                return raw[: found.start(1)] + str(place).encode() + raw[found.end(1) :]
        return event.raw if now.relaying_pieces else b""

    def _hidden(self, raw: bytes) -> bytes:
        """An event after the round's recall started: read, not relayed — but for
        an error, a ping, and the rest of a block relayed before (the API closes a
        block before it starts the next, so there is none unless it changes)."""
        if not (
            any(word in raw for word in _ALWAYS_RELAYED) or (self._round.placed and _INDEX in raw)
        ):
            return b""
        event = _read(raw)
        if event.kind in ("error", "ping"):
            return raw
        index = event.index()
        if (
            index is not None
            and index in self._round.placed
            and event.kind != "content_block_start"
        ):
            return self._placed(event)
        return b""


ANTHROPIC_RECALL: Final[RecallSurface] = AnthropicRecall()


def _read(raw: bytes) -> _Event:
    read = sse.fields(raw)
    return _Event(raw, read.name, read.json_object())


def _assemble(events: list[_Event]) -> dict[str, Any]:
    """A round's events as the whole answer the API would have given."""
    message: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    stop: dict[str, Any] = {"stop_reason": None, "stop_sequence": None}
    blocks: dict[int, dict[str, Any]] = {}
    inputs: dict[int, list[str]] = {}
    for event in events:
        data, kind, index = event.data or {}, event.kind, event.index()
        if kind == "message_start" and isinstance(data.get("message"), dict):
            message = data["message"]
            usage.update(message.get("usage") or {})
        elif kind == "message_delta":
            stop.update({k: v for k, v in (data.get("delta") or {}).items() if k in stop})
            usage.update(data.get("usage") or {})
        elif index is None:
            continue
        elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            blocks[index] = dict(data["content_block"])
        elif kind == "content_block_delta" and index in blocks:
            _apply(blocks[index], inputs.setdefault(index, []), data.get("delta") or {})
    for index, pieces in inputs.items():
        if pieces:
            blocks[index]["input"] = _parsed_input("".join(pieces))
    return {
        "id": message.get("id"),
        "type": "message",
        "role": "assistant",
        "model": message.get("model"),
        "content": [blocks[index] for index in sorted(blocks)],
        **stop,
        "usage": usage,
    }


def _apply(block: dict[str, Any], pieces: list[str], delta: dict[str, Any]) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + str(delta.get("text", ""))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
    elif kind == "signature_delta":
        block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
    elif kind == "input_json_delta":
        pieces.append(str(delta.get("partial_json", "")))
    elif kind == "citations_delta" and "citation" in delta:
        block["citations"] = [*(block.get("citations") or []), delta["citation"]]


def _parsed_input(text: str) -> Any:
    """A tool call's input from its streamed JSON; ``{}`` when the model wrote
    none, or something that is not an object (the API sends an object back)."""
    try:
        parsed = orjson.loads(text) if text.strip() else {}
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _content(answer: dict[str, Any]) -> list[dict[str, Any]]:
    content = answer.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _is_tool_use(block: dict[str, Any]) -> bool:
    return block.get("type") == "tool_use"


def _is_recall(block: dict[str, Any]) -> bool:
    return _is_tool_use(block) and block.get("name") == RECALL_TOOL_NAME


def _kept(block: dict[str, Any], answered: set[str]) -> bool:
    """Whether a block of the model's turn goes into the follow-up."""
    if _is_tool_use(block):
        return _is_recall(block) and block.get("id") in answered
    return not (block.get("type") == "text" and not str(block.get("text", "")).strip())


__all__ = ["ANTHROPIC_RECALL", "RECALL_TOOL", "AnthropicRecall", "AnthropicRecallStream"]
