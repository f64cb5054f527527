"""One chat message read: its shape checked, its text, its tool calls, and
whether the engine must keep it as it is (pinned, opaque, a truncation note).
How messages group, and whether their tool calls pair up: :mod:`compaction.chat.groups`.

Pure functions over ``list[Message]``; nothing here mutates its input.

A **pinned** message is a system or developer message after the head (an
instruction the client inserted mid-conversation: Claude Code's
``{"role": "system"}`` messages, a Responses ``developer`` item). It is an
instruction, not history: no stage prunes, summarizes, cuts or drops it.

An **opaque** message holds content the engine cannot read and no summary can
stand for: a content part of a type it does not know (a client's newer block,
an Anthropic ``tool_reference`` that loads a tool), or one a caller mapping
another API marked with :data:`OPAQUE_KEY`. A condensed span does not lose
it: the whole group holding it rides along after the summary, as a pinned
message does (:func:`compaction.chat.groups.riding_in`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from compaction.errors import InvalidMessagesError
from compaction.types import Message

#: Content given to a tool call that arrived without a result.
MISSING_RESULT = "[no result recorded]"
#: The user message hard truncation puts where it dropped ``count`` messages.
TRUNCATION_NOTE = "[{count} earlier messages were removed to fit the context window.]"
# Built from the format, so the two cannot drift apart.
_TRUNCATION_NOTE = re.compile(re.escape(TRUNCATION_NOTE).replace(re.escape("{count}"), r"(\d+)"))

HEAD_ROLES = frozenset({"system", "developer"})
RESULT_ROLES = frozenset({"tool", "function"})
#: Roles of the messages kept verbatim wherever they sit (see the module doc).
PINNED_ROLES = HEAD_ROLES
#: Key a caller mapping another API puts on a message: ``True`` when it holds
#: content no summary can stand for, ``False`` when its parts are the caller's
#: own and hold none. Without it, the content parts decide (:func:`is_opaque`).
#: Never sent upstream, and not counted.
OPAQUE_KEY = "_compaction_opaque"
#: Content part types the engine reads or counts as what they are (the chat and
#: Responses APIs' text, images, audio, files and refusals; ``image`` is an
#: image a caller mapped for counting). Any other part is opaque.
KNOWN_PARTS = frozenset(
    {
        "text",
        "image_url",
        "input_audio",
        "file",
        "refusal",
        "image",
        "input_text",
        "output_text",
        "input_image",
        "input_file",
    }
)


# --- reading one message ---------------------------------------------------


def check_messages(messages: Any) -> list[Message]:
    """Raise :class:`InvalidMessagesError` unless ``messages`` is a list of objects with a role."""
    if not isinstance(messages, list):
        raise InvalidMessagesError("messages", f"expected an array, got {type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidMessagesError(
                f"messages[{i}]", f"expected an object, got {type(message).__name__}"
            )
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidMessagesError(f"messages[{i}].role", "missing or not a string")
        # Checked per message of every request: most messages have none of these.
        if "tool_calls" in message or "tool_call_id" in message or "function_call" in message:
            _check_pairing_fields(message, f"messages[{i}]")
    return messages


def _check_pairing_fields(message: Message, where: str) -> None:
    """The fields that pair calls with results must have the types OpenAI gives them."""
    call_id = message.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise InvalidMessagesError(f"{where}.tool_call_id", "expected a string")
    function_call = message.get("function_call")
    if function_call is not None and not isinstance(function_call, dict):
        raise InvalidMessagesError(f"{where}.function_call", "expected an object")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise InvalidMessagesError(f"{where}.tool_calls", "expected an array")
    for j, call in enumerate(calls):
        if not isinstance(call, dict):
            raise InvalidMessagesError(f"{where}.tool_calls[{j}]", "expected an object")
        if call.get("id") is not None and not isinstance(call.get("id"), str):
            raise InvalidMessagesError(f"{where}.tool_calls[{j}].id", "expected a string")
        function = call.get("function")
        if function is not None and not isinstance(function, dict):
            raise InvalidMessagesError(f"{where}.tool_calls[{j}].function", "expected an object")


def message_text(message: Message) -> str:
    """The text of a message: its string content, or its text parts joined by newlines."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(texts)
    return ""


def tool_calls(message: Message) -> list[dict[str, Any]]:
    """The well-formed entries of an assistant message's ``tool_calls``."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [call for call in calls if isinstance(call, dict)]


def call_name_and_arguments(call: dict[str, Any]) -> tuple[str, str]:
    """``(name, arguments)`` of a tool call or legacy function call, empty when absent."""
    function = call.get("function", call)
    if not isinstance(function, dict):
        return "", ""
    name = function.get("name")
    arguments = function.get("arguments")
    return (
        name if isinstance(name, str) else "",
        arguments if isinstance(arguments, str) else "",
    )


def truncation_note(count: int) -> Message:
    """The user message standing in for ``count`` messages dropped by hard truncation."""
    return {"role": "user", "content": TRUNCATION_NOTE.format(count=count)}


def truncation_note_count(message: Message) -> int | None:
    """How many messages a truncation note stands for; ``None`` for any other message."""
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, str):
        return None
    match = _TRUNCATION_NOTE.fullmatch(content)
    return int(match.group(1)) if match else None


def is_truncation_note(message: Message) -> bool:
    """Whether the message is a note left by hard truncation."""
    return truncation_note_count(message) is not None


def is_pinned(message: Message) -> bool:
    """Whether the message is an instruction every stage keeps verbatim (a
    system or developer message; after the head, see the module doc)."""
    return message.get("role") in PINNED_ROLES


def pinned_in(messages: Sequence[Message], start: int, end: int) -> list[int]:
    """The indices of the pinned messages among ``messages[start:end]``."""
    return [i for i in range(max(start, 0), min(end, len(messages))) if is_pinned(messages[i])]


def is_opaque(message: Message) -> bool:
    """Whether the message holds content no summary can stand for (see the module doc)."""
    marked = message.get(OPAQUE_KEY)
    if isinstance(marked, bool):
        return marked
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") not in KNOWN_PARTS for part in content
    )
