"""Anthropic Messages (``POST /v1/messages``, Claude Code) ↔ the engine's conversation.

Request → engine: one engine message per request item, except a user message
answering tool calls, which becomes several::

    system (top level, text or blocks)      → system message   (head; never rebuilt)
    {"role": "system"} in messages (beta)   → system message   (in place, a middle message)
    user message                            → user message
    assistant message                       → assistant message: text → content parts,
                                              tool_use → tool_calls (arguments = JSON of input)
    user message with tool_result blocks    → a tool message per tool_result, in order;
                                              its other blocks ride on the last one

Blocks map one to one onto content parts where the engine may cut them
(``text``) or should see them (``image``, a base64/URL/file ``document``: an
image part, counted at the profile's ``image_tokens`` — one page's worth for a
document, whatever its length). What the engine must neither cut nor drop —
``thinking`` (signed), ``redacted_thinking``, server-tool blocks,
``search_result``, plain-text documents, unknown types — is counted through
the string field :data:`UNCUT`: thinking by its text, the rest by its JSON.
The engine counts strings it does not know and never edits them.

**What no summary can stand for rides along.** Blocks the proxy drops with
a condensed span are the ones whose loss the summary makes good: text,
images and documents, thinking (the API keeps no earlier turn's), tool calls
and results, and the server tools' calls and results that only report what
the model looked up. Any other block — a ``tool_reference`` inside a
``tool_result`` (it loads a tool the model goes on to call), a server tool
search's result, a type that does not exist yet — marks its engine message
opaque (:data:`compaction.OPAQUE_KEY`): a condensed span keeps its group
verbatim after the summary, and a pruned result keeps it beside the brief.

**Blocks beside tool results are the user's.** Claude Code adds text to the
message answering tool calls when the user types while a tool runs or a hook
adds a reminder, and a client may add images or documents. The engine sees
them as chat would send the same conversation: a user message after the tool
messages, which the pruner never briefs (it briefs tool results only) and
the summarizer reads as the user's words. In the newest message alone they
ride on its last tool message instead: the newest group is kept whole, so
the results the request answers stay with them (as a user message of their
own, they would be the newest group, and the results could be condensed away
from it). The newest group is never pruned; should the engine give that tool
message one string all the same, the string stands for the result, and the
blocks beside it are forwarded as the client sent them. An item is the newest
on one request only, and never inside the span a checkpoint covers, so the
two forms never meet in a stored compaction.

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

A request holding an API compaction block (``{"type": "compaction"}``, beta
``compact-2026-01-12``) is compacted only after it: the API drops everything
before that block, so the messages before the message holding it are
forwarded as they are and not counted, and that message opens the engine's
head (kept verbatim).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson

from compaction import OPAQUE_KEY, Message, SummarizationError, message_text
from config import ModelConfig
from proxy.dialects.anthropic import replies
from proxy.dialects.anthropic.pairing import (
    as_json,
    is_result,
    keep_pairing,
    pairing_problems,
    text_block,
)
from proxy.dialects.anthropic.recall import ANTHROPIC_RECALL
from proxy.dialects.base import ORIGIN, Mapped, Reading, origin_of, read_mapped, rebuild
from proxy.edge.errors import BadRequest

#: Key on an engine message: the text of the blocks the engine must count but not edit.
UNCUT = "_anthropic_uncut"
#: Key on a new engine message (a summary): the ``cache_control`` its text block takes.
_MARKER = "_anthropic_cache_control"
#: Document sources whose size the engine cannot read: counted as an image.
_BINARY_SOURCES = frozenset({"base64", "url", "file"})
_ROLES = frozenset({"user", "assistant", "system"})
#: Engine roles of the instructions kept in place after the head.
_PINNED = frozenset({"system", "developer"})
#: Block types a condensed span may drop: what a summary stands for (see the
#: module doc). Every other block makes its message opaque.
_SUMMARIZED = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
    }
)


class AnthropicDialect:
    name = "anthropic"
    #: Its side of recall (:mod:`proxy.dialects.recall`).
    recall = ANTHROPIC_RECALL
    path = "/messages"
    key_header = "x-api-key"
    cached_usage_apart = True

    def route(self, config: ModelConfig) -> tuple[str, str | None]:
        return config.anthropic_upstream, config.anthropic_api_key_env

    def read(self, raw: bytes) -> Reading:
        return read_mapped(self, raw)

    def check(self, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("messages: expected an array", param="messages")
        for i, message in enumerate(messages):
            role = message.get("role") if isinstance(message, dict) else None
            if not isinstance(role, str) or role not in _ROLES:
                raise BadRequest(
                    f"messages[{i}]: expected an object with role user, assistant or system",
                    param=f"messages[{i}]",
                )
            if not isinstance(message.get("content"), (str, list)):
                raise BadRequest(
                    f"messages[{i}].content: expected a string or an array",
                    param=f"messages[{i}].content",
                )
        system = body.get("system")
        if system is not None and not isinstance(system, (str, list)):
            raise BadRequest("system: expected a string or an array", param="system")

    def untouchable(self, body: dict[str, Any]) -> str | None:
        # An API compaction block is handled by compacting after it (see the module doc).
        return None

    def to_engine(self, body: dict[str, Any]) -> Mapped:
        request: dict[str, Any] = {"model": body.get("model"), "messages": []}
        for key in ("max_tokens", "tools"):
            if key in body:
                request[key] = body[key]
        mapped = Mapped(messages=request["messages"], request=request)
        system = body.get("system")
        if system is not None:
            mapped.add(system, [_engine_message("system", system)], salt="system")
        messages: list[Any] = body["messages"]
        for item in messages[_compaction_start(messages) :]:
            mapped.add(item, _to_engine(item, newest=item is messages[-1]))
        return mapped

    def from_engine(
        self, body: dict[str, Any], mapped: Mapped, messages: list[Message]
    ) -> dict[str, Any]:
        system = body.get("system")
        items = rebuild(
            mapped,
            _markers_moved(mapped, messages),
            changed=lambda item, group: _changed(mapped, item, group),
            created=_created,
            skip=lambda origin: system is not None and mapped.items.get(origin) is system,
        )
        before = body["messages"][: _compaction_start(body["messages"])]
        return {**body, "messages": before + keep_pairing(items)}

    def summary_request(
        self, model: str, messages: list[Message], max_tokens: int
    ) -> dict[str, Any]:
        system = "\n\n".join(
            message_text(m) for m in messages if m.get("role") in ("system", "developer")
        )
        turns = [
            {
                "role": "assistant" if m.get("role") == "assistant" else "user",
                "content": message_text(m),
            }
            for m in messages
            if m.get("role") not in ("system", "developer") and message_text(m)
        ]
        request: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
        if system:
            request["system"] = system
        request["messages"] = turns
        return request

    def summary_text(self, reply: Any) -> str:
        content = reply.get("content") if isinstance(reply, dict) else None
        if not isinstance(content, list):
            raise SummarizationError("summarizer reply is not an Anthropic message")
        blocks = [b for b in content if isinstance(b, dict)]
        if any(b.get("type") in ("tool_use", "server_tool_use") for b in blocks):
            raise SummarizationError("summarizer replied with tool calls instead of text")
        text = "".join(
            b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)
        )
        if not text.strip():
            raise SummarizationError("summarizer reply is empty")
        return text.strip()

    def summary_retry(
        self, request: dict[str, Any], status: int, reply: bytes
    ) -> dict[str, Any] | None:
        return None

    def summary_cut_off(self, reply: Any) -> bool:
        return isinstance(reply, dict) and reply.get("stop_reason") == "max_tokens"

    def manual_reply(self, model: str, text: str) -> dict[str, Any]:
        return replies.message_reply(model, text)

    def manual_events(
        self, model: str, text: str, request: Mapping[str, Any] | None = None
    ) -> Iterator[bytes]:
        return replies.message_events(model, text)

    def error_event(self, message: str, code: str) -> bytes:
        return replies.error_event(message)  # the API's error event has no code


ANTHROPIC = AnthropicDialect()


# --- request → engine --------------------------------------------------------


def _compaction_start(messages: list[Any]) -> int:
    """Index of the message holding the last API compaction block with a summary (0 if none).

    A block whose ``content`` is null is a failed compaction, a no-op for the API.
    """
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content") if isinstance(messages[i], dict) else None
        if isinstance(content, list) and any(
            isinstance(b, dict)
            and b.get("type") == "compaction"
            and (b.get("content") is not None or b.get("encrypted_content") is not None)
            for b in content
        ):
            return i
    return 0


def _to_engine(item: dict[str, Any], *, newest: bool) -> list[Message]:
    role = item.get("role")
    content = item.get("content")
    if role == "assistant":
        return [_assistant(content)]
    if role == "user" and isinstance(content, list) and _has_results(content):
        results = [b for b in content if is_result(b)]
        out = [_tool(b) for b in results]
        rest = [b for b in content if not is_result(b)]
        if rest and not newest:
            out.append(_engine_message("user", rest))
        elif rest:  # the newest request: kept with the results (see the module doc)
            last = out[-1]
            last["content"] = _result_parts(results[-1]) + _parts(rest)
            uncut = "\n".join(t for t in (last.get(UNCUT, ""), _uncut(rest)) if t)
            if uncut:
                last[UNCUT] = uncut
            if _opaque(rest):
                last[OPAQUE_KEY] = True
        return out
    return [_engine_message(role if role in _ROLES else "user", content)]


def _engine_message(role: Any, content: Any) -> Message:
    message: Message = {"role": role, "content": _parts(content)}
    uncut = _uncut(content)
    if uncut:
        message[UNCUT] = uncut
    if _opaque(content):
        message[OPAQUE_KEY] = True
    return message


def _opaque(content: Any) -> bool:
    """Whether ``content`` holds a block no summary can stand for (see the module
    doc), at its top level or inside a ``tool_result``."""
    if not isinstance(content, list):
        return False
    for block in content:
        if not isinstance(block, dict) or block.get("type") not in _SUMMARIZED:
            return True
        if is_result(block) and _opaque(block.get("content")):
            return True
    return False


def _assistant(content: Any) -> Message:
    message = _engine_message("assistant", content)
    if isinstance(content, list):
        calls = [
            {
                "id": b.get("id"),
                "type": "function",
                "function": {"name": b.get("name"), "arguments": as_json(b.get("input", {}))},
            }
            for b in content
            if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
        if calls:
            message["tool_calls"] = calls
    return message


def _tool(block: dict[str, Any]) -> Message:
    content = block.get("content")
    message = _engine_message("tool", "" if content is None else content)
    message["tool_call_id"] = block.get("tool_use_id")
    return message


def _result_parts(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A tool_result's content as parts (a string is one text part)."""
    content = block.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return _parts(content) if isinstance(content, list) else []


