"""The engine's conversation → OpenAI Responses: :func:`from_engine`.

The way back (:func:`proxy.dialects.base.rebuild`): unchanged items are the
client's objects. A model turn comes back as its list of items, each with
the engine's cut text; a ``function_call`` takes cut ``arguments`` only while
they still parse as JSON, a ``custom_tool_call``'s free-text ``input`` any
cut. An output of a text kind takes the engine's content (a pruned one: the
brief) as its ``output``; a user or instructions message its content. New
engine messages become items: the summary and a truncation note message
items, a result the engine made for a call that call's output item. The
items are spliced into ``input`` after those before the latest
``compaction`` item, which are forwarded as they were.
"""

from __future__ import annotations

from typing import Any

import orjson

from compaction import Message, message_text
from proxy.dialects.base import Mapped, rebuild
from proxy.dialects.responses.to_engine import (
    OUTPUT_FOR,
    SYSTEM_ROLES,
    TEXT_OUTPUTS,
    Instructions,
    Text,
    compaction_start,
    item_kind,
    item_parts,
)


def from_engine(body: dict[str, Any], mapped: Mapped, messages: list[Message]) -> dict[str, Any]:
    """``body`` with the engine's ``messages`` in place of the items ``mapped``
    read from it; the items before the latest ``compaction`` item as they were."""
    items = body.get("input")
    if not isinstance(items, list):  # a string input is one turn: never changed
        return body
    built = rebuild(
        mapped,
        messages,
        changed=_rebuild_item,
        created=lambda group: _create_items(mapped, group),
        skip=lambda origin: isinstance(mapped.items.get(origin), (Instructions, Text)),
    )
    out: list[Any] = list(items[: compaction_start(items)])
    for entry in built:
        if isinstance(entry, list):  # a model turn: its items
            out.extend(entry)
        else:
            out.append(entry)
    if len(out) == len(items) and all(a is b for a, b in zip(out, items, strict=True)):
        return body
    return {**body, "input": out}


def _rebuild_item(item: Any, group: list[Message]) -> Any:
    """``item`` with what the engine changed in its message (see the module doc)."""
    message = group[0]
    if isinstance(item, list):
        return _rebuild_run(item, message)
    if not isinstance(item, dict):
        return item
    content = message.get("content")
    kind = item_kind(item)
    if kind == "output":
        if item.get("type") in TEXT_OUTPUTS and isinstance(content, (str, list)):
            return {**item, "output": content}
        return item
    if kind in ("user", "system") and isinstance(content, (str, list)):
        return {**item, "content": content}
    return item


def _rebuild_run(run: list[dict[str, Any]], message: Message) -> list[dict[str, Any]]:
    """The items of a model turn with the engine's cut texts and arguments.

    A ``function_call`` takes shortened ``arguments`` only when they are still
    JSON: the pruner keeps JSON valid, but truncation may cut the text itself,
    and clients and the API's other backends parse arguments back into an
    object. A ``custom_tool_call``'s ``input`` is free text, so it takes any cut.
    """
    content = message.get("content")
    parts = content if isinstance(content, list) else []
    functions = {
        call.get("id"): call.get("function") or {}
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    }
    answered = {call_id for call_id in functions if isinstance(call_id, str)}
    out: list[dict[str, Any]] = []
    at = 0  # the same layout as run_message
    for item in run:
        own = item_parts(item, answered)
        new = parts[at : at + len(own)]
        at += len(own)
        kind = item.get("type")
        if item.get("role") == "assistant":
            if len(new) == len(own) and new != own:
                text = item.get("content")
                item = {**item, "content": new[0].get("text") if isinstance(text, str) else new}
        elif kind in ("function_call", "custom_tool_call") and item.get("call_id") in answered:
            field = "arguments" if kind == "function_call" else "input"
            arguments = functions[item["call_id"]].get("arguments")
            shortened = isinstance(arguments, str) and arguments != item.get(field)
            if shortened and (field == "input" or _is_json(str(arguments))):
                item = {**item, field: arguments}
        out.append(item)
    return out


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def _create_items(mapped: Mapped, group: list[Message]) -> list[Any]:
    """Input items for engine messages with no origin: the summary, a truncation
    note, a placeholder output, or a stored message whose item is gone."""
    out: list[Any] = []
    for message in group:
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            kind = OUTPUT_FOR.get(_call_type(mapped, call_id), "function_call_output")
            out.append({"type": kind, "call_id": call_id, "output": message_text(message)})
            continue
        if role == "assistant":
            text = message_text(message)
            if text:
                out.append(message_item({"role": "assistant", "content": text}))
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                out.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": function.get("name", ""),
                        "arguments": function.get("arguments", ""),
                    }
                )
            continue
        out.append(message_item(message))
    return out


def _call_type(mapped: Mapped, call_id: Any) -> str:
    for item in mapped.items.values():
        if isinstance(item, list):
            for call in item:
                if call.get("call_id") == call_id:
                    return str(call.get("type"))
    return "function_call"


def message_item(message: Message) -> dict[str, Any]:
    role = message.get("role")
    if role == "assistant":
        part = "output_text"
    else:
        part, role = "input_text", "developer" if role in SYSTEM_ROLES else "user"
    return {
        "type": "message",
        "role": role,
        "content": [{"type": part, "text": message_text(message)}],
    }
