"""Recall: what the model needs to read back the content a compaction shortened.

When ``Profile.recall`` is on and the caller gives a salt (whose conversation
it is), every tool result the pruner turns into a brief ends with
``[ref: <id>]``, and so does every ledger entry naming a removed tool output
(:mod:`compaction.stages.pruner`, :mod:`compaction.summary.ledger`). The proxy adds a tool,
:data:`RECALL_TOOL_NAME`, to the request; when the model calls it, the proxy answers
from the request itself — the client resends its whole history every turn —
and asks again. This module holds the pieces that are the same for every API::

    ref      = "r" + 12 base32 chars of blake2b(original text, key = salt)
    brief    = "[bash] \"pytest -q\" → 812 lines output (exit code 1, …) [ref: rq4…]"
    recall   = compaction_recall({"ref": "rq4…", "start_line": 120})
    answer   = lines 120… of the original, whole, within max_chars, and a note

A ref is stable (the same text of the same caller has the same ref on every
request, whatever checkpoint it came from) and differs between callers, so a
ref is only ever resolved against the caller's own request: a ref of another
caller, or of content no longer sent, is "not found", and the answer does not
say which. Lookup (:func:`find_original`) hashes the request's tool results
and assistant messages once each, on a recall only; nothing here runs on the request path otherwise.
Pure functions.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from compaction.chat.messages import RESULT_ROLES, call_name_and_arguments, message_text, tool_calls
from compaction.chat.own import is_own
from compaction.types import Message

RECALL_TOOL_NAME: Final = "compaction_recall"

RECALL_TOOL_DESCRIPTION: Final = (
    "Read back the original of content shortened to fit the context window: an old tool "
    "output replaced by a one-line brief, your own long command or message cut short, or "
    "a summary entry, each marked like [ref: r2b4c6d7e2f3g]. Pass that ref, and "
    "start_line/end_line (1-based, inclusive) for part of a long output, to get the text "
    "exactly as it was. Call it "
    "alone, before acting on shortened content (e.g. before editing a file whose read was "
    "shortened). A ref not found is gone: run the original tool again."
)

RECALL_TOOL_PARAMETERS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "ref": {
            "type": "string",
            "description": "The id in a [ref: …] marker.",
        },
        "start_line": {
            "type": "integer",
            "minimum": 1,
            "description": "First line to return (default 1).",
        },
        "end_line": {
            "type": "integer",
            "minimum": 1,
            "description": "Last line to return (default: the last).",
        },
    },
    "required": ["ref"],
    "additionalProperties": False,
}

#: Characters of arguments a call may send: a ref and two line numbers take
#: well under a hundred, so anything longer is refused before it is parsed.
MAX_ARGUMENT_CHARS: Final = 4_096

_REF_CHARS = 12
_ID = rf"r[a-z2-7]{{{_REF_CHARS}}}"
#: ``[ref: r…]`` anywhere in a text; group 1 is the id.
REF_PATTERN: Final = re.compile(rf"\[ref: ({_ID})\]")
_TRAILING_REF = re.compile(rf" \[ref: ({_ID})\]\Z")
_BARE_ID = re.compile(_ID)
#: blake2b takes a key of at most this many bytes; a longer salt is hashed to one.
_MAX_KEY_BYTES = 64
_ACCEPTED = frozenset(RECALL_TOOL_PARAMETERS["properties"])
#: The messages a ref may name: tool results, and the agent's own turns.
_RECALLABLE = frozenset((*RESULT_ROLES, "assistant"))


def ref_of(salt: str, text: str) -> str:
    """The ref of ``text`` for the caller ``salt``: ``r`` and 12 lowercase base32 characters."""
    key = salt.encode()
    if len(key) > _MAX_KEY_BYTES:
        key = hashlib.blake2b(key).digest()
    digest = hashlib.blake2b(text.encode(errors="surrogatepass"), key=key, digest_size=8).digest()
    return "r" + base64.b32encode(digest).decode().lower()[:_REF_CHARS]


def mark(text: str, ref: str) -> str:
    """``text`` followed by its ref marker: ``text [ref: r…]``."""
    return f"{text}{ref_suffix(ref)}"


def ref_suffix(ref: str) -> str:
    """What :func:`mark` appends: ``" [ref: r…]"``."""
    return f" [ref: {ref}]"


def trailing_ref(text: str) -> str | None:
    """The ref ``text`` already ends with (a brief or an entry marked before), if any."""
    found = _TRAILING_REF.search(text)
    return found.group(1) if found else None


@dataclass(frozen=True)
class RecallRequest:
    """One call of the recall tool, its arguments checked."""

    ref: str
    start_line: int | None = None
    end_line: int | None = None


def brief_ref(message: Message) -> str | None:
    """The ref of the original that ``message``, a brief the proxy wrote, stands
    for: the ref it ends with. ``None`` for any other message: a tool output
    that ends with ``[ref: …]`` (a file, a web page, a command echoing an
    earlier brief) names nothing, and its own ref is that of its whole text —
    a ref the proxy computed, never one read from content."""
    return trailing_ref(message_text(message)) if is_own(message) else None


def output_ref(salt: str, output: Message, shortest: int) -> str | None:
    """The ref a summary's entry gives the tool output it names, or ``None``.

    A brief the proxy wrote names its original by the ref it ends with
    (:func:`brief_ref`). Any other output gets its own ref when it is longer
    than ``shortest`` characters (the pruner's ``tool_result_chars``: an
    output it would have briefed): a shorter one is covered by the entry
    itself — the command, its exit code, its error lines — and a ref costs a
    dozen tokens in every request that carries the summary.
    """
    if not salt:
        return None
    text = message_text(output)
    return brief_ref(output) or (ref_of(salt, text) if len(text) > shortest else None)


def parse_request(arguments: str) -> RecallRequest | str:
    """The call's arguments (JSON text as the model wrote them), or what to tell the
    model when they cannot be used."""
    usage = (
        f'{RECALL_TOOL_NAME} takes {{"ref": "r…", "start_line": 1, "end_line": 50}}'
        " (lines optional)."
    )
    if len(arguments) > MAX_ARGUMENT_CHARS:
        return f"The arguments are too long ({len(arguments):,} characters). {usage}"
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError):  # nesting past the recursion is no call either
        return f"The arguments are not valid JSON. {usage}"
    if not isinstance(parsed, dict):
        return f"The arguments must be a JSON object. {usage}"
    unknown = sorted(str(name) for name in parsed if name not in _ACCEPTED)
    if unknown:
        return f"Unknown argument {', '.join(unknown)}. {usage}"
    ref = _ref_given(parsed.get("ref"))
    if ref is None:
        return f"ref must be the id of a [ref: …] marker, like r2b4c6d7e2f3g. {usage}"
    lines: dict[str, int | None] = {}
    for name in ("start_line", "end_line"):
        value = parsed.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return f"{name} must be a whole number of at least 1. {usage}"
        if value is not None and value < 1:
            return f"{name} must be at least 1 (lines are counted from 1). {usage}"
        lines[name] = value
    start, end = lines["start_line"], lines["end_line"]
    if start is not None and end is not None and end < start:
        return f"end_line ({end}) is before start_line ({start}). {usage}"
    return RecallRequest(ref, start, end)


def _ref_given(value: Any) -> str | None:
    """The id in what the model passed as ``ref``: the bare id, or the marker copied whole."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    found = REF_PATTERN.fullmatch(value)
    if found:
        return found.group(1)
    return value if _BARE_ID.fullmatch(value) else None