def _has_results(content: list[Any]) -> bool:
    return any(is_result(b) for b in content)


def _kind(block: Any) -> str:
    """How the engine sees a block: ``"text"``, ``"image"`` (a part it counts
    at ``image_tokens``) or ``"uncut"`` (counted through :data:`UNCUT`)."""
    if not isinstance(block, dict):
        return "uncut"
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return "text"
    if kind == "image":
        return "image"
    if kind == "document":
        source = block.get("source")
        if isinstance(source, dict) and source.get("type") in _BINARY_SOURCES:
            return "image"
    return "uncut"


def _parts(content: Any) -> Any:
    """The engine's content: a string as it is, blocks as parts (text and images only)."""
    if not isinstance(content, list):
        return content
    parts: list[dict[str, Any]] = []
    for block in content:
        kind = _kind(block)
        if kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image"})
    return parts


def _uncut(content: Any) -> str:
    """What the blocks the engine gets no part for weigh, as text to count."""
    if not isinstance(content, list):
        return ""
    texts: list[str] = []
    for block in content:
        if _kind(block) != "uncut" or is_result(block):
            continue
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            continue  # counted as a tool call
        if kind == "thinking" and isinstance(block.get("thinking"), str):
            texts.append(block["thinking"])
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            texts.append(block["data"])
        else:
            texts.append(as_json(block))
    return "\n".join(texts)


