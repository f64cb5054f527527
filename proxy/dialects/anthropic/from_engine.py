"""The engine's conversation → Anthropic Messages: :func:`from_engine`.

The way back (:func:`proxy.dialects.base.rebuild`): unchanged items are the
client's objects; a changed item gets the engine's text in its text blocks
and results, everything else as it was (signed blocks, ``cache_control``,
``is_error``; a ``tool_use`` input only when the cut arguments still parse as
an object); new messages (the summary, a truncation note) become user
messages of one text block. A last pass keeps the API's pairing rule — every
``tool_result`` answers a ``tool_use`` of the message just before, every
``tool_use`` is answered at the start of the next — by turning what would
break it into text (:func:`proxy.dialects.anthropic.pairing.keep_pairing`);
the engine keeps tool groups whole, so this is a safety net.

**Cache breakpoints.** A ``cache_control`` marker on a block that is sent
stays on it. A marker on a block the engine condensed or dropped moves to
the summary (or truncation note) standing where that block was: the prefix
it marked now ends there, and the next request, carrying the same summary,
reads it from the cache. Where blocks inside a tool result give way to one
brief, their marker moves to the brief. Markers only ever merge, so a
request never carries more of them than the client sent (the API allows
four).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from compaction import OPAQUE_KEY, Message, message_text
from proxy.dialects.anthropic.pairing import as_json, is_result, keep_pairing, text_block
from proxy.dialects.anthropic.to_engine import (
    block_kind,
    compaction_start,
    engine_parts,
    has_results,
    result_parts,
)
from proxy.dialects.base import ORIGIN, Mapped, origin_of, rebuild

#: Key on a new engine message (a summary): the ``cache_control`` its text block takes.
_MARKER = "_anthropic_cache_control"
#: Engine roles of the instructions kept in place after the head.
_PINNED = frozenset({"system", "developer"})


def from_engine(body: dict[str, Any], mapped: Mapped, messages: list[Message]) -> dict[str, Any]:
    """``body`` with the engine's ``messages`` in place of the items ``mapped``
    read from it; the messages before the last API compaction block as they were."""
    system = body.get("system")
    items = rebuild(
        mapped,
        _markers_moved(mapped, messages),
        changed=lambda item, group: _changed(mapped, item, group),
        created=_created,
        skip=lambda origin: system is not None and mapped.items.get(origin) is system,
    )
    before = body["messages"][: compaction_start(body["messages"])]
    return {**body, "messages": before + keep_pairing(items)}


def _changed(mapped: Mapped, item: Any, group: list[Message]) -> Any:
    """``item`` rebuilt from the engine messages that came back for it (some cut, some gone)."""
    role = item.get("role")
    content = item.get("content")
    if role == "assistant":
        return {**item, "content": _assistant_content(content, group[0])}
    if role == "user" and isinstance(content, list) and has_results(content):
        found = origin_of(group[0])
        parts = len(mapped.parts.get(found[0], ())) if found else 0
        return _user_with_results(item, content, group, parts)
    new = _rewrite(content, group[0].get("content"))
    return {**item, "content": new} if new else None


def _user_with_results(
    item: dict[str, Any], content: list[Any], group: list[Message], parts: int
) -> dict[str, Any] | None:
    """The blocks of a user message answering tool calls that came back, in their
    order: part ``k`` is the ``k``-th result; the other blocks are the part after
    the results, or ride on the last result when the item was made of ``parts``
    results alone (see :func:`.to_engine.engine_item`).

    When the engine gave a result one string (the pruner's brief, a masking
    placeholder), that string stands for the result alone: blocks riding on it
    come back as the client sent them.
    """
    results = [b for b in content if is_result(b)]
    rest = [b for b in content if not is_result(b)]
    back = {}
    for message in group:
        found = origin_of(message)
        if found is not None:
            back[found[1]] = message
    new = {part: back[part].get("content") for part in back}
    others: list[Any] = []
    last = len(results) - 1
    if rest and parts > len(results):
        beside = new.pop(len(results), None)
        others = [] if beside is None else _rewrite(rest, beside)
    elif rest and last in new:
        size = len(result_parts(results[last]))
        cut = new[last]
        if isinstance(cut, list) and len(cut) == size + len(engine_parts(rest)):
            new[last], others = cut[:size], _rewrite(rest, cut[size:])
        else:
            others = rest
    aligned = len(others) == len(rest)  # one to one: each goes back to its place
    blocks: list[Any] = []
    part = other = 0
    for block in content:
        if is_result(block):
            if part in new:
                blocks.append(_result(block, new[part]))
            part += 1
        elif aligned and others:
            blocks.append(others[other])
            other += 1
    if not aligned:
        blocks.extend(others)
    return {**item, "content": blocks} if blocks else None


def _result(block: dict[str, Any], new: Any) -> dict[str, Any]:
    """A ``tool_result`` carrying the engine's content ``new`` (``tool_use_id``,
    ``is_error``, ``cache_control`` kept)."""
    original = block.get("content")
    if isinstance(original, list):
        rewritten = _rewrite(original, new)
        return block if rewritten is original else {**block, "content": rewritten}
    text = new if isinstance(new, str) else message_text({"content": new})
    return block if text == (original or "") else {**block, "content": text}


def _assistant_content(content: Any, message: Message) -> Any:
    """The blocks of an assistant message with the engine's text and arguments.

    Signed blocks (thinking) and the rest come back as they were; a
    ``tool_use`` takes the cut arguments only while they parse as an object.
    """
    new = _rewrite(content, message.get("content"))
    if not isinstance(new, list):
        return new or content
    calls = {c.get("id"): c for c in message.get("tool_calls") or () if isinstance(c, dict)}
    out = []
    for block in new:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            block = _tool_use(block, calls.get(block.get("id")))
        out.append(block)
    return out if any(a is not b for a, b in zip(out, content, strict=True)) else content


def _tool_use(block: dict[str, Any], call: dict[str, Any] | None) -> dict[str, Any]:
    function = call.get("function") if call else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str) or arguments == as_json(block.get("input", {})):
        return block
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return block
    return {**block, "input": parsed} if isinstance(parsed, dict) else block


def _rewrite(content: Any, new: Any) -> Any:
    """``content`` (a string or blocks) with the text of the engine's ``new`` content.

    Parts map one to one onto the text and image blocks; when the engine
    replaced the parts by one string (a pruned result), that string takes the
    place of the first of them and the others go. Unchanged blocks are the
    same objects, and unchanged content is ``content`` itself.
    """
    if not isinstance(content, list):
        return new if isinstance(new, str) else message_text({"content": new})
    seen = [i for i, b in enumerate(content) if block_kind(b) != "uncut"]
    if isinstance(new, list) and len(new) == len(seen):
        out = list(content)
        for i, part in zip(seen, new, strict=True):
            text = part.get("text") if isinstance(part, dict) else None
            if (
                block_kind(content[i]) == "text"
                and isinstance(text, str)
                and text != content[i]["text"]
            ):
                out[i] = {**content[i], "text": text}
        return content if all(a is b for a, b in zip(out, content, strict=True)) else out
    if not seen:
        return content
    text = new if isinstance(new, str) else message_text({"content": new})
    # The blocks the text stands for end where it ends: their last marker is its own.
    marker = _last_marker(content[i] for i in seen)
    out = []
    for i, block in enumerate(content):
        if i == seen[0] and text:
            brief = {**block, "text": text} if block_kind(block) == "text" else text_block(text)
            if marker is not None:
                brief["cache_control"] = marker
            out.append(brief)
        elif block_kind(block) == "uncut":
            out.append(block)
    return out


def _last_marker(blocks: Iterable[Any]) -> Any:
    """The ``cache_control`` of the last of ``blocks`` that has one (``None`` if none)."""
    marker = None
    for block in blocks:
        if isinstance(block, dict) and block.get("cache_control") is not None:
            marker = block["cache_control"]
    return marker


def _markers_moved(mapped: Mapped, messages: list[Message]) -> list[Message]:
    """``messages`` with the ``cache_control`` of each block that is not among them
    given to the new message (summary, truncation note) standing in its place.

    A block's place in the output is between the messages kept from before it
    and those kept from after it; of the new messages there, the last ends the
    prefix the marker marked. ``messages`` itself when no marked block is gone.
    """
    position = {m.get(ORIGIN): q for q, m in enumerate(mapped.messages)}
    kept = {m.get(ORIGIN) for m in messages} & position.keys()
    lost = [
        (q, marker)
        for q, m in enumerate(mapped.messages)
        if m.get(ORIGIN) not in kept and (marker := _marker_of(mapped, m)) is not None
    ]
    if not lost:
        return messages
    at = [position.get(m.get(ORIGIN)) for m in messages]
    given: dict[int, Any] = {}
    for q, marker in lost:
        start = max((j + 1 for j, p in enumerate(at) if p is not None and p < q), default=0)
        end = next((j for j, p in enumerate(at) if p is not None and p > q), len(at))
        new = _new_between(messages, at, start, end)
        if new is not None:  # in position order, so the last marker of a span wins
            given[new] = marker
    return [{**m, _MARKER: given[j]} if j in given else m for j, m in enumerate(messages)]


def _new_between(messages: list[Message], at: list[int | None], start: int, end: int) -> int | None:
    """The last new message in ``messages[start:end]``; else the nearest one past
    the messages the engine keeps out of their place: system messages and the
    groups holding what no summary can stand for (both kept verbatim after a
    summary) after or before the span, and one user message before it (the
    turn truncation keeps goes after its note)."""
    new = [j for j in range(start, end) if at[j] is None]
    if new:
        return new[-1]
    j = end
    while j < len(messages) and at[j] is not None and _moved(messages[j]):
        j += 1
    if j > end and j < len(messages) and at[j] is None:
        return j
    j, opener = start - 1, True
    while j >= 0 and at[j] is not None:
        role = messages[j].get("role")
        if role == "user" and opener and not messages[j].get(OPAQUE_KEY):
            opener = False
        elif not _moved(messages[j]):
            break
        j -= 1
    return j if j < start - 1 and j >= 0 and at[j] is None else None


def _moved(message: Message) -> bool:
    """Whether the engine may have kept ``message`` away from its place: a system
    message, or one of a group riding along after a summary (a tool group is
    kept whole, so its messages sit between a summary and a dropped block only
    when they ride along)."""
    role = message.get("role")
    return (
        role in _PINNED
        or bool(message.get(OPAQUE_KEY))
        or role == "tool"
        or (role == "assistant" and bool(message.get("tool_calls")))
    )


def _marker_of(mapped: Mapped, message: Message) -> Any:
    """The last ``cache_control`` among the client's blocks ``message`` stands for."""
    found = origin_of(message)
    item = mapped.items.get(found[0]) if found else None
    content = item.get("content") if isinstance(item, dict) else None
    if not isinstance(content, list) or found is None:
        return None
    blocks: list[Any] = content
    if item is not None and item.get("role") == "user" and has_results(content):
        results = [b for b in content if is_result(b)]
        rest = [b for b in content if not is_result(b)]
        if found[1] >= len(results):  # the part after the results: the other blocks
            return _last_marker(rest)
        inner = results[found[1]].get("content")
        blocks = [*(inner if isinstance(inner, list) else ()), results[found[1]]]
        riding = len(mapped.parts.get(found[0], ())) == len(results)
        if riding and found[1] == len(results) - 1:
            blocks += rest
    return _last_marker(blocks)


def _created(messages: list[Message]) -> list[Any]:
    """New items for engine messages with no origin: user messages of one text block."""
    out = []
    for message in messages:
        text = message_text(message)
        if message.get("role") in ("tool", "function"):
            text = f"[tool result: {text}]" if text else ""
        if text:
            block = text_block(text)
            if message.get(_MARKER) is not None:
                block["cache_control"] = message[_MARKER]
            out.append({"role": "user", "content": [block]})
    return out
