"""A chat request as the simulated provider sees it: an ordered tuple of segments.

A provider renders a request into one token sequence: the tool schemas first,
then each message in order. The cache simulator compares prompts by that
sequence, so a prompt here is the same thing cut where the messages begin and
end::

    segments = (tools block?, message 0, message 1, …)

Each segment is a canonical text: its role, its name, its text content, its tool
calls (name and arguments as sent) and the id of the call it answers — the
parts a chat template renders. Two messages with the same segment render to the
same tokens; two prompts agree up to the first segment that differs, and only
that one needs a token-by-token comparison (:mod:`evaluation.replay.cache`).
Fields a template does not render (``metadata``, ``user``, sampling settings)
are not part of the prompt. Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from compaction import Message, call_name_and_arguments, message_text, tool_calls

#: Opens the tools block and each message, so that no segment's text can run on into
#: the next one's when they are tokenized apart.
_TOOLS_OPEN = "<|tools|>"
_MESSAGE_OPEN = "<|{role}|>"


def prompt_segments(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The segments of the prompt ``body`` (a chat-completions request) renders to."""
    segments: list[str] = []
    tools = body.get("tools")
    if tools:
        segments.append(_TOOLS_OPEN + orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode())
    messages = body.get("messages") or ()
    segments.extend(message_segment(message) for message in messages if isinstance(message, dict))
    return tuple(segments)


def message_segment(message: Message) -> str:
    """One message as the canonical text a chat template would render."""
    role = str(message.get("role", ""))
    parts = [_MESSAGE_OPEN.format(role=role)]
    name = message.get("name")
    if isinstance(name, str):
        parts.append(f"name={name}\n")
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str):
        parts.append(f"call_id={call_id}\n")
    parts.append(_content_text(message))
    for call in tool_calls(message):
        call_name, arguments = call_name_and_arguments(call)
        parts.append(f"\n<|call|>{call_name} {arguments}")
    return "".join(parts)


def _content_text(message: Message) -> str:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    text = message_text(message)
    others = (
        [
            part
            for part in content
            if not (isinstance(part, dict) and isinstance(part.get("text"), str))
        ]
        if isinstance(content, list)
        else [content]
    )
    if others:
        text += orjson.dumps(others, option=orjson.OPT_SORT_KEYS).decode()
    return text


def sent_text(messages: Sequence[Message]) -> str:
    """Everything a model reads of ``messages`` as words: each message's text and
    its tool calls' arguments, one after the other (what the next-step facts
    are looked for in)."""
    parts: list[str] = []
    for message in messages:
        parts.append(message_text(message))
        for call in tool_calls(message):
            parts.append(call_name_and_arguments(call)[1])
    return "\n".join(parts)