# --- engine → request --------------------------------------------------------


def _changed(mapped: Mapped, item: Any, group: list[Message]) -> Any:
    """``item`` rebuilt from the engine messages that came back for it (some cut, some gone)."""
    role = item.get("role")
    content = item.get("content")
    if role == "assistant":
        return {**item, "content": _assistant_content(content, group[0])}
    if role == "user" and isinstance(content, list) and _has_results(content):
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
    results alone (see :func:`_to_engine`).

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
        size = len(_result_parts(results[last]))
        cut = new[last]
        if isinstance(cut, list) and len(cut) == size + len(_parts(rest)):
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
    seen = [i for i, b in enumerate(content) if _kind(b) != "uncut"]
    if isinstance(new, list) and len(new) == len(seen):
        out = list(content)
        for i, part in zip(seen, new, strict=True):
            text = part.get("text") if isinstance(part, dict) else None
            if _kind(content[i]) == "text" and isinstance(text, str) and text != content[i]["text"]:
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
            brief = {**block, "text": text} if _kind(block) == "text" else text_block(text)
            if marker is not None:
                brief["cache_control"] = marker
            out.append(brief)
        elif _kind(block) == "uncut":
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
    if item is not None and item.get("role") == "user" and _has_results(content):
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


__all__ = ["ANTHROPIC", "UNCUT", "AnthropicDialect", "pairing_problems"]
