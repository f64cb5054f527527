"""OpenAI Responses → the engine's conversation: :func:`to_engine`.

How a request's items become engine messages (each tagged with its origin)::

    instructions                         → system        (head; never rebuilt)
    input: "text"                        → user          (one turn: nothing to compact)
    message user                         → user          content passed as it is
    message system / developer           → system
    ┌ reasoning, assistant message,      ┐
    │ function_call, custom_tool_call,   │ → ONE assistant message with tool_calls
    └ other *_call items (one model turn)┘   (origin: the list of those items)
    function_call_output, *_output       → tool          (one per item)
    compaction                           → system        (opaque: counted as JSON)
    anything else                        → user          (opaque: counted as JSON)

**One engine message for the model's turn.** The API refuses a
``function_call`` without the ``reasoning`` item that preceded it in its turn
and an output without its call earlier in the input. Mapping the whole run of
model items (reasoning + message + calls) to one assistant message makes the
engine keep or drop them together, and its tool-group rule (an assistant
message with the ``tool`` messages answering it) keeps the outputs with them.
:meth:`~proxy.dialects.base.Mapped.add` is given the run as a ``list`` (items
themselves are objects), :func:`~proxy.dialects.base.rebuild` hands that list
back, and :func:`.from_engine.from_engine` splices it into ``input``.

A call some later output answers becomes an engine tool call, wherever that
output sits: clients put other items between the outputs of parallel calls
(Codex sent the image of a ``view_image`` call as a user message after its
output, before the outputs of the calls beside it), and the engine's group
runs from the call to its last output over whatever lies between, so no
stage can forward an output without its call. A call no output answers
rides in the run as content (the engine would invent an output for it), and
an output answering no call before it stands alone; either way the API's own
error about it is kept.

``system`` / ``developer`` message items after the head are instructions the
engine keeps verbatim wherever they sit (``compaction.messages``: pinned): a
condensed span around one comes back as the summary with the item right
after it, the client's own object.

**The provider's own compaction.** A ``compaction`` item (what ``/responses/compact``
or server-side compaction returned: an opaque ``encrypted_content``) stands for
every item before it, which the API ignores. The proxy does as the API does:
it reads the input from the latest ``compaction`` item on — the items before it
are forwarded as they are, neither counted nor compacted — and that item opens
the engine's head (a system message, kept verbatim, counted as its JSON).

Parts the engine may cut carry ``text``: ``input_text`` / ``output_text``
parts go in as they are (the same objects), so a rebuilt message is the item
with the engine's content. Reasoning summaries, images, files and items the
engine must not edit go in as parts without ``text`` (counted as JSON, never
cut, not shown to the summarizer): an encrypted reasoning item is only ever
forwarded as the client sent it. ``encrypted_content`` is not counted: the API
does not keep an earlier turn's reasoning in the model's context.

**What no summary can stand for rides along.** A condensed span drops what
its summary stands for: the model's turns (reasoning, messages, every
``*_call``) and the outputs of known calls. An item of a type the proxy does
not know (an ``item_reference``, a newer item), an unknown output, and a
content part of an unknown type mark their engine message opaque
(:data:`compaction.OPAQUE_KEY`): a condensed span keeps their group verbatim
after the summary, and a pruned output keeps such parts beside its brief.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compaction import OPAQUE_KEY, Message
from proxy.dialects.base import Mapped

#: Roles of message items that are instructions (engine system messages).
SYSTEM_ROLES = frozenset({"system", "developer"})
#: Items answering a call by ``call_id`` whose ``output`` is a string or a list of
#: content parts (so a pruned output can be put back as a string).
TEXT_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "apply_patch_call_output",
    }
)
#: Outputs of other known calls, forwarded whole where kept: what a summary
#: stands for when their span is condensed (screenshots, shell runs).
_SUMMARIZED_OUTPUTS = TEXT_OUTPUTS | {"computer_call_output", "shell_call_output"}
#: Content part types of message items (as the engine reads them: text, images, files).
_PARTS = frozenset({"input_text", "output_text", "refusal", "input_image", "input_file"})
#: The output item made for a call the engine gave a placeholder result.
OUTPUT_FOR = {"custom_tool_call": "custom_tool_call_output"}


@dataclass(frozen=True)
class Instructions:
    """The origin item of the ``instructions`` system message (not an input item)."""

    instructions: str


@dataclass(frozen=True)
class Text:
    """The origin item of a string ``input``."""

    input: str


def item_kind(item: Any) -> str:
    """``"user"``, ``"system"``, ``"model"`` (part of the model's turn), ``"output"``
    (a client's answer to a call), ``"compaction"`` or ``"other"``."""
    if not isinstance(item, dict):
        return "other"
    kind = item.get("type")
    if kind is None or kind == "message":
        role = item.get("role")
        if role == "assistant":
            return "model"
        if isinstance(role, str) and role in SYSTEM_ROLES:
            return "system"
        return "user" if role == "user" else "other"
    if kind == "reasoning" or (isinstance(kind, str) and kind.endswith("_call")):
        return "model"
    if isinstance(kind, str) and kind.endswith("_output"):
        return "output"
    if kind == "compaction" or kind == "compaction_summary":
        return "compaction"
    return "other"


def _call_id(item: dict[str, Any]) -> str | None:
    # local_shell_call_output names its call by ``id``.
    call_id = item.get("call_id")
    if call_id is None and item.get("type") == "local_shell_call_output":
        call_id = item.get("id")
    return call_id if isinstance(call_id, str) else None


def _opaque(item: Any) -> dict[str, Any]:
    """A content part the engine counts (as JSON) but never cuts or reads."""
    return {"type": "item", "item": item}


def _reasoning_part(item: dict[str, Any]) -> dict[str, Any]:
    texts = [
        part["text"]
        for key in ("summary", "content")
        for part in (item.get(key) or ())
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]
    return {"type": "reasoning", "summary": "\n".join(texts)}


def _message_parts(item: dict[str, Any]) -> list[Any]:
    """An assistant message's content as engine parts (string content → one text part)."""
    content = item.get("content")
    if isinstance(content, str):
        return [{"type": "output_text", "text": content}]
    if isinstance(content, list):
        return content
    return []


def _tool_call(item: dict[str, Any], call_id: str) -> dict[str, Any]:
    kind = item.get("type")
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
    elif kind == "custom_tool_call":
        name, arguments = item.get("name"), item.get("input")
    else:  # its fields are not arguments the engine may cut: counted in the content
        name, arguments = kind, ""
    return {
        "id": call_id,
        "type": "function",
        "function": {
            "name": name if isinstance(name, str) else "",
            "arguments": arguments if isinstance(arguments, str) else "",
        },
    }


def item_parts(item: dict[str, Any], answered: set[str]) -> list[Any]:
    """The engine content parts one item of a model turn contributes."""
    kind = item.get("type")
    if kind == "reasoning":
        return [_reasoning_part(item)]
    if item.get("role") == "assistant":
        return _message_parts(item)
    if kind in ("function_call", "custom_tool_call") and item.get("call_id") in answered:
        return []  # all of it is in the engine's tool call
    return [_opaque(item)]


def run_message(run: list[dict[str, Any]], answered: set[str]) -> Message:
    """The engine's assistant message for one model turn (see the module doc)."""
    parts: list[Any] = []
    calls: list[dict[str, Any]] = []
    for item in run:
        parts.extend(item_parts(item, answered))
        call_id = item.get("call_id")
        if item.get("type") != "reasoning" and isinstance(call_id, str) and call_id in answered:
            calls.append(_tool_call(item, call_id))
    message: Message = {"role": "assistant", "content": parts}
    if calls:
        message["tool_calls"] = calls
    # Its reasoning and call parts are the dialect's own: only a message part of
    # an unknown type is what no summary can stand for.
    message[OPAQUE_KEY] = any(
        not isinstance(part, dict) or part.get("type") not in _PARTS
        for item in run
        if item.get("role") == "assistant"
        for part in _message_parts(item)
    )
    return message


def _output_content(item: dict[str, Any]) -> Any:
    output = item.get("output")
    if item.get("type") in TEXT_OUTPUTS and isinstance(output, (str, list)):
        return output
    return [_opaque(item)]


def to_engine(body: dict[str, Any]) -> Mapped:
    """The engine's request for ``body``: its instructions, and its input from
    the latest ``compaction`` item on (see the module doc)."""
    mapped = Mapped(messages=[], request={"model": body.get("model")})
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        mapped.add(Instructions(instructions), [{"role": "system", "content": instructions}])
    items = body.get("input")
    if isinstance(items, str):
        mapped.add(Text(items), [{"role": "user", "content": items}])
    elif isinstance(items, list):
        _map_items(mapped, items[compaction_start(items) :])
    request = mapped.request
    request["messages"] = mapped.messages
    if body.get("tools"):
        request["tools"] = body["tools"]
    if isinstance(body.get("max_output_tokens"), int):
        request["max_tokens"] = body["max_output_tokens"]
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        request["response_format"] = text["format"]
    return mapped


def compaction_start(items: list[Any]) -> int:
    """Index of the latest ``compaction`` item (0 if none): the API ignores every
    item before it (see the module doc)."""
    for i in range(len(items) - 1, -1, -1):
        if item_kind(items[i]) == "compaction":
            return i
    return 0


def _map_items(mapped: Mapped, items: list[Any]) -> None:
    """Add every input item to ``mapped``, model turns as one message each."""
    calls, outputs = _answered(items)
    i, n = 0, len(items)
    while i < n:
        item = items[i]
        kind = item_kind(item)
        if kind == "model":
            end = i + 1
            while end < n and item_kind(items[end]) == "model":
                end += 1
            run = items[i:end]
            answered = {items[k]["call_id"] for k in range(i, end) if k in calls}
            mapped.add(run, [run_message(run, answered)])
            i = end
            continue
        if i in outputs:
            message: Message = {"role": "tool", "tool_call_id": _call_id(item)}
            message["content"] = _output_content(item)
            if message["content"] != item.get("output"):  # the item as one part of its own
                message[OPAQUE_KEY] = item.get("type") not in _SUMMARIZED_OUTPUTS
        elif kind in ("user", "system"):
            message = {"role": kind, "content": item.get("content")}
        elif kind == "compaction":
            message = {"role": "system", "content": [_opaque(item)], OPAQUE_KEY: False}
        else:  # an output answering no call before it, or an item the engine cannot read
            message = {"role": "user", "content": [_opaque(item)], OPAQUE_KEY: True}
        mapped.add(item, [message])
        i += 1


def _answered(items: list[Any]) -> tuple[set[int], set[int]]:
    """The indices of the calls some output answers, and of those outputs.

    An output answers the nearest call before it with its ``call_id``, however
    many items lie between (see the module doc).
    """
    latest: dict[str, int] = {}
    calls: set[int] = set()
    outputs: set[int] = set()
    for index, item in enumerate(items):
        kind = item_kind(item)
        if kind == "model" and item.get("type") != "reasoning":
            call_id = item.get("call_id")
            if isinstance(call_id, str):
                latest[call_id] = index
        elif kind == "output":
            call = latest.get(_call_id(item) or "")
            if call is not None:
                calls.add(call)
                outputs.add(index)
    return calls, outputs
