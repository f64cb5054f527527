"""Stage 1: the pruner — zero cost, deterministic, idempotent (DESIGN.md §5.1).

Shrinks the bulky parts of the middle without calling a model:

* a tool result longer than ``tool_result_chars`` becomes a one-line brief built
  from the call that asked for it: ``[read_file] src/app.py (45,210 chars)``,
  ``[bash] "pytest -q" → 32 lines output (exit code 1, AssertionError: …)``;
* tool-call arguments longer than ``tool_args_chars`` are cut inside their JSON
  (long string values lose their ends), so valid JSON stays valid;
* assistant text longer than ``assistant_text_chars`` keeps its start and end
  around a marker saying how much was cut. For content given as a list of
  parts, each text part is cut on its own and images are left alone.

Every rewrite lands at or below the threshold that triggered it, so pruning a
pruned message changes nothing: the same history always prunes to the same
bytes, which keeps upstream prompt caches hitting between compactions
(DESIGN.md §7). Pure functions; the input is never mutated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compaction.messages import (
    KEY_ARGUMENTS,
    RESULT_ROLES,
    call_for_result,
    call_name_and_arguments,
    key_argument,
    message_text,
)
from compaction.profile import Profile
from compaction.types import Message

# Wider than any marker _text_marker / _value_marker can produce for a string
# that fits in memory, so a cut string is never long enough to be cut again.
_TEXT_MARKER_ROOM = 48
_VALUE_MARKER_ROOM = 32
#: A JSON string value is never cut shorter than this: shorter keeps nothing useful.
_MIN_VALUE_CHARS = 40

_BRIEF_NAME_CHARS = 64
_BRIEF_ARG_CHARS = 80
_BRIEF_STATUS_CHARS = 80
#: Lines at each end of a result searched for an exit status: shells and agent
#: frameworks report it first or last, and looking everywhere would pick up
#: ``returncode == 0`` from source code being read.
_STATUS_EDGE_LINES = 5
_ERROR_TAIL_LINES = 20

_COMMAND_KEYS = frozenset({"command", "cmd"})
_QUOTED_KEYS = _COMMAND_KEYS | {"query", "pattern"}
_PLAIN_KEYS = frozenset(KEY_ARGUMENTS) - _QUOTED_KEYS

_RETURNCODE_TAG = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_EXIT_PHRASE = re.compile(
    r"\b(?:exit(?:ed with)?[ _-]?(?:code|status)|return[ _-]?code)\b[\s:=]*(-?\d+)",
    re.IGNORECASE,
)
_OUTPUT_TAG = re.compile(r"<output>\n?(.*)</output>", re.DOTALL)
_TRACEBACK = "Traceback (most recent call last)"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b")
_ERROR_LINE = re.compile(r"^\s*(?:error|fatal|panic)\b\s*[:\[]|^npm ERR!", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class PruneResult:
    """The pruned conversation and how many messages were changed."""

    messages: list[Message]
    pruned: int


def prune(messages: Sequence[Message], start: int, end: int, profile: Profile) -> PruneResult:
    """Prune messages ``[start, end)``; every other message comes back as the same object."""
    out = list(messages)
    pruned = 0
    for i in range(max(start, 0), min(end, len(out))):
        message = messages[i]
        role = message.get("role")
        if role in RESULT_ROLES:
            new = _prune_result(messages, i, profile)
        elif role == "assistant":
            new = _prune_assistant(message, profile)
        else:
            continue
        if new is not message:
            out[i] = new
            pruned += 1
    return PruneResult(out, pruned)


# --- tool results ----------------------------------------------------------


def _prune_result(messages: Sequence[Message], index: int, profile: Profile) -> Message:
    message = messages[index]
    limit = profile.tool_result_chars
    if len(message_text(message)) <= limit:
        return message
    # Calls are looked up in the input, whose arguments are not cut yet.
    brief = tool_brief(call_for_result(messages, index), message)
    if len(brief) > limit:  # only with a tiny configured limit
        brief = brief[: max(limit - 1, 0)] + "…"
    return {**message, "content": brief}


def tool_brief(call: dict[str, Any] | None, result: Message) -> str:
    """One line saying what a tool call did and how big its result was.

    ``[read_file] src/app.py (45,210 chars)``, ``[bash] "npm test" → 32 lines
    output (exit code 1)``, ``[search] "token limit" (12,400 chars)``,
    ``[get_order] order_id="A1" (900 chars)`` for an argument with no telling
    name. The exit status and the last error line are added where the result
    shows them. At most about 350 characters, whatever the input.
    """
    name = ""
    key, value = "", ""
    if call is not None:
        name, _ = call_name_and_arguments(call)
        key, value = key_argument(call)
    if not name:
        result_name = result.get("name")
        name = result_name if isinstance(result_name, str) and result_name else "tool"
    text = message_text(result)

    extras = _status(text)
    images = _image_count(result.get("content"))
    if images:
        extras.append(f"{images} image" + ("s" if images != 1 else ""))

    if key in _COMMAND_KEYS:
        lines = _line_count(_command_output(text))
        size = f"→ {lines:,} line{'s' if lines != 1 else ''} output"
        size += f" ({', '.join(extras)})" if extras else ""
    else:
        size = f"({', '.join([f'{len(text):,} chars', *extras])})"

    parts = [f"[{_one_line(name, _BRIEF_NAME_CHARS)}]"]
    if value:
        shown = _one_line(value, _BRIEF_ARG_CHARS)
        if key in _PLAIN_KEYS:
            parts.append(shown)
        elif key in _QUOTED_KEYS:
            parts.append(f'"{shown}"')
        else:  # an argument with no telling name: say which one it is
            parts.append(f'{_one_line(key, _BRIEF_NAME_CHARS)}="{shown}"')
    parts.append(size)
    return " ".join(parts)


def _status(text: str) -> list[str]:
    """What the result shows about success: an exit code, then the last error line."""
    found: list[str] = []
    lines = text.splitlines()
    edges = lines[:_STATUS_EDGE_LINES] + lines[-_STATUS_EDGE_LINES:]
    for line in edges:
        match = _RETURNCODE_TAG.search(line) or _EXIT_PHRASE.search(line)
        if match:
            found.append(f"exit code {match.group(1)}")
            break
    error = _error_line(text, lines)
    if error:
        found.append(_one_line(error, _BRIEF_STATUS_CHARS))
    return found


def _error_line(text: str, lines: list[str]) -> str:
    if _TRACEBACK in text:
        last_traceback = max(i for i, line in enumerate(lines) if _TRACEBACK in line)
        exceptions = [
            line for line in lines[last_traceback + 1 :] if _EXCEPTION_LINE.match(line.strip())
        ]
        if exceptions:
            return exceptions[-1].strip()
    for line in reversed(lines[-_ERROR_TAIL_LINES:]):
        if _ERROR_LINE.match(line):
            return line.strip()
    return ""


def _command_output(text: str) -> str:
    # mini-swe-agent wraps output as <returncode>N</returncode><output>…</output>;
    # the wrapper is not output the command printed.
    match = _OUTPUT_TAG.search(text)
    return match.group(1) if match else text


def _line_count(text: str) -> int:
    stripped = text.rstrip("\n")
    return stripped.count("\n") + 1 if stripped else 0


def _image_count(content: Any) -> int:
    if not isinstance(content, list):
        return 0
    return sum(
        1
        for part in content
        if isinstance(part, dict) and part.get("type") in ("image_url", "image", "input_image")
    )


def _one_line(text: str, limit: int) -> str:
    flat = _WHITESPACE.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# --- assistant messages ----------------------------------------------------


def _prune_assistant(message: Message, profile: Profile) -> Message:
    changes: dict[str, Any] = {}

    calls = message.get("tool_calls")
    if isinstance(calls, list):
        new_calls = [_prune_call(call, profile.tool_args_chars) for call in calls]
        if any(new is not old for new, old in zip(new_calls, calls, strict=True)):
            changes["tool_calls"] = new_calls
    function_call = message.get("function_call")
    if isinstance(function_call, dict):
        new_function_call = _prune_function(function_call, profile.tool_args_chars)
        if new_function_call is not function_call:
            changes["function_call"] = new_function_call

    content = message.get("content")
    new_content = _cut_content(content, profile)
    if new_content is not content:
        changes["content"] = new_content

    return {**message, **changes} if changes else message


def _prune_call(call: Any, limit: int) -> Any:
    if not isinstance(call, dict):
        return call
    function = call.get("function")
    if isinstance(function, dict):
        new_function = _prune_function(function, limit)
        return call if new_function is function else {**call, "function": new_function}
    return _prune_function(call, limit)


def _prune_function(function: dict[str, Any], limit: int) -> dict[str, Any]:
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return function
    new = shrink_arguments(arguments, limit)
    return function if new == arguments else {**function, "arguments": new}


def _cut_content(content: Any, profile: Profile) -> Any:
    if isinstance(content, str):
        return _cut_assistant_text(content, profile)
    if not isinstance(content, list):
        return content
    parts = [_cut_part(part, profile) for part in content]
    if all(new is old for new, old in zip(parts, content, strict=True)):
        return content
    return parts


def _cut_part(part: Any, profile: Profile) -> Any:
    if not isinstance(part, dict) or not isinstance(part.get("text"), str):
        return part
    text = part["text"]
    cut = _cut_assistant_text(text, profile)
    return part if cut is text else {**part, "text": cut}


def _cut_assistant_text(text: str, profile: Profile) -> str:
    if len(text) <= profile.assistant_text_chars:
        return text
    return cut_middle(text, profile.assistant_keep_start, profile.assistant_keep_end)


# --- cutting, shared with stage 3 ------------------------------------------


def _text_marker(cut: int) -> str:
    return f"\n[… {cut:,} characters cut …]\n"


def cut_middle(text: str, keep_start: int, keep_end: int) -> str:
    """``text`` with its middle replaced by a marker saying how much was cut.

    Returns ``text`` itself (the same object) when cutting would not make it
    shorter, so a cut text is never cut again with the same figures.
    """
    keep_start, keep_end = max(keep_start, 0), max(keep_end, 0)
    if len(text) <= keep_start + keep_end + _TEXT_MARKER_ROOM:
        return text
    cut = len(text) - keep_start - keep_end
    return text[:keep_start] + _text_marker(cut) + text[len(text) - keep_end :]


def _value_marker(cut: int) -> str:
    return f"…[{cut:,} chars cut]"


def _cap_value(value: str, cap: int) -> str:
    if len(value) <= cap + _VALUE_MARKER_ROOM:
        return value
    return value[:cap] + _value_marker(len(value) - cap)


def _cap_strings(value: Any, cap: int) -> Any:
    """``value`` with every string longer than ``cap`` (plus marker room) cut. Keys stay."""
    if isinstance(value, str):
        return _cap_value(value, cap)
    if isinstance(value, list):
        return [_cap_strings(item, cap) for item in value]
    if isinstance(value, dict):
        return {key: _cap_strings(item, cap) for key, item in value.items()}
    return value


def _longest_string(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return max((_longest_string(item) for item in value), default=0)
    if isinstance(value, dict):
        return max((_longest_string(item) for item in value.values()), default=0)
    return 0


def _dumps(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        text.encode()
    except UnicodeEncodeError:  # lone surrogates from \ud800 escapes: keep them escaped
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def shrink_arguments(arguments: str, limit: int) -> str:
    """Tool-call ``arguments`` cut to about ``limit`` characters, inside the JSON.

    Every string value is capped at one common length, the largest that lets
    the re-serialized JSON fit (so the longest values lose the most); valid
    JSON stays valid. When even short values do not fit (many keys), the
    values are cut to a floor and the result may stay above ``limit``.
    Arguments that are not JSON are cut as a plain string. Returns
    ``arguments`` unchanged when nothing shorter comes out; a second call
    with the same ``limit`` returns its input.
    """
    limit = max(limit, 2 * _VALUE_MARKER_ROOM)
    if len(arguments) <= limit:
        return arguments
    try:
        parsed = json.loads(arguments, parse_constant=_reject_constant)
        candidate = _dumps(_shrink_json(parsed, limit))
    except ValueError:  # not JSON, or values JSON cannot write back (1e400 → inf)
        pass
    else:
        return candidate if len(candidate) < len(arguments) else arguments
    keep = limit - _VALUE_MARKER_ROOM
    return arguments[:keep] + _value_marker(len(arguments) - keep)


def _shrink_json(parsed: Any, limit: int) -> Any:
    def fits(cap: int) -> bool:
        return len(_dumps(_cap_strings(parsed, cap))) <= limit

    low, high = _MIN_VALUE_CHARS, max(_longest_string(parsed), _MIN_VALUE_CHARS)
    if fits(low):
        # Largest cap that fits: cutting as little as possible.
        while low < high:
            middle = (low + high + 1) // 2
            if fits(middle):
                low = middle
            else:
                high = middle - 1
    return _cap_strings(parsed, low)
