"""The Anthropic Messages API's tool pairing rule: checked, and kept by a last pass.

The API refuses a ``tool_use`` whose ``tool_result`` does not open the next
message, and a ``tool_result`` whose ``tool_use`` is not in the message just
before. :func:`pairing_problems` says how messages break it, in the API's own
words (the scripted upstream of the tests refuses with them);
:func:`keep_pairing` is the dialect's safety net after a rebuild: any block
that would break it is written as text (the engine keeps tool groups whole, so
it only fires on output that split one).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from compaction import SUMMARY_MARKER, message_text

#: The engine's truncation note (compaction.messages.TRUNCATION_NOTE) as the dialect sends it.
_NOTE = re.compile(r"\[\d+ earlier messages were removed to fit the context window\.\]")


def is_result(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_result"


def text_block(text: str) -> dict[str, Any]:
    """A text block of the Messages API."""
    return {"type": "text", "text": text}


def as_json(value: Any) -> str:
    """``value`` as JSON text (what a tool call's arguments are in the engine's terms)."""
    return orjson.dumps(value, default=repr).decode()


def _tool_uses(message: Any) -> list[dict[str, Any]]:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return []
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


def _results(message: Any) -> list[dict[str, Any]]:
    if not isinstance(message, dict) or message.get("role") != "user":
        return []
    content = message.get("content")
    return [b for b in content if is_result(b)] if isinstance(content, list) else []


def _leading_results(message: Any) -> set[Any]:
    """The ``tool_use_id`` of the tool_result blocks a user message starts with."""
    ids: set[Any] = set()
    if not isinstance(message, dict) or message.get("role") != "user":
        return ids
    content = message.get("content")
    if not isinstance(content, list):
        return ids
    for block in content:
        if not is_result(block):
            break
        ids.add(block.get("tool_use_id"))
    return ids


def pairing_problems(messages: list[Any]) -> list[str]:
    """How ``messages`` break the Messages API's tool pairing rule, in the API's
    own words (empty when valid):

    * every ``tool_use`` of an assistant message has its ``tool_result`` at the
      start of the next message (``messages.N: `tool_use` ids were found
      without `tool_result` blocks immediately after``);
    * every ``tool_result`` answers a ``tool_use`` of the message just before
      (``unexpected `tool_use_id` found in `tool_result` blocks``).
    """
    problems: list[str] = []
    for i, message in enumerate(messages):
        uses = [b.get("id") for b in _tool_uses(message)]
        if uses:
            answered = _leading_results(messages[i + 1]) if i + 1 < len(messages) else set()
            missing = [u for u in uses if u not in answered]
            if missing:
                problems.append(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(map(str, missing))}. Each `tool_use` block "
                    "must have a corresponding `tool_result` block in the next message."
                )
        results = _results(message)
        if results:
            issued = {b.get("id") for b in _tool_uses(messages[i - 1])} if i else set()
            unexpected = [
                b.get("tool_use_id") for b in results if b.get("tool_use_id") not in issued
            ]
            if unexpected:
                problems.append(
                    f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{', '.join(map(str, unexpected))}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
    return problems


def keep_pairing(messages: list[Any]) -> list[Any]:
    """``messages`` with every tool_use/tool_result that would break the pairing rule
    turned into text, and the system messages where the API takes them
    (:func:`keep_system_placement`); the same list when nothing breaks (the usual case)."""
    messages = keep_system_placement(messages)
    if not pairing_problems(messages):
        return messages
    names = {b.get("id"): b.get("name") for m in messages for b in _tool_uses(m)}
    out = list(messages)
    for i, message in enumerate(out):
        uses = _tool_uses(message)
        if uses:
            answered = _leading_results(out[i + 1]) if i + 1 < len(out) else set()
            unanswered = {b.get("id") for b in uses if b.get("id") not in answered}
            if unanswered:
                out[i] = _as_text(message, lambda b, ids=unanswered: b.get("id") in ids)
        results = _results(message)
        if results:
            issued = {b.get("id") for b in _tool_uses(out[i - 1])} if i else set()
            if any(b.get("tool_use_id") not in issued for b in results):
                out[i] = _results_first(
                    _as_text(
                        message,
                        lambda b, ids=issued: is_result(b) and b.get("tool_use_id") not in ids,
                        names,
                    )
                )
    return out


def _as_text(message: dict[str, Any], which: Any, names: dict[Any, Any] | None = None) -> Any:
    """``message`` with the blocks ``which`` picks written as text blocks (a block's
    ``cache_control`` goes with its text: the prefix it marks ends there still)."""
    content = []
    for block in message["content"]:
        if not which(block):
            content.append(block)
            continue
        if block.get("type") == "tool_use":
            call = f"{block.get('name')}({as_json(block.get('input', {}))})"
            text = text_block(f"[tool call {call}]")
        else:
            name = (names or {}).get(block.get("tool_use_id")) or "a tool"
            result = message_text({"content": block.get("content")}) or "(empty)"
            text = text_block(f"[tool result for {name}: {result}]")
        if block.get("cache_control") is not None:
            text["cache_control"] = block["cache_control"]
        content.append(text)
    return {**message, "content": content}


def _results_first(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    ordered = [b for b in content if is_result(b)] + [b for b in content if not is_result(b)]
    return {**message, "content": ordered}


def keep_system_placement(messages: list[Any]) -> list[Any]:
    """``messages`` with the mid-conversation ``{"role": "system"}`` messages the
    engine moved put where the API accepts one: right after a user message (or
    an assistant message ending in a server tool use), followed by an assistant
    message or last, never next to another.

    The engine keeps them verbatim, those of a condensed (or dropped) span right
    after the summary (or the truncation note), where the next message may be a
    user message or another of them. Those — the run right after a summary or a
    note — move on to just before the next assistant message that follows a
    user message, merged into one (their blocks in order). A run that meets a
    system message the client placed, or the end, first stays where it is; a
    system message the client placed is never moved. The same list when nothing
    moves (what a client sends).
    """
    if not any(isinstance(m, dict) and m.get("role") == "system" for m in messages):
        return messages
    out: list[Any] = []
    waiting: list[dict[str, Any]] = []
    taken_at = 0  # where the waiting run was taken out
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        follows = len(out) == taken_at if waiting else bool(out) and _stands_for_span(out[-1])
        if role == "system" and follows:  # the run right after a summary or a note
            if not waiting:
                taken_at = len(out)
            waiting.append(message)
            continue
        if waiting and role == "assistant" and _takes_system(out[-1]):
            out.append(_merged(waiting))
            waiting = []
        elif waiting and role == "system":  # one the client placed: the run stays
            out[taken_at:taken_at] = waiting
            waiting = []
        out.append(message)
    out[taken_at:taken_at] = waiting  # met the end first: stays
    same = len(out) == len(messages) and all(a is b for a, b in zip(out, messages, strict=True))
    return messages if same else out


def _stands_for_span(message: Any) -> bool:
    """Whether ``message`` is a summary or a truncation note the engine wrote."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return False
    text = message_text(message)
    return text.startswith(SUMMARY_MARKER) or bool(_NOTE.fullmatch(text))


def _takes_system(message: Any) -> bool:
    """Whether a mid-conversation system message may come right after ``message``."""
    if not isinstance(message, dict):
        return False
    if message.get("role") == "user":
        return True
    content = message.get("content")
    last = content[-1] if message.get("role") == "assistant" and isinstance(content, list) else None
    return isinstance(last, dict) and last.get("type") == "server_tool_use"


def _merged(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One system message for ``messages`` (the message itself when alone), with
    the fields of each that the proxy does not own (the first's, where two have
    the same)."""
    if len(messages) == 1:
        return messages[0]
    blocks: list[Any] = []
    fields: dict[str, Any] = {}
    for message in messages:
        content = message.get("content")
        blocks.extend(content if isinstance(content, list) else [text_block(str(content))])
        for key, value in message.items():
            fields.setdefault(key, value)
    return {**fields, "role": "system", "content": blocks}
