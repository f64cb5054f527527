"""Anthropic Messages → the engine's conversation: :func:`to_engine`.

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

A request holding an API compaction block (``{"type": "compaction"}``, beta
``compact-2026-01-12``) is compacted only after it: the API drops everything
before that block, so the messages before the message holding it are
forwarded as they are and not counted, and that message opens the engine's
head (kept verbatim).
"""

from __future__ import annotations

from typing import Any

from compaction import OPAQUE_KEY, Message
from proxy.dialects.anthropic.pairing import as_json, is_result
from proxy.dialects.base import Mapped

#: Key on an engine message: the text of the blocks the engine must count but not edit.
UNCUT = "_anthropic_uncut"
#: Document sources whose size the engine cannot read: counted as an image.
_BINARY_SOURCES = frozenset({"base64", "url", "file"})
#: The roles a message may have in this API.
ROLES = frozenset({"user", "assistant", "system"})
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


def to_engine(body: dict[str, Any]) -> Mapped:
    """The engine's request for ``body``: its system and messages after the
    last API compaction block, each item mapped with :func:`engine_item`."""
    request: dict[str, Any] = {"model": body.get("model"), "messages": []}
    for key in ("max_tokens", "tools"):
        if key in body:
            request[key] = body[key]
    mapped = Mapped(messages=request["messages"], request=request)
    system = body.get("system")
    if system is not None:
        mapped.add(system, [engine_message("system", system)], salt="system")
    messages: list[Any] = body["messages"]
    for item in messages[compaction_start(messages) :]:
        mapped.add(item, engine_item(item, newest=item is messages[-1]))
    return mapped


def compaction_start(messages: list[Any]) -> int:
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


def engine_item(item: dict[str, Any], *, newest: bool) -> list[Message]:
    role = item.get("role")
    content = item.get("content")
    if role == "assistant":
        return [_assistant(content)]
    if role == "user" and isinstance(content, list) and has_results(content):
        results = [b for b in content if is_result(b)]
        out = [_tool(b) for b in results]
        rest = [b for b in content if not is_result(b)]
        if rest and not newest:
            out.append(engine_message("user", rest))
        elif rest:  # the newest request: kept with the results (see the module doc)
            last = out[-1]
            last["content"] = result_parts(results[-1]) + engine_parts(rest)
            uncut = "\n".join(t for t in (last.get(UNCUT, ""), _uncut(rest)) if t)
            if uncut:
                last[UNCUT] = uncut
            if _opaque(rest):
                last[OPAQUE_KEY] = True
        return out
    return [engine_message(role if role in ROLES else "user", content)]


def engine_message(role: Any, content: Any) -> Message:
    message: Message = {"role": role, "content": engine_parts(content)}
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
    message = engine_message("assistant", content)
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
    message = engine_message("tool", "" if content is None else content)
    message["tool_call_id"] = block.get("tool_use_id")
    return message


def result_parts(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A tool_result's content as parts (a string is one text part)."""
    content = block.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return engine_parts(content) if isinstance(content, list) else []


def has_results(content: list[Any]) -> bool:
    return any(is_result(b) for b in content)


def block_kind(block: Any) -> str:
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


def engine_parts(content: Any) -> Any:
    """The engine's content: a string as it is, blocks as parts (text and images only)."""
    if not isinstance(content, list):
        return content
    parts: list[dict[str, Any]] = []
    for block in content:
        kind = block_kind(block)
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
        if block_kind(block) != "uncut" or is_result(block):
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
