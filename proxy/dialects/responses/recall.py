"""OpenAI Responses' side of recall (:mod:`proxy.dialects.recall`).

The tool is a ``function`` tool appended to ``tools``; the model calls it with
a ``function_call`` output item, and its answer goes back as a
``function_call_output`` item after the model's own items in ``input``.

A stream is a sequence of typed events (``event:`` + ``data:`` lines, split by
:class:`sse.EventSplitter`), each numbered by ``sequence_number``; the events
of one output item carry its ``output_index`` (and ``item_id``).
:class:`ResponsesRecallStream` relays each event as soon as it is whole, and
hides the events of a ``function_call`` named ``compaction_recall``
(``response.output_item.added`` tells its name, the events after it are
matched by ``output_index`` or ``item_id``)::

    round 1:  created  in_progress  item 0 (reasoning)  item 1 (recall) …  completed
    relayed:  created  in_progress  item 0              ·                  ·
    round 2:  created  in_progress  item 0 (message)                       completed
    relayed:  ·        ·            item 1                                 completed (items 0, 1)

Once a recall item starts, the rest of the round is read, not relayed: its
``response.completed`` is the whole answer the next round is built from.
Every later round continues the client's one stream: no second
``response.created`` / ``response.in_progress`` (nor ``response.queued``),
each ``output_index`` moved past the items relayed before, every
``sequence_number`` rewritten to follow the last one relayed, and the last
``response.completed`` carrying the earlier rounds' relayed items first and
the usage of all rounds. Its ``id`` is the one the client read in
``response.created``: the ``openai`` SDK's stream reader refuses a lifecycle
event naming another response ("Lifecycle response identity changed"). With
``store: false`` (Codex) no response is kept under any id; a stored one is
kept under the last round's, which the client does not see (the proxy never
compacts a request continuing from a ``previous_response_id``).

A recall item after one of the client's calls was relayed in the same round
is dropped instead (:attr:`ResponsesRecallStream.dropped`): the items after
it move down one index, and the round's ``response.completed`` is relayed
without it. So is one that starts once the round has passed what is kept of
it (its done items and its response, :data:`sse.MAX_KEPT_BYTES`), or after an
event too long to hold (:data:`sse.MAX_EVENT_BYTES`), which is relayed in
pieces as it comes (hidden with its item, or in a round that recalled).

Only events whose bytes name one of the types that matter are parsed; the
others (text deltas above all) cost a regular-expression search, and are
passed on as the upstream's own bytes while nothing has to be renumbered.
Renumbering edits the two numbers in place, without a parse: inside a JSON
string every ``"`` is escaped, so ``"output_index":`` and
``"sequence_number":`` can only be keys (the top-level ones; no nested object
of an event has them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from compaction import RECALL_TOOL_DESCRIPTION, RECALL_TOOL_NAME, RECALL_TOOL_PARAMETERS
from proxy.dialects import sse
from proxy.dialects.recall import (
    RecallCall,
    RecallSurface,
    Usage,
    token_count,
    without_recall_tool,
)

#: The tool as the request declares it, the same object (and so the same
#: bytes) on every request, so the provider's prompt cache keeps hitting.
RECALL_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "name": RECALL_TOOL_NAME,
    "description": RECALL_TOOL_DESCRIPTION,
    "parameters": RECALL_TOOL_PARAMETERS,
    "strict": False,
}

#: Output items that call one of the client's tools, which the client runs and
#: answers with an output item of its own. Hosted tools' items
#: (``web_search_call``, ``file_search_call``, ``mcp_call``…) are done by the
#: time they are sent: they stay in the model's turn like its text.
CLIENT_CALLS: Final = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "computer_call",
        "mcp_approval_request",
    }
)

#: The events this reader acts on; any other is relayed unparsed.
_TYPE = re.compile(
    rb'"(response\.(?:output_item\.(?:added|done)|completed|incomplete|failed'
    rb'|created|queued|in_progress))"'
)
_STARTS = (b"response.created", b"response.queued", b"response.in_progress")
_INDEX = re.compile(rb'"output_index"\s*:\s*(\d+)')
_NUMBER = re.compile(rb'"sequence_number"\s*:\s*(\d+)')
_ITEM_ID = re.compile(rb'"item_id"\s*:\s*"([^"\\]*)"')


def _is_recall(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("type") == "function_call"
        and item.get("name") == RECALL_TOOL_NAME
    )


def _is_client_call(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") in CLIENT_CALLS and not _is_recall(item)


def _usage(response: Any) -> Usage:
    usage = response.get("usage") if isinstance(response, dict) else None
    return Usage(token_count(usage, "input_tokens"), token_count(usage, "output_tokens"))


def _with_usage(response: dict[str, Any], earlier: Usage) -> dict[str, Any]:
    """``response`` with ``earlier`` added to its usage (the details are its own)."""
    usage = response.get("usage")
    own = usage if isinstance(usage, dict) else {}
    prompt, output = token_count(own, "input_tokens"), token_count(own, "output_tokens")
    total = token_count(own, "total_tokens") if "total_tokens" in own else prompt + output
    summed = {
        **own,
        "input_tokens": prompt + earlier.prompt,
        "output_tokens": output + earlier.output,
        "total_tokens": total + earlier.prompt + earlier.output,
    }
    return {**response, "usage": summed}


def _conversation(sent: dict[str, Any]) -> list[Any]:
    """``sent``'s input as a list: a string is the one user message it stands for
    (as :mod:`proxy.dialects.responses` reads it)."""
    items = sent.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return list(items) if isinstance(items, list) else []


def _turn(sent: dict[str, Any], answer: dict[str, Any]) -> list[Any]:
    """The model's items to send back: all but the calls of the client's tools.

    With ``store: false`` nothing the API returned is kept upstream, so a
    reasoning item without ``encrypted_content`` is only its id, which the
    API refuses ("Item with id 'rs_…' not found"): it is left out.
    """
    output = answer.get("output")
    unstored = sent.get("store") is False
    return [
        item
        for item in (output if isinstance(output, list) else ())
        if not _is_client_call(item)
        and not (
            unstored
            and isinstance(item, dict)
            and item.get("type") == "reasoning"
            and not item.get("encrypted_content")
        )
    ]


class ResponsesRecall:
    """The :class:`~proxy.dialects.recall.RecallSurface` of OpenAI Responses."""

    items_key = "input"

    def with_tool(self, body: dict[str, Any]) -> dict[str, Any] | None:
        tools = body.get("tools")
        if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
            return None
        if any(isinstance(tool, dict) and tool.get("name") == RECALL_TOOL_NAME for tool in tools):
            return None
        return {**body, "tools": [*tools, RECALL_TOOL]}

    def calls(self, answer: dict[str, Any]) -> list[RecallCall]:
        output = answer.get("output")
        return [
            RecallCall(str(item.get("call_id", "")), _text(item.get("arguments")))
            for item in (output if isinstance(output, list) else ())
            if _is_recall(item)
        ]

    def followup(
        self,
        sent: dict[str, Any],
        answer: dict[str, Any],
        results: Sequence[tuple[RecallCall, str]],
    ) -> tuple[dict[str, Any], list[Any]]:
        outputs = [
            {"type": "function_call_output", "call_id": call.id, "output": text}
            for call, text in results
        ]
        exchange = [*_turn(sent, answer), *outputs]
        return {**sent, "input": [*_conversation(sent), *exchange]}, exchange

    def without_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        return without_recall_tool(body)

    def usage(self, answer: dict[str, Any]) -> Usage:
        return _usage(answer)

    def final(self, answer: dict[str, Any], earlier: Usage) -> dict[str, Any]:
        return _with_usage(answer, earlier)

    def stream(self) -> ResponsesRecallStream:
        return ResponsesRecallStream()


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


class ResponsesRecallStream(sse.RoundReader):
    """One client stream over the rounds of its answer (see the module doc)."""

    def __init__(self, **bounds: int) -> None:
        super().__init__(**bounds)  # max_event_bytes, max_kept_bytes
        self._earlier: list[Any] = []  # items relayed in earlier rounds
        self._earlier_usage = Usage()
        self._renumber = False  # sequence numbers are rewritten
        self._number: int | None = None  # the next sequence number to write
        self._last = b""  # the last event relayed
        self._id: Any = None  # the response id the client read first
        self._round = 0
        self._new_round()

    def _new_round(self) -> None:
        self._client_call = False  # a client call was relayed in this round
        self._hidden: set[int] = set()  # output indices of recall items
        self._hidden_ids: set[str] = set()
        self._relayed: dict[int, Any] = {}  # output index → item, as relayed
        self._open: set[int] = set()  # relayed items not done yet
        self._done: dict[int, Any] = {}  # every item done in this round
        self._started: dict[str, Any] | None = None
        self._ended: dict[str, Any] | None = None
        self._completed = False
        self._relaying_pieces = True  # the event too long to hold now coming is relayed

    def answer(self) -> dict[str, Any]:
        if self._completed and self._ended is not None:
            return self._ended
        base = self._ended or self._started or {"object": "response"}
        return {**base, "output": [self._done[i] for i in sorted(self._done)]}

    def next_round(self) -> None:
        ended = self._ended.get("output") if self._ended else None
        output = ended if isinstance(ended, list) else []
        for index, item in sorted(self._relayed.items()):
            if index in self._done:
                item = self._done[index]
            elif index < len(output):
                item = output[index]
            self._earlier.append(item)
        self._earlier_usage += _usage(self.answer())
        self._start_renumbering()
        self._next_round_events()
        self._round += 1
        self._new_round()

    # --- events ------------------------------------------------------------

    def _whole(self, raw: bytes) -> bytes:
        found = _TYPE.search(raw)
        read = sse.fields(raw) if found else None
        data = read.json_object() if read is not None else None
        if read is None or data is None:
            return self._other(raw)
        kind = found.group(1) if found else b""
        if kind in _STARTS:
            response = data.get("response")
            if isinstance(response, dict):
                if self._id is None:
                    self._id = response.get("id")
                if self._keeps(raw):
                    self._started = response
            # A later round's start is not news to the client: its stream goes on.
            return b"" if self._round else self._relay(raw)
        if kind == b"response.output_item.added":
            return self._added(raw, data)
        if kind == b"response.output_item.done":
            return self._item_done(raw, data)
        return self._end(raw, data, kind == b"response.completed", read.name)

    def _piece(self, event: sse.Event) -> bytes:
        """A piece of an event too long to hold: relayed as it comes, unless its
        item is hidden or its round recalled; the round can no longer recall."""
        if event.piece == 1:
            self._stop_keeping()
            self._relaying_pieces = not self._hides(event.raw)
        return self._relay(event.raw) if self._relaying_pieces else b""

    def _stop_keeping(self) -> None:
        super()._stop_keeping()
        if not self._recalled:  # the round cannot recall: its answer is not needed
            self._done.clear()
            self._started = self._ended = None

    def _added(self, raw: bytes, data: dict[str, Any]) -> bytes:
        index, item = data.get("output_index"), data.get("item")
        if self._recalled:
            return b""
        if _is_recall(item):
            self._hide(index, item)
            if self._client_call or not self._keeping:
                self._dropped += 1
            else:
                self._recalled = True
            return b""
        if isinstance(index, int):
            self._relayed[index] = item
            self._open.add(index)
        self._client_call = self._client_call or _is_client_call(item)
        return self._relay(raw)

    def _item_done(self, raw: bytes, data: dict[str, Any]) -> bytes:
        index, item = data.get("output_index"), data.get("item")
        if isinstance(index, int) and self._keeps(raw):
            self._done[index] = item
        if self._is_hidden(index, item.get("id") if isinstance(item, dict) else None):
            return b""
        if self._recalled and index not in self._open:
            return b""
        if isinstance(index, int):
            self._open.discard(index)
        return self._relay(raw)

    def _end(self, raw: bytes, data: dict[str, Any], completed: bool, name: str | None) -> bytes:
        response = data.get("response")
        if isinstance(response, dict) and self._keeps(raw):
            self._ended, self._completed = response, completed
        if self._recalled:
            return b""
        if not isinstance(response, dict) or not (self._round or self._hidden):
            return self._relay(raw)
        output = response.get("output")
        kept = [
            item
            for index, item in enumerate(output if isinstance(output, list) else ())
            if not self._is_hidden(index, item.get("id") if isinstance(item, dict) else None)
        ]
        response = {**response, "output": [*self._earlier, *kept]}
        if self._round:
            response = _with_usage(response, self._earlier_usage)
            if self._id is not None:
                response["id"] = self._id
        data = {**data, "response": response}
        if self._renumber and isinstance(data.get("sequence_number"), int):
            data["sequence_number"] = self._next_number(data["sequence_number"])
        out = sse.json_frame(data, name)
        self._last = out
        return out

    def _other(self, raw: bytes) -> bytes:
        """An event of an item (a delta), of the response, or a blank line."""
        if not raw.strip(b"\r\n"):
            return raw
        return b"" if self._hides(raw) else self._relay(raw)

    def _hides(self, raw: bytes) -> bool:
        """Whether an event read by its bytes alone belongs to a hidden item, or to
        none the client has open in a round that recalled."""
        if not (self._hidden or self._recalled):
            return False
        found = _INDEX.search(raw)
        index = int(found.group(1)) if found else None
        item_id = None
        if index is None and self._hidden_ids:
            named = _ITEM_ID.search(raw)
            item_id = named.group(1).decode() if named else None
        return self._is_hidden(index, item_id) or (self._recalled and index not in self._open)

    # --- hiding and renumbering --------------------------------------------

    def _hide(self, index: Any, item: Any) -> None:
        if isinstance(index, int):
            self._hidden.add(index)
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            self._hidden_ids.add(item["id"])
        self._start_renumbering()

    def _is_hidden(self, index: Any, item_id: Any) -> bool:
        return index in self._hidden or (item_id is not None and item_id in self._hidden_ids)

    def _start_renumbering(self) -> None:
        """From now on every relayed event follows the last one relayed."""
        if self._renumber:
            return
        self._renumber = True
        found = _NUMBER.search(self._last)
        self._number = int(found.group(1)) + 1 if found else None

    def _next_number(self, own: int) -> int:
        if self._number is None:  # nothing numbered relayed yet: its own goes
            self._number = own
        number, self._number = self._number, self._number + 1
        return number

    def _relay(self, raw: bytes) -> bytes:
        if self._earlier or self._hidden:
            raw = _INDEX.sub(self._client_index, raw, count=1)
        if self._renumber:
            raw = _NUMBER.sub(self._renumbered, raw, count=1)
        self._last = raw
        return raw

    def _client_index(self, found: re.Match[bytes]) -> bytes:
        index = int(found.group(1))
        moved = index + len(self._earlier) - sum(1 for h in self._hidden if h < index)
        return _replace(found, moved)

    def _renumbered(self, found: re.Match[bytes]) -> bytes:
        return _replace(found, self._next_number(int(found.group(1))))


def _replace(found: re.Match[bytes], number: int) -> bytes:
    """The matched ``"key": n`` with ``number`` in place of ``n``."""
    head = found.group(0)[: found.start(1) - found.start(0)]
    return head + str(number).encode()


#: The Responses surface; stateless (each stream has its own reader).
RESPONSES_RECALL: Final[RecallSurface] = ResponsesRecall()

__all__ = [
    "CLIENT_CALLS",
    "RECALL_TOOL",
    "RESPONSES_RECALL",
    "ResponsesRecall",
    "ResponsesRecallStream",
]
