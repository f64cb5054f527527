"""Shortening text and JSON: the one home of every "make this fit" helper.

Pure functions on strings. Texts keep their start and end around a marker
saying how much was cut (:func:`cut_middle`, :func:`clip`), since errors and
results sit at the end (:mod:`compaction.text.clipping` keeps a tool result's
error lines, status, command and paths as well); tool-call arguments are cut
inside their JSON, so valid JSON stays valid (:func:`shrink_arguments`);
one-line quotes are flattened, cut between words and end with an ellipsis
(:func:`one_line`). A cut string is never cut again by the same call: the
pruner relies on that to be idempotent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from json.encoder import encode_basestring
from typing import Any

# Wider than any marker text_marker / _value_marker can produce for a string
# that fits in memory, so a cut string is never long enough to be cut again.
TEXT_MARKER_ROOM = 48
_VALUE_MARKER_ROOM = 32
#: A JSON string value is never cut shorter than this: shorter keeps nothing useful.
_MIN_VALUE_CHARS = 40


def output_body(text: str, *, to_last: bool) -> str:
    """What a ``<output>…</output>`` wrapper in ``text`` holds (a newline right
    after the opener dropped), up to the last closer or the first; ``text``
    itself when it has no opener, and the rest of it when no closer follows.

    Found by position, not by a regex: a regex retries every unclosed
    ``<output>``, each time scanning to the end, which is quadratic in a result
    that repeats the tag. If the first opener has no closer after it, no later
    one has either.
    """
    start = text.find("<output>")
    if start < 0:
        return text
    start += len("<output>")
    if text.startswith("\n", start):
        start += 1
    end = text.rfind("</output>", start) if to_last else text.find("</output>", start)
    return text[start:end] if end >= 0 else text


_REMINDER_OPEN = "<system-reminder>"
_REMINDER_CLOSE = "</system-reminder>"


def without_reminders(text: str) -> str:
    """``text`` less the ``<system-reminder>`` blocks a client puts in a user
    message (Claude Code: the date, CLAUDE.md, the tools' notes) — context it
    added, not what the user asked. An unclosed block runs to the end. Linear:
    each block is found with one search for its opener and one for its closer."""
    if _REMINDER_OPEN not in text:
        return text
    kept, at = [], 0
    while (start := text.find(_REMINDER_OPEN, at)) != -1:
        kept.append(text[at:start])
        end = text.find(_REMINDER_CLOSE, start + len(_REMINDER_OPEN))
        at = len(text) if end == -1 else end + len(_REMINDER_CLOSE)
    kept.append(text[at:])
    return "".join(kept)


def one_line(text: str, limit: int) -> str:
    """``text`` on one line, whitespace runs made single spaces, cut to ``limit`` with "…".

    The cut falls between words (see :func:`word_cut`).
    """
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else word_cut(flat, limit - 1) + "…"


def word_cut(text: str, limit: int) -> str:
    """The start of ``text`` in at most ``limit`` characters, ending between two words.

    A word longer than half of ``limit`` (a path, a hash, a minified line) is
    cut where the limit falls: backing up to the blank before it would lose
    more than it saves.
    """
    if len(text) <= limit:
        return text
    start = text[: max(limit, 0)]
    if not text[limit].isspace():
        blank = max(start.rfind(" "), start.rfind("\n"), start.rfind("\t"))
        if blank >= limit // 2:
            start = start[:blank]
    return start.rstrip()


# --- texts -------------------------------------------------------------------


def text_marker(cut: int) -> str:
    return f"\n[… {cut:,} characters cut …]\n"


def _cut(text: str, keep_start: int, keep_end: int) -> str:
    cut = len(text) - keep_start - keep_end
    return text[:keep_start] + text_marker(cut) + text[len(text) - keep_end :]


def cut_middle(text: str, keep_start: int, keep_end: int) -> str:
    """``text`` with its middle replaced by a marker saying how much was cut.

    Returns ``text`` itself (the same object) when cutting would not make it
    shorter, so a cut text is never cut again with the same figures.
    """
    keep_start, keep_end = max(keep_start, 0), max(keep_end, 0)
    if len(text) <= keep_start + keep_end + TEXT_MARKER_ROOM:
        return text
    return _cut(text, keep_start, keep_end)


def clip(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its start and its end.

    The end is kept too because that is where errors and results usually are
    (the last line of a traceback, a test summary).
    """
    if len(text) <= limit:
        return text
    keep_end = limit // 3
    return _cut(text, limit - keep_end, keep_end)


# --- JSON arguments ------------------------------------------------------------


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
    except (ValueError, RecursionError):
        # Not JSON, values JSON cannot write back (1e400 → inf), or nested
        # deeper than the recursion allows: cut as plain text.
        pass
    else:
        return candidate if len(candidate) < len(arguments) else arguments
    keep = limit - _VALUE_MARKER_ROOM
    return arguments[:keep] + _value_marker(len(arguments) - keep)


def _shrink_json(parsed: Any, limit: int) -> Any:
    fits = _sizer(parsed, limit)
    low, high = _MIN_VALUE_CHARS, max(_longest_string(parsed), _MIN_VALUE_CHARS)
    if fits(low):
        # Largest cap that fits: cutting as little as possible. (The size is
        # not quite monotonic in the cap, as markers lose digits: the search
        # is kept as it is, so that the same arguments always cut the same.)
        while low < high:
            middle = (low + high + 1) // 2
            if fits(middle):
                low = middle
            else:
                high = middle - 1
    return _cap_strings(parsed, low)


def _sizer(parsed: Any, limit: int) -> Callable[[int], bool]:
    """Whether ``_dumps(_cap_strings(parsed, cap)) <= limit``, as a function of ``cap``.

    The binary search asks about ten times per argument; rather than write the
    JSON each time, the size is the whole document's less what capping cuts
    from each long string. That holds when the document is written with its
    characters unescaped; with lone surrogates (escaped, and only while not
    cut away) each size is measured.
    """
    whole = json.dumps(parsed, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if not whole.isascii() and not _encodable(whole):

        def measured(cap: int) -> bool:
            return len(_dumps(_cap_strings(parsed, cap))) <= limit

        return measured

    strings = [(s, len(s), len(encode_basestring(s))) for s in _value_strings(parsed)]
    size = len(whole)

    def computed(cap: int) -> bool:
        cut = 0
        for text, length, written in strings:
            if length > cap + _VALUE_MARKER_ROOM:
                kept = len(encode_basestring(text[:cap])) + len(_value_marker(length - cap))
                cut += written - kept
        return size - cut <= limit

    return computed


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _value_strings(value: Any) -> Iterator[str]:
    """Every string :func:`_cap_strings` may cut: values, not keys."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _value_strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _value_strings(item)
