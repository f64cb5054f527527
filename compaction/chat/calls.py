"""Describing tool calls: which argument says what a call acted on, and
which call a result answers. Pure functions over plain message dicts."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from compaction.chat.messages import RESULT_ROLES, call_name_and_arguments, tool_calls
from compaction.types import Message

#: Argument names that hold the file a tool call acted on.
PATH_ARGUMENTS: tuple[str, ...] = (
    "path",
    "file_path",
    "filepath",
    "file",
    "filename",
    "target_file",
)
#: Argument names that hold a shell command line.
COMMAND_ARGUMENTS: tuple[str, ...] = ("command", "cmd")
#: Argument names that identify what a tool call acted on, most telling first.
KEY_ARGUMENTS: tuple[str, ...] = (
    *PATH_ARGUMENTS,
    *COMMAND_ARGUMENTS,
    "query",
    "pattern",
    "url",
    "uri",
    "name",
    "id",
)
_SHORT_ARGUMENT = 200
#: Commands that show files rather than run anything: what they print is
#: content (a docstring's ``ValueError: …``), not an error that happened.
_SHOWS_FILES = re.compile(
    r"^(?:cd\s+\S+\s*&&\s*)?(?:cat|head|tail|nl|less|more|grep|egrep|rg|ag|find|ls|"
    r"sed\s+-n|awk|git\s+(?:diff|show|log|grep))\b"
)


def parse_arguments(arguments: str) -> Any:
    """A tool call's ``arguments`` decoded from JSON, or ``None`` when they are not
    JSON — or nested deeper than Python's recursion allows (a client's or a
    model's text: one made of ``[`` alone must not end the request in a 500)."""
    try:
        return json.loads(arguments) if arguments else None
    except (ValueError, RecursionError):
        return None


def key_argument(call: dict[str, Any]) -> tuple[str, str]:
    """``(argument name, value)`` that best says what a tool call acted on.

    The first of :data:`KEY_ARGUMENTS` present as a string; otherwise the first
    short string argument; ``("", "")`` when there is none.
    """
    _, arguments = call_name_and_arguments(call)
    parsed = parse_arguments(arguments)
    if not isinstance(parsed, dict):
        return "", ""
    for key in KEY_ARGUMENTS:
        value = parsed.get(key)
        if isinstance(value, str) and value:
            return key, value
    for key, value in parsed.items():
        if isinstance(value, str) and value and len(value) <= _SHORT_ARGUMENT:
            return str(key), value
    return "", ""


def call_for_result(messages: Sequence[Message], index: int) -> dict[str, Any] | None:
    """The tool call (or legacy function call) that the result at ``index`` answers."""
    result = messages[index]
    call_id = result.get("tool_call_id")
    for i in range(index - 1, -1, -1):
        message = messages[i]
        if message.get("role") in RESULT_ROLES:
            continue
        if message.get("role") != "assistant":
            if result.get("role") == "tool":
                continue  # a message inside the group, between the call and this result
            return None
        if result.get("role") == "tool" and not any(
            call.get("id") == call_id for call in tool_calls(message)
        ):
            continue  # a later call of the same group (compaction.chat.messages)
        for call in tool_calls(message):
            if call.get("id") == call_id:
                return call
        function_call = message.get("function_call")
        if isinstance(function_call, dict) and result.get("role") == "function":
            return function_call
        return None
    return None


def shows_files(call: dict[str, Any] | None) -> bool:
    """Whether ``call`` shows files (``cat``, ``sed -n``, a path tool) rather than runs something.

    Error-looking lines in what such a call returns are file content, unless
    the call itself failed.
    """
    if call is None:
        return False
    key, value = key_argument(call)
    if key in COMMAND_ARGUMENTS:
        return bool(_SHOWS_FILES.match(value.strip())) or value.strip() == "view"
    return key in PATH_ARGUMENTS