def original_text(message: Message) -> str:
    """What a ref of ``message`` names and a recall returns: a tool result's text;
    an assistant message's text with its tool calls' arguments after it, one a
    line (the agent's own long command or message, shortened or summarized)."""
    text = message_text(message)
    if message.get("role") != "assistant":
        return text
    arguments = [call_name_and_arguments(call)[1] for call in tool_calls(message)]
    return "\n".join(part for part in (text, *arguments) if part)


def find_original(messages: Sequence[Message], salt: str, ref: str) -> str | None:
    """The original (:func:`original_text`) of the tool result or assistant
    message among ``messages`` whose ref is ``ref``, or ``None``.

    ``messages`` are the request as the client sent it (its originals); each
    is hashed once, so the work is linear in their size.
    """
    if not _BARE_ID.fullmatch(ref):
        return None
    for message in messages:
        if message.get("role") in _RECALLABLE:
            text = original_text(message)
            if ref_of(salt, text) == ref:
                return text
    return None


def recalled_text(original: str | None, request: RecallRequest, max_chars: int) -> str:
    """What the tool answers: the requested lines of ``original``, exactly, and a note.

    Lines are 1-based and inclusive, counted at each ``\\n``. The lines
    returned stay within ``max_chars`` (the note is on top), whole lines but
    when the first one alone is longer; the note says which lines of how many
    came back and how to ask for the rest. ``None`` (the ref was not found in
    this request) is answered the same way whatever the reason.
    """
    if original is None:
        return (
            f"No content found for ref {request.ref} in this conversation. "
            "Run the tool that produced it again if you still need it."
        )
    lines = _lines(original)
    total = len(lines)
    if not total:
        return f"[ref {request.ref}: the output was empty]"
    start = request.start_line or 1
    if start > total:
        lines_of = f"{total:,} line{_s(total)}"
        return f"[ref {request.ref} has {lines_of}; start_line={start} is past the end]"
    end = min(request.end_line or total, total)
    taken: list[str] = []
    used = 0
    for line in lines[start - 1 : end]:
        if used + len(line) > max(max_chars, 1):
            break
        taken.append(line)
        used += len(line)
    if not taken:
        # One line longer than the whole slice: its start, said so.
        line = lines[start - 1].removesuffix("\n")
        head = line[: max(max_chars, 1)]
        more = f"; call again with start_line={start + 1} for the next" if start < end else ""
        note = (
            f"[line {start:,} of {total:,}: its first {len(head):,} of "
            f"{len(line):,} characters{more}]"
        )
        return _with_note(head, note)
    last = start + len(taken) - 1
    note = f"[lines {start:,}–{last:,} of {total:,}"
    if last < end:
        note += f"; call again with start_line={last + 1} for more"
    return _with_note("".join(taken), note + "]")


def _lines(text: str) -> list[str]:
    """``text`` cut after each ``\\n``, the endings kept, as ``sed -n`` counts lines."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _with_note(text: str, note: str) -> str:
    return f"{text}{'' if text.endswith(chr(10)) else chr(10)}{note}"


def _s(count: int) -> str:
    return "" if count == 1 else "s"


__all__ = [
    "MAX_ARGUMENT_CHARS",
    "RECALL_TOOL_DESCRIPTION",
    "RECALL_TOOL_NAME",
    "RECALL_TOOL_PARAMETERS",
    "REF_PATTERN",
    "RecallRequest",
    "brief_ref",
    "find_original",
    "mark",
    "original_text",
    "output_ref",
    "parse_request",
    "recalled_text",
    "ref_of",
    "ref_suffix",
    "trailing_ref",
]
