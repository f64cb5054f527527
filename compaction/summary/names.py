"""The names a span mentions, for the ledger's ``<identifiers>`` block.

Two readings, both linear and bounded by the characters read: the task's and
the user's words give issue and ticket ids, URLs and branch names
(:func:`identifiers_in`); the agent's own turns give the names it worked
with — files (with a line, ``path:123``), dotted, ``snake_case`` and
``CamelCase`` names as written (:func:`names_used`). A turn kept after a
summary with its middle cut by the pruner has its names read too
(:func:`names_cut_by_pruning`): the summary's ledger is the one place left
that names them. :mod:`compaction.summary.ledger` gathers them into a ledger.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from compaction.budget.profile import Profile
from compaction.chat.calls import key_argument
from compaction.chat.messages import message_text, tool_calls
from compaction.summary.rendering import MAX_ENTRIES
from compaction.types import Message

#: Names read from one of the agent's turns, at most: no more than a block
#: holds (the work per turn is bounded by the characters read). Not fewer: a
#: long turn names what it concluded near its end, and the budget, which
#: keeps the newest names first, decides which fit — a count per turn cut
#: off the end of the long turns, whose names were the ones used next.
NAMES_PER_TURN = MAX_ENTRIES

_ISSUE = re.compile(r"(?<![\w#/&])#\d{1,7}\b")
_TICKET = re.compile(r"\b[A-Z][A-Z0-9]{1,9}-\d{1,7}\b")
_URL = re.compile(r"\bhttps?://[^\s<>()\"'`]{1,300}")
_BRANCH = re.compile(
    r"\bgit\s+(?:checkout\s+-[bB]|switch\s+(?:-[cC]\s+)?)\s*([\w./-]{1,100})"
    r"|\bbranch\s+'([\w./-]{1,100})'"
)
_URL_TRAIL = ".,;:!?"


def identifiers_in(text: str) -> list[str]:
    """Issue and ticket ids, URLs and branch names in ``text``, in order."""
    text = text[:20_000]  # a task names its identifiers early; bounded work
    found: list[tuple[int, str]] = []
    for match in _URL.finditer(text):
        found.append((match.start(), match.group(0).rstrip(_URL_TRAIL)))
    for pattern in (_ISSUE, _TICKET):
        found.extend((m.start(), m.group(0)) for m in pattern.finditer(text))
    for match in _BRANCH.finditer(text):
        name = (match.group(1) or match.group(2)).rstrip(_URL_TRAIL)
        if name:
            found.append((match.start(), f"branch {name}"))
    inside_urls = [(m.start(), m.end()) for m in _URL.finditer(text)]
    kept = [
        value
        for at, value in sorted(found)
        if value.startswith("http") or not any(s < at < e for s, e in inside_urls)
    ]
    return list(dict.fromkeys(kept))


#: A file is not followed by ``.`` and a letter: ``os.path.basename`` and
#: ``django.utils.translation`` are dotted names, not the files ``os.path`` and
#: ``django.utils`` (whose "extensions" are short words).
_NAME = re.compile(
    r"(?<![\w/.-])(?:[\w.-]*/)*[\w-]+\.[A-Za-z][A-Za-z0-9]{0,4}(?::\d{1,6})?(?![\w/]|\.\w)"
    r"|(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"  # a dotted name
    r"|(?<![\w.])[A-Za-z_]\w{3,}"  # a word, kept if snake_case or CamelCase
)
_CAMEL = re.compile(r"[a-z][A-Z]|[A-Z][a-z]+[A-Z]")
_NAME_CHARS = 120


def names_used(message: Message) -> list[str]:
    """The names one of the agent's turns used, in order: files (with a line
    when one is given), dotted names, ``snake_case`` and ``CamelCase`` words —
    what it was working with, and so what its next turns are likely to use."""
    if message.get("role") != "assistant":
        return []
    parts = [message_text(message)[:20_000]]
    parts += [str(key_argument(call)[1] or "")[:20_000] for call in tool_calls(message)]
    found: list[str] = []
    for text in parts:
        for match in _NAME.finditer(text):
            # Sentence punctuation off the ends, never an underscore: ``_private``
            # and ``__init__.py`` are names as written (stripped, they name nothing).
            name = match.group(0).strip(".-")
            if 4 <= len(name) <= _NAME_CHARS and (
                "_" in name or "." in name or "/" in name or _CAMEL.search(name)
            ):
                found.append(name)
    return list(dict.fromkeys(found))[:NAMES_PER_TURN]


def names_cut_by_pruning(messages: Sequence[Message], profile: Profile) -> list[str]:
    """The names used by the agent's turns among ``messages`` whose text the
    pruner cuts (a text longer than ``profile.assistant_text_chars`` keeps only
    its start and end). Kept after a summary only as the pruner left them,
    such turns have lost their middle, and the summary's ledger is the one
    place left to name what they worked with."""
    found: list[str] = []
    for message in messages:
        if _cut_by_pruning(message, profile.assistant_text_chars):
            found.extend(names_used(message))
    return found


def _cut_by_pruning(message: Message, limit: int) -> bool:
    """Whether the pruner cuts ``message``'s text: an assistant message's
    content, or one of its text parts, is longer than ``limit``."""
    if message.get("role") != "assistant":
        return False
    content = message.get("content")
    if isinstance(content, str):
        return len(content) > limit
    if isinstance(content, list):
        return any(
            isinstance(part, dict)
            and isinstance(part.get("text"), str)
            and len(part["text"]) > limit
            for part in content
        )
    return False


__all__ = ["NAMES_PER_TURN", "identifiers_in", "names_cut_by_pruning", "names_used"]
