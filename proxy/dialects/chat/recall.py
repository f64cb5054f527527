"""Chat Completions' side of recall: the tool as a ``function`` tool, its calls
in ``choices[0].message.tool_calls``, and a chunk stream continued over rounds.

A request gets :data:`RECALL_TOOL` at the end of its ``tools``; a call comes
back as ``{"id", "type": "function", "function": {"name", "arguments"}}``, and
its result goes in as ``{"role": "tool", "tool_call_id", "content"}``.

The stream (:class:`ChatRecallStream`) is ``data:`` events, each ended by a
blank line, then ``data: [DONE]``. A tool call arrives over several chunks
under one ``index``: the first names it (``id``, ``function.name``), the rest
carry pieces of its ``arguments``. Reading the first round costs a substring
test per event: only an event holding ``"tool_calls"`` is parsed, to learn
which call an index belongs to. Every event of a round is kept (the bytes,
unparsed) until the round ends or one of the client's calls is relayed —
after that the round can no longer recall — because the round's whole answer
(:meth:`ChatRecallStream.answer`), text relayed before the call included, is
what the follow-up request repeats to the model.

Once a recall call starts, nothing more of that round is relayed. A later
round continues the client's stream: every event is parsed and written again
with the first round's ``id``; ``role`` is taken out of its deltas (the
``openai`` SDK joins string fields of deltas, so a second ``"assistant"``
would read ``"assistantassistant"``) and an event left with nothing to say is
not relayed; a usage object gets the hidden rounds' usage added. A recall call
after one of the client's calls was relayed is taken out of the stream, and
the client's calls after it are renumbered so their indices stay dense (the
SDK places a call by its index). Events are split by :class:`sse.EventSplitter`,
which bounds what is held of one (:data:`sse.MAX_EVENT_BYTES`); a round keeps at
most :data:`sse.MAX_KEPT_BYTES` of its events.
"""

from __future__ import annotations

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

#: The tool the proxy adds, in Chat's shape. One object, never changed, so the
#: request's bytes are the same on every turn (the provider's prompt cache).
RECALL_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": RECALL_TOOL_NAME,
        "description": RECALL_TOOL_DESCRIPTION,
        "parameters": RECALL_TOOL_PARAMETERS,
    },
}

# How an index's call was classed when its first delta came.
_CLIENT = "client"
_RECALL = "recall"
_DROPPED = "dropped"


