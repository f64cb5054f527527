"""Stage 1: the pruner — zero cost, deterministic, idempotent (docs/compaction.md, "The stages").

Shrinks the bulky parts of the middle without calling a model:

* a tool result longer than ``tool_result_chars`` becomes a one-line brief built
  from the call that asked for it — the tool, the gist of its arguments, the
  size, the exit status and the first error line (and the last, when the
  threshold leaves room): ``[read_file] src/app.py (45,210 chars)``,
  ``[bash] "pytest -q" → 32 lines output (exit code 1, AssertionError: x; last:
  FAILED (failures=1))``; the brief never exceeds ``tool_result_chars``; with
  ``Profile.recall`` and a caller's salt it ends with `` [ref: r…]``, the ref
  of the text it replaces (:mod:`compaction.chat.recall`), inside that limit;
  parts of a type the engine does not know ride along after the brief;
* tool-call arguments longer than ``tool_args_chars`` are cut inside their JSON
  (long string values lose their ends), so valid JSON stays valid;
* assistant text longer than ``assistant_text_chars`` keeps its start and end
  around a marker saying how much was cut. For content given as a list of
  parts, each text part is cut on its own and images are left alone.

Every rewrite lands at or below the threshold that triggered it, so pruning a
pruned message changes nothing: the same history always prunes to the same
bytes, which keeps upstream prompt caches hitting between compactions
(docs/state.md). Pure functions; the input is never mutated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compaction.budget.profile import Profile
from compaction.chat.calls import (
    COMMAND_ARGUMENTS,
    KEY_ARGUMENTS,
    call_for_result,
    key_argument,
    parse_arguments,
    shows_files,
)
from compaction.chat.messages import (
    KNOWN_PARTS,
    RESULT_ROLES,
    call_name_and_arguments,
    message_text,
)
from compaction.chat.own import own
from compaction.chat.recall import brief_ref, mark, original_text, ref_of, ref_suffix
from compaction.text.clipping import KEPT_LINE_CHARS, error_lines
from compaction.text.cuts import cut_middle, one_line, output_body, shrink_arguments
from compaction.types import Message

_BRIEF_NAME_CHARS = 64
_BRIEF_ARG_CHARS = 80
#: Other short arguments shown after the key one (``command=view``), in all.
_BRIEF_GIST_CHARS = 60
_GIST_VALUE_CHARS = 30
#: The error line is kept whole up to KEPT_LINE_CHARS, as long as the brief
#: stays within the pruning threshold; it is never cut shorter than this.
_BRIEF_MIN_ERROR_CHARS = 60
#: Any ref, for the length of its marker (every ref has the same length).
_REF_SHAPE = "r" + "a" * 12
#: A brief is given a ref only when at least this much of it is left beside
#: the marker: under a smaller limit a ref would be nearly all the brief.
_MIN_MARKED_BRIEF = 24
#: Between the first and the last error line of a brief (read back by compaction.summary.steps).
LAST_ERROR_SEPARATOR = "; last: "
#: Lines at each end of a result searched for an exit status: shells and agent
#: frameworks report it first or last, and looking everywhere would pick up
#: ``returncode == 0`` from source code being read.
_STATUS_EDGE_LINES = 5

_COMMAND_KEYS = frozenset(COMMAND_ARGUMENTS)
_QUOTED_KEYS = _COMMAND_KEYS | {"query", "pattern"}
_PLAIN_KEYS = frozenset(KEY_ARGUMENTS) - _QUOTED_KEYS

_RETURNCODE_TAG = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_EXIT_PHRASE = re.compile(
    r"\b(?:exit(?:ed with)?[ _-]?(?:code|status)|return[ _-]?code)\b[\s:=]*(-?\d+)",
    re.IGNORECASE,
)
_TRACEBACK = "Traceback (most recent call last)"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?::|$)")
_FAILED_START = re.compile(r"(?i)^\s*(?:error|fatal|failed|exception)\b")


@dataclass(frozen=True)
class PruneResult:
    """The pruned conversation and how many messages were changed."""

    messages: list[Message]
    pruned: int


def prune(
    messages: Sequence[Message], start: int, end: int, profile: Profile, *, salt: str = ""
) -> PruneResult:
    """Prune messages ``[start, end)``; every other message comes back as the same object.

    With ``profile.recall`` and a ``salt`` (whose conversation this is), each
    brief ends with the ref of the text it replaces (:mod:`compaction.chat.recall`).
    """
    out = list(messages)
    pruned = 0
    salt = salt if profile.recall else ""
    for i in range(max(start, 0), min(end, len(out))):
        message = messages[i]
        role = message.get("role")
        if role in RESULT_ROLES:
            new = _prune_result(messages, i, profile, salt)
        elif role == "assistant":
            new = _prune_assistant(message, profile, salt)
        else:
            continue
        if new is not message:
            out[i] = new
            pruned += 1
    return PruneResult(out, pruned)


# --- tool results ----------------------------------------------------------


def _prune_result(messages: Sequence[Message], index: int, profile: Profile, salt: str) -> Message:
    message = messages[index]
    limit = profile.tool_result_chars
    text = message_text(message)
    if len(text) <= limit:
        return message
    suffix = ""
    if salt and limit - len(ref_suffix(_REF_SHAPE)) >= _MIN_MARKED_BRIEF:
        # A text that already ends with a ref (a brief made under a larger
        # limit) keeps it: the ref names the original, which a brief of the
        # brief is not.
        suffix = ref_suffix(brief_ref(message) or ref_of(salt, text))
    body_limit = limit - len(suffix)
    # Calls are looked up in the input, whose arguments are not cut yet.
    brief = tool_brief(call_for_result(messages, index), message, limit=body_limit)
    if len(brief) > body_limit:  # only with a tiny configured limit
        brief = one_line(brief, max(body_limit, 1))
    return own({**message, "content": _briefed(message.get("content"), brief + suffix)})


def _briefed(content: Any, brief: str) -> Any:
    """The content of a result briefed as ``brief``: its text and images give way
    to the brief (which counts the images); parts of types the engine does not
    know ride along after it, as they were, for no brief can stand for them (a
    tool reference that loads a tool)."""
    if not isinstance(content, list):
        return brief
    opaque = [p for p in content if isinstance(p, dict) and p.get("type") not in KNOWN_PARTS]
    if not opaque:
        return brief
    # The brief takes the shape of the first text part (its type differs per API).
    texts = (p for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    first = next(texts, {"type": "text"})
    return [{**first, "text": brief}, *opaque]


def tool_brief(call: dict[str, Any] | None, result: Message, *, limit: int | None = None) -> str:
    """One line saying what a tool call did, how big its result was and how it ended.

    ``[read_file] src/app.py (45,210 chars)``, ``[bash] "npm test" → 32 lines
    output (exit code 1, FAILED tests/a.py::t - AssertionError: x)``,
    ``[search] "token limit" (12,400 chars)``, ``[get_order] order_id="A1"
    (900 chars)`` for an argument with no telling name, and
    ``[editor] src/a.py command=view (4,000 chars)``: the key argument, then
    the gist of the other short ones. Where the result shows them, the exit
    status and the first error line (a traceback's exception line first) are
    added; the error line is kept whole up to
    :data:`~compaction.text.clipping.KEPT_LINE_CHARS`, cut between words within
    ``limit`` characters for the whole brief when given.
    """
    name = ""
    key, value = "", ""
    arguments: Any = None
    if call is not None:
        name, raw = call_name_and_arguments(call)
        key, value = key_argument(call)
        arguments = parse_arguments(raw)
    if not name:
        result_name = result.get("name")
        name = result_name if isinstance(result_name, str) and result_name else "tool"
    text = message_text(result)

    lines = text.splitlines()
    code = _exit_code(lines)
    extras = [f"exit code {code}"] if code is not None else []
    images = _image_count(result.get("content"))
    image_note = [f"{images} image" + ("s" if images != 1 else "")] if images else []

    parts = [f"[{one_line(name, _BRIEF_NAME_CHARS)}]"]
    if value:
        shown = one_line(value, _BRIEF_ARG_CHARS)
        if key in _PLAIN_KEYS:
            parts.append(shown)
        elif key in _QUOTED_KEYS:
            parts.append(f'"{shown}"')
        else:  # an argument with no telling name: say which one it is
            parts.append(f'{one_line(key, _BRIEF_NAME_CHARS)}="{shown}"')
    gist = _gist(arguments, key)
    if gist:
        parts.append(gist)

    def render(error: str) -> str:
        notes = [*extras, *([error] if error else []), *image_note]
        if key in _COMMAND_KEYS:
            count = _line_count(_command_output(text))
            size = f"→ {count:,} line{'s' if count != 1 else ''} output"
            size += f" ({', '.join(notes)})" if notes else ""
        else:
            size = f"({', '.join([f'{len(text):,} chars', *notes])})"
        return " ".join([*parts, size])

    first, last = _error_lines(text, lines, code, shows_files(call))
    if not first:
        return render("")
    room = KEPT_LINE_CHARS
    if limit is not None:
        room = min(room, limit - len(render("")) - 2)
    error = one_line(first, max(room, _BRIEF_MIN_ERROR_CHARS))
    if last:
        # The last error line too, where the threshold leaves room for it: a
        # test run's summary ("FAILED (failures=2)") after its first failure.
        left = room - len(error) - len(LAST_ERROR_SEPARATOR)
        if left >= _BRIEF_MIN_ERROR_CHARS // 2:
            error += LAST_ERROR_SEPARATOR + one_line(last, left)
    return render(error)


def _gist(arguments: Any, key: str) -> str:
    """The other short scalar arguments as ``name=value``, within :data:`_BRIEF_GIST_CHARS`."""
    if not isinstance(arguments, dict):
        return ""
    shown: list[str] = []
    used = 0
    for name, value in arguments.items():
        if name == key or isinstance(value, (dict, list)) or value is None:
            continue
        if isinstance(value, str) and (not value.strip() or len(value) > _GIST_VALUE_CHARS):
            continue
        item = f"{one_line(str(name), _BRIEF_NAME_CHARS)}={one_line(str(value), _GIST_VALUE_CHARS)}"
        if used + len(item) > _BRIEF_GIST_CHARS:
            break
        shown.append(item)
        used += len(item) + 1
    return " ".join(shown)


def _exit_code(lines: list[str]) -> str | None:
    """The exit status a result reports in its first or last lines."""
    for line in lines[:_STATUS_EDGE_LINES] + lines[-_STATUS_EDGE_LINES:]:
        match = _RETURNCODE_TAG.search(line) or _EXIT_PHRASE.search(line)
        if match:
            return match.group(1)
    return None


def _error_lines(
    text: str, lines: list[str], code: str | None, shows_files: bool
) -> tuple[str, str]:
    """The first error line of a result (a traceback's exception line if there is one,
    else the first error line) and its last error line when that is another one.

    What a call that shows files returns is content: its error-looking lines
    count only when the call failed (a non-zero exit, or text that starts
    with an error).
    """
    failed = (code is not None and code != "0") or bool(_FAILED_START.match(text))
    if shows_files and not failed:
        return "", ""
    found = error_lines(text)
    first = found[0] if found else ""
    if _TRACEBACK in text:
        last_traceback = max(i for i, line in enumerate(lines) if _TRACEBACK in line)
        exceptions = [
            line for line in lines[last_traceback + 1 :] if _EXCEPTION_LINE.match(line.strip())
        ]
        if exceptions:
            first = exceptions[-1].strip()
    if not first and _FAILED_START.match(text):
        first = text.strip().splitlines()[0]
    last = found[-1] if found and found[-1] != first else ""
    return first, last


def _command_output(text: str) -> str:
    # mini-swe-agent wraps output as <returncode>N</returncode><output>…</output>;
    # the wrapper is not output the command printed.
    return output_body(text, to_last=True)


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


# --- assistant messages ----------------------------------------------------


def _prune_assistant(message: Message, profile: Profile, salt: str = "") -> Message:
    """The agent's message with its long arguments and text shortened; with a
    ``salt``, text cut short ends with the ref of the whole message."""
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
        if salt:
            new_content = _marked(new_content, ref_of(salt, original_text(message)))
        changes["content"] = new_content

    return {**message, **changes} if changes else message


def _marked(content: Any, ref: str) -> Any:
    """Cut ``content`` (a text, or parts) with ``ref`` after its last text."""
    if isinstance(content, str):
        return mark(content, ref)
    parts = list(content)
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts[i] = {**part, "text": mark(part["text"], ref)}
            break
    return parts


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