def _function_name(tool: Any) -> Any:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def _message(answer: Any) -> dict[str, Any] | None:
    if not isinstance(answer, dict):
        return None
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def _recall_entries(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [c for c in calls if isinstance(c, dict) and _function_name(c) == RECALL_TOOL_NAME]


def _usage(answer: Any) -> Usage:
    usage = answer.get("usage") if isinstance(answer, dict) else None
    return Usage(token_count(usage, "prompt_tokens"), token_count(usage, "completion_tokens"))


def _summed(usage: dict[str, Any], earlier: Usage) -> dict[str, Any]:
    """``usage`` with the ``earlier`` rounds' counts added, its other keys as they were."""
    return {
        **usage,
        "prompt_tokens": token_count(usage, "prompt_tokens") + earlier.prompt,
        "completion_tokens": token_count(usage, "completion_tokens") + earlier.output,
        "total_tokens": token_count(usage, "total_tokens") + earlier.prompt + earlier.output,
    }


def _no_content(messages: Any) -> dict[str, Any]:
    """The ``content`` of a turn of tool calls that wrote no text, as this
    request's own turns of calls write it — the upstream has just accepted
    that shape: ``null``, ``""`` or no key at all. Servers differ: the API
    writes ``null``, and llama-cpp-python's request schema refuses it (a 500)
    while taking ``""``. A request with no such turn gets ``""``, the string
    every server's schema takes for ``content``."""
    if isinstance(messages, list):
        for message in reversed(messages):
            if (
                isinstance(message, dict)
                and message.get("role") == "assistant"
                and message.get("tool_calls")
            ):
                if "content" not in message:
                    return {}
                return {"content": None if message["content"] is None else ""}
    return {"content": ""}


class ChatRecall:
    """Recall for ``POST /v1/chat/completions`` (see the module doc)."""

    items_key = "messages"

    def with_tool(self, body: dict[str, Any]) -> dict[str, Any] | None:
        tools = body.get("tools")
        if not isinstance(tools, list) or not tools:
            return None
        if any(_function_name(tool) == RECALL_TOOL_NAME for tool in tools):
            return None
        return {**body, "tools": [*tools, RECALL_TOOL]}

    def calls(self, answer: dict[str, Any]) -> list[RecallCall]:
        message = _message(answer)
        if message is None:
            return []
        found = []
        for entry in _recall_entries(message):
            arguments = entry["function"].get("arguments")
            found.append(
                RecallCall(
                    id=str(entry.get("id") or ""),
                    arguments=arguments if isinstance(arguments, str) else "",
                )
            )
        return found

    def followup(
        self,
        sent: dict[str, Any],
        answer: dict[str, Any],
        results: Sequence[tuple[RecallCall, str]],
    ) -> tuple[dict[str, Any], list[Any]]:
        message = _message(answer) or {"role": "assistant"}
        # A null field says nothing, and some servers' request schemas refuse
        # the fields they only write (refusal, audio, function_call).
        turn = {k: v for k, v in message.items() if v is not None}
        turn["role"] = "assistant"
        if "content" not in turn:
            turn.update(_no_content(sent.get("messages")))
        turn["tool_calls"] = _recall_entries(message)
        items: list[Any] = [turn]
        items.extend(
            {"role": "tool", "tool_call_id": call.id, "content": text} for call, text in results
        )
        return {**sent, "messages": [*sent.get("messages", []), *items]}, items

    def without_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        return without_recall_tool(body, _function_name)

    def usage(self, answer: dict[str, Any]) -> Usage:
        return _usage(answer)

    def final(self, answer: dict[str, Any], earlier: Usage) -> dict[str, Any]:
        usage = answer.get("usage")
        if not isinstance(usage, dict):
            return dict(answer)
        return {**answer, "usage": _summed(usage, earlier)}

    def stream(self) -> ChatRecallStream:
        return ChatRecallStream()


def _payload(event: bytes) -> dict[str, Any] | None:
    """The JSON object ``event`` carries, ``None`` for ``[DONE]``, comments or a garble."""
    return sse.fields(event).json_object()


def _choices(payload: dict[str, Any]) -> list[dict[str, Any]]:
    choices = payload.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def _delta(choice: dict[str, Any]) -> dict[str, Any] | None:
    delta = choice.get("delta")
    return delta if isinstance(delta, dict) else None


def _says_nothing(payload: dict[str, Any]) -> bool:
    if payload.get("usage"):
        return False
    for choice in _choices(payload):
        if choice.get("finish_reason") is not None:
            return False
        delta = _delta(choice) or {}
        if any(value not in (None, "") for value in delta.values()):
            return False
    return True


class ChatRecallStream(sse.RoundReader):
    """Reads one client's chunk stream over the rounds of its answer (see the module doc)."""

    def __init__(self, **bounds: int) -> None:
        super().__init__(**bounds)  # max_event_bytes, max_kept_bytes
        self._round = 0
        self._first_id: str | None = None
        self._earlier = Usage()
        self._reset_round()

    def _reset_round(self) -> None:
        self._events: list[bytes] = []
        self._calls: dict[int, str] = {}
        self._client_index: dict[int, int] = {}
        self._answer: dict[str, Any] | None = None

    def _piece(self, event: sse.Event) -> bytes:
        """Relay a piece of an event too long to hold (every piece goes the same
        way); hidden all the same in a round that recalled, whose answer is what
        was kept up to here."""
        self._stop_keeping()
        return b"" if self._recalled else event.raw

    def _stop_keeping(self) -> None:
        super()._stop_keeping()
        if not self._recalled:
            self._events.clear()  # the round cannot recall: its answer is not needed

    def next_round(self) -> None:
        if self._recalled:
            answer = self.answer()
            if self._first_id is None and isinstance(answer.get("id"), str) and answer["id"]:
                self._first_id = answer["id"]
            self._earlier += _usage(answer)
        self._next_round_events()
        self._round += 1
        self._reset_round()

    def _whole(self, event: bytes) -> bytes:
        if self._keeps(event):
            self._events.append(event)
        if self._recalled:
            return b""
        if self._round == 0 and b'"tool_calls"' not in event:
            return event
        payload = _payload(event)
        if payload is None:
            return event
        # A later round's events are all written again (with the first id).
        changed = self._round > 0
        removed = self._continue(payload) if changed else False
        for choice in _choices(payload):
            delta = _delta(choice)
            entries = delta.get("tool_calls") if delta is not None else None
            if delta is None or not isinstance(entries, list):
                continue
            kept = []
            for position, entry in enumerate(entries):
                if not isinstance(entry, dict):
                    kept.append(entry)
                    continue
                index = entry.get("index")
                if not isinstance(index, int):
                    index = position
                kind = self._calls.get(index) or self._class(index, entry)
                if kind == _RECALL:
                    self._recalled = True
                    return b""
                if kind == _DROPPED:
                    removed = True
                    continue
                if self._client_index[index] != index:
                    entry["index"] = self._client_index[index]
                    changed = True
                kept.append(entry)
            if len(kept) != len(entries):
                if kept:
                    delta["tool_calls"] = kept
                else:
                    del delta["tool_calls"]
        if removed and _says_nothing(payload):
            return b""
        return sse.json_frame(payload) if changed or removed else event

    def _class(self, index: int, entry: dict[str, Any]) -> str:
        """What the call at ``index`` is, from its first delta."""
        if _function_name(entry) != RECALL_TOOL_NAME:
            kind = _CLIENT
            self._client_index[index] = len(self._client_index)
            # A client call is relayed now: this round cannot recall any more.
            self._stop_keeping()
        elif self._client_index or not self._keeping:
            kind = _DROPPED
            self._dropped += 1
        else:
            kind = _RECALL
        self._calls[index] = kind
        return kind

    def _continue(self, payload: dict[str, Any]) -> bool:
        """Rewrite a later round's event to continue the client's stream; whether
        a ``role`` was taken out (the event may then have nothing left to say)."""
        if self._first_id is not None and "id" in payload:
            payload["id"] = self._first_id
        usage = payload.get("usage")
        if isinstance(usage, dict):
            payload["usage"] = _summed(usage, self._earlier)
        removed = False
        for choice in _choices(payload):
            delta = _delta(choice)
            if delta is not None and "role" in delta:
                del delta["role"]
                removed = True
        return removed

    def answer(self) -> dict[str, Any]:
        if self._answer is None:
            self._answer = _assembled(self._events)
        return self._answer


def _assembled(events: Sequence[bytes]) -> dict[str, Any]:
    """A round's events as the whole answer the API would have given."""
    head: dict[str, Any] = {}
    texts: dict[str, list[str]] = {"content": []}
    calls: dict[int, dict[str, Any]] = {}
    finish: Any = None
    usage: Any = None
    for event in events:
        payload = _payload(event)
        if payload is None:
            continue
        for key in ("id", "model", "created"):
            if key not in head and key in payload:
                head[key] = payload[key]
        if isinstance(payload.get("usage"), dict):
            usage = payload["usage"]
        for choice in _choices(payload)[:1]:
            if choice.get("finish_reason") is not None:
                finish = choice["finish_reason"]
            delta = _delta(choice) or {}
            for key, value in delta.items():
                if key == "tool_calls" and isinstance(value, list):
                    _add_calls(calls, value)
                elif key != "role" and isinstance(value, str):
                    texts.setdefault(key, []).append(value)
    # Content as the upstream streamed it: "" when it streamed "", null when
    # it streamed none.
    streamed = texts.pop("content")
    content = "".join(streamed) if streamed else None
    message: dict[str, Any] = {"role": "assistant", "content": content}
    message.update({k: "".join(v) for k, v in texts.items() if "".join(v)})
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    answer: dict[str, Any] = {
        "id": head.get("id", ""),
        "object": "chat.completion",
        **({"created": head["created"]} if "created" in head else {}),
        "model": head.get("model", ""),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if usage is not None:
        answer["usage"] = usage
    return answer


def _add_calls(calls: dict[int, dict[str, Any]], entries: list[Any]) -> None:
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        index = entry.get("index", position)
        if not isinstance(index, int):
            continue
        call = calls.setdefault(
            index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if isinstance(entry.get("id"), str) and not call["id"]:
            call["id"] = entry["id"]
        function = entry.get("function")
        if not isinstance(function, dict):
            continue
        # The first delta names the call; a server that repeats the name in
        # later deltas must not have it doubled.
        if isinstance(function.get("name"), str) and not call["function"]["name"]:
            call["function"]["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            call["function"]["arguments"] += function["arguments"]


#: The one Chat Completions recall surface, typed as the contract so a dialect
#: may declare it where the protocol asks for a ``RecallSurface``.
CHAT_RECALL: Final[RecallSurface] = ChatRecall()

__all__ = ["CHAT_RECALL", "RECALL_TOOL", "ChatRecall", "ChatRecallStream"]
