"""Stage 3: hard truncation — the guarantee (docs/compaction.md, "The stages").

Whatever comes in leaves at or below ``limit`` tokens, or
:class:`~compaction.errors.CannotFitError` names the part that cannot::

    ┌──────┬─────────┬──────────────────────────┬─────────────┬──────────────────┐
    │ head │ summary │ [N earlier messages were │ turn opener │ newest groups    │
    │      │         │  removed to fit …]       │             │                  │
    └──────┴─────────┴──────────────────────────┴─────────────┴──────────────────┘
     always  newest,   one note where the         the request   a contiguous
     whole   if it     dropped messages were      the suffix    suffix, whole
             fits                                 answers       groups only

Pinned messages (system or developer messages after the head:
instructions, not history) are never dropped or cut. One among the dropped
messages stands right after the note, in its original order, as the
condenser keeps one right after the summary; one inside a kept group stays
where it is.

Space is handed out in this order: the head and the pinned messages (never
cut: CannotFitError ``"head"`` when they alone are too large), the newest
group (what the model must answer), the newest summary, the user message
that opened the newest group's turn when it was dropped, then older groups
newest-first until the first one that does not fit. The opener goes before
older groups because the model needs the request it is working on more than
the oldest steps taken for it.

When even the newest group does not fit, it is cut in place (tool results,
texts and arguments, biggest first, each keeping its start and end) until it
does; CannotFitError ``"newest group"`` when even that is not enough.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from compaction.chat.groups import Group, group_messages
from compaction.chat.messages import (
    is_truncation_note,
    message_text,
    pinned_in,
    truncation_note,
    truncation_note_count,
)
from compaction.chat.own import is_summary
from compaction.errors import CannotFitError
from compaction.text.cuts import cut_middle, shrink_arguments
from compaction.tokens.counter import TokenCounter
from compaction.types import Message

#: Characters a cut field keeps at least; below this a text says nothing.
_MIN_FIELD_CHARS = 200
#: Room for the cut marker, so a field cut to ``n`` characters ends up at most ``n``.
_MARKER_CHARS = 48
#: Each cut of a field removes at least this much, so shrinking always progresses.
_MIN_STEP_CHARS = 64
#: Room below which the group that no longer fits is dropped, not excerpted.
EXCERPT_MIN_TOKENS = 200
_SUMMARY_COUNT = re.compile(r"Summary of (?:the first )?(\d+) ")


@dataclass(frozen=True)
class TruncateResult:
    """The truncated conversation and what was done to it."""

    messages: list[Message]
    dropped: int  #: messages removed
    shrunk: int  #: messages whose content was cut to fit
    notes: tuple[str, ...]
    #: How many trailing messages stand for as many trailing input messages:
    #: the very objects, or the newest group cut the same way on every call.
    suffix: int = 0


@dataclass(frozen=True)
class _Plan:
    summary: int | None  #: index of the newest summary kept before the note
    opener: int | None  #: index of the turn's user message kept after the note
    suffix_start: int  #: the newest groups from here on are kept
    #: The next older group, cut to the room left, when at least
    #: :data:`EXCERPT_MIN_TOKENS` were left: a large message is excerpted,
    #: not dropped unseen.
    excerpt: tuple[int, list[Message]] | None = None


def truncate(
    messages: Sequence[Message],
    *,
    head_end: int,
    limit: int,
    counter: TokenCounter,
    overhead: int,
) -> TruncateResult:
    """Bring ``messages`` (plus ``overhead``) to at most ``limit`` tokens.

    ``head_end`` should be a group boundary; one inside a group is moved to
    the group's end, so the head never splits a tool call from its results.
    Input that already fits comes back as the same objects.
    """
    counts = counter.count_messages(messages)
    if sum(counts) + overhead <= limit:
        return TruncateResult(list(messages), 0, 0, (), suffix=len(messages))

    groups = group_messages(messages)
    head_end = _group_boundary(groups, head_end)
    pinned = frozenset(pinned_in(messages, head_end, len(messages)))
    head_tokens = sum(counts[:head_end]) + overhead
    if head_tokens > limit:
        raise CannotFitError("head", head_tokens, limit)
    if pinned:
        # What is never dropped counts as the head's: the rest shares what is left.
        head_tokens += sum(counts[i] for i in pinned)
        if head_tokens > limit:
            raise CannotFitError(
                "head", head_tokens, limit, detail=" (with the system messages after it)"
            )
        counts = [0 if i in pinned else c for i, c in enumerate(counts)]
    body = [g for g in groups if g.start >= head_end]

    reserve = counter.count_message(truncation_note(len(messages)))
    while True:
        room = limit - head_tokens - reserve
        plan = _select(messages, counts, body, head_end, room, counter, pinned)
        if plan is None:
            return _shrink_newest(
                messages, counts, body, head_end, head_tokens, limit, counter, pinned
            )
        out, dropped, removed = _assemble(messages, head_end, plan, pinned)
        total = sum(counter.count_messages(out)) + overhead
        if total <= limit:
            notes = []
            if removed:  # an excerpt alone removed nothing: no "removed 0" note
                notes.append(f"removed {removed} earlier messages to fit {limit:,} tokens")
            if plan.excerpt is not None:
                notes.append(f"excerpted {len(plan.excerpt[1])} older messages to fit")
            suffix = len(messages) - plan.suffix_start
            return TruncateResult(out, dropped, 0, tuple(notes), suffix=suffix)
        # The note's token count was underestimated; leave it more room.
        reserve += total - limit


def _group_boundary(groups: Sequence[Group], index: int) -> int:
    end = groups[-1].end if groups else 0
    index = min(max(index, 0), end)
    for group in groups:
        if group.start < index < group.end:
            return group.end
    return index


def _select(
    messages: Sequence[Message],
    counts: Sequence[int],
    body: Sequence[Group],
    head_end: int,
    budget: int,
    counter: TokenCounter,
    pinned: frozenset[int],
) -> _Plan | None:
    """What to keep after the head within ``budget``; ``None`` if the newest group does not fit."""

    def tokens(group: Group) -> int:
        return sum(counts[group.start : group.end])

    newest = body[-1]
    used = tokens(newest)
    if used > budget:
        return None

    summary = next(
        (i for i in range(newest.start - 1, head_end - 1, -1) if is_summary(messages[i])), None
    )
    if summary is not None and used + counts[summary] <= budget:
        used += counts[summary]
    else:
        summary = None

    opener = _turn_opener(messages, head_end, newest.start)
    if opener is not None and used + counts[opener] <= budget:
        used += counts[opener]
    else:
        opener = None

    suffix_start = newest.start
    excerpt = None
    for group in reversed(body[:-1]):
        if group.start not in (summary, opener):
            if used + tokens(group) > budget:
                excerpt = _excerpt(messages, group, budget - used, counter, pinned)
                break
            used += tokens(group)
        suffix_start = group.start
    return _Plan(summary, opener, suffix_start, excerpt)


def _excerpt(
    messages: Sequence[Message],
    group: Group,
    room: int,
    counter: TokenCounter,
    pinned: frozenset[int],
) -> tuple[int, list[Message]] | None:
    """``group`` cut to ``room`` tokens, or ``None`` when too little is left or
    it is a note or summary (nothing to learn from a piece of those)."""
    first = messages[group.start]
    if room < EXCERPT_MIN_TOKENS or is_summary(first) or is_truncation_note(first):
        return None
    whole = list(messages[group.start : group.end])
    inside = frozenset(i - group.start for i in range(group.start, group.end) if i in pinned)
    cut = _shrink_group(whole, room, counter, inside)
    if sum(c for i, c in enumerate(counter.count_messages(cut)) if i not in inside) > room:
        return None
    # Fresh objects throughout: only the verbatim suffix shares the caller's,
    # and the system messages inside the group, which are forwarded as sent.
    return group.start, [
        dict(m) if m is o and i not in inside else m
        for i, (m, o) in enumerate(zip(cut, whole, strict=True))
    ]


def _turn_opener(messages: Sequence[Message], floor: int, start: int) -> int | None:
    """The user message that opened the turn ``messages[start]`` belongs to, when that is
    a request and not ``messages[start]`` itself."""
    if messages[start].get("role") == "user":
        return None
    for i in range(start - 1, floor - 1, -1):
        message = messages[i]
        if message.get("role") == "user":
            if is_summary(message) or is_truncation_note(message):
                return None
            return i
    return None


def _assemble(
    messages: Sequence[Message], head_end: int, plan: _Plan, pinned: frozenset[int]
) -> tuple[list[Message], int, int]:
    """The messages kept, how many were dropped, and how many of the client's
    messages those stood for (what the note says)."""
    out = list(messages[:head_end])
    if plan.summary is not None and plan.summary < plan.suffix_start:
        out.append(messages[plan.summary])
    # Kept before the suffix, in their order: the turn's opener, the excerpt.
    kept: dict[int, list[Message]] = {}
    if plan.opener is not None and plan.opener < plan.suffix_start:
        kept[plan.opener] = [messages[plan.opener]]
    if plan.excerpt is not None:
        kept[plan.excerpt[0]] = plan.excerpt[1]
    spared = {plan.summary, *kept}
    if plan.excerpt is not None:
        start, cut = plan.excerpt
        spared.update(range(start, start + len(cut)))
    before = range(head_end, plan.suffix_start)
    dropped = [messages[i] for i in before if i not in spared and i not in pinned]
    if dropped:
        out.append(truncation_note(removed_count(dropped)))
    out.extend(messages[i] for i in before if i in pinned and i not in spared)
    for index in sorted(kept):
        out.extend(kept[index])
    out.extend(messages[plan.suffix_start :])
    return out, len(dropped), removed_count(dropped)


def removed_count(dropped: Sequence[Message]) -> int:
    """How many of the client's messages ``dropped`` stand for: an earlier
    truncation note or summary stands for the messages it replaced."""
    total = 0
    for message in dropped:
        count = truncation_note_count(message)
        if count is None and is_summary(message):
            found = _SUMMARY_COUNT.search(message_text(message)[:200])
            count = int(found.group(1)) if found else None
        total += count or 1
    return total


# --- shrinking the newest group ----------------------------------------------


def _shrink_newest(
    messages: Sequence[Message],
    counts: Sequence[int],
    body: Sequence[Group],
    head_end: int,
    head_tokens: int,
    limit: int,
    counter: TokenCounter,
    pinned: frozenset[int],
) -> TruncateResult:
    """Keep the head, the newest summary if the newest group can be cut to
    leave room for it (a summary is worth more than the excess of one group),
    the pinned messages, and the newest group cut to what is left."""
    newest = body[-1]
    summary = next(
        (i for i in range(newest.start - 1, head_end - 1, -1) if is_summary(messages[i])), None
    )
    group = list(messages[newest.start : newest.end])
    # Pinned messages inside the group are counted with the head already.
    inside = [i - newest.start for i in range(newest.start, newest.end) if i in pinned]
    before = sum(counts[newest.start : newest.end])
    failure: CannotFitError | None = None
    for keep in ((summary,) if summary is not None else ()) + (None,):
        kept = [messages[keep]] if keep is not None else []
        older = range(head_end, newest.start)
        dropped = [messages[i] for i in older if i != keep and i not in pinned]
        note = [truncation_note(removed_count(dropped))] if dropped else []
        kept_pinned = [messages[i] for i in older if i in pinned]
        extra = sum(counter.count_messages([*kept, *note]))
        room = limit - head_tokens - extra
        cut = _shrink_group(group, room, counter, frozenset(inside))
        after = sum(c for i, c in enumerate(counter.count_messages(cut)) if i not in inside)
        if after > room:
            failure = CannotFitError("newest group", after, limit, room=room)
            continue
        shrunk = sum(1 for new, old in zip(cut, group, strict=True) if new is not old)
        notes = []
        if dropped:
            removed = removed_count(dropped)
            notes.append(f"removed {removed} earlier messages to fit {limit:,} tokens")
        if shrunk:
            notes.append(
                f"cut {shrunk} messages of the newest group to fit {limit:,} tokens "
                f"({before:,} → {after:,} tokens)"
            )
        out = [*messages[:head_end], *kept, *note, *kept_pinned, *cut]
        return TruncateResult(out, len(dropped), shrunk, tuple(notes), suffix=len(cut))
    assert failure is not None
    raise failure


@dataclass
class _Field:
    """One cuttable string inside a working copy of the group."""

    message: int
    original: str
    write: Callable[[str], None]
    is_arguments: bool
    tokens: int
    current: str = ""
    exhausted: bool = False

    def __post_init__(self) -> None:
        self.current = self.original


def _shrink_group(
    group: list[Message], room: int, counter: TokenCounter, pinned: frozenset[int] = frozenset()
) -> list[Message]:
    """``group`` with its biggest texts cut until it fits ``room`` tokens, or as far as
    cutting goes. Untouched messages stay the same objects. The messages at
    ``pinned`` are never cut and ``room`` is for the others."""
    work = [_editable(m) for m in group]
    fields = [f for i, m in enumerate(work) if i not in pinned for f in _fields(i, m, counter)]
    counts = [0 if i in pinned else c for i, c in enumerate(counter.count_messages(work))]
    touched: set[int] = set()
    while True:
        excess = sum(counts) - room
        if excess <= 0:
            break
        candidates = [f for f in fields if not f.exhausted]
        if not candidates:
            break
        # The biggest first; the earliest of equals, so the outcome is deterministic.
        field = max(candidates, key=lambda f: f.tokens)
        size = field.tokens
        # Chars to keep, in proportion to the tokens that must go, with room
        # for the marker and a step that guarantees progress.
        wanted = len(field.current) * max(size - excess, 0) // max(size, 1) - _MARKER_CHARS
        wanted = min(wanted, len(field.current) - _MIN_STEP_CHARS)
        if wanted <= _MIN_FIELD_CHARS:
            wanted = _MIN_FIELD_CHARS
            field.exhausted = True
        new = _cut_field(field, wanted)
        if len(new) >= len(field.current):
            field.exhausted = True
            continue
        field.current = new
        field.tokens = counter.count_text(new)
        field.write(new)
        touched.add(field.message)
        counts[field.message] = counter.count_message(work[field.message])
    return [work[i] if i in touched else m for i, m in enumerate(group)]


def _cut_field(field: _Field, chars: int) -> str:
    if field.is_arguments:
        shrunk = shrink_arguments(field.original, chars)
        if len(shrunk) <= chars + _MARKER_CHARS:
            return shrunk
        # Too many keys for valid JSON that short: the text itself is cut.
    return cut_middle(field.original, chars * 2 // 3, chars // 3)


def _editable(message: Message) -> Message:
    """A copy of ``message`` whose content parts and tool calls can be written to."""
    copy: Message = dict(message)
    content = copy.get("content")
    if isinstance(content, list):
        copy["content"] = [dict(p) if isinstance(p, dict) else p for p in content]
    calls = copy.get("tool_calls")
    if isinstance(calls, list):
        copy["tool_calls"] = [_editable_call(c) for c in calls]
    function_call = copy.get("function_call")
    if isinstance(function_call, dict):
        copy["function_call"] = dict(function_call)
    return copy


def _editable_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    copy = dict(call)
    if isinstance(copy.get("function"), dict):
        copy["function"] = dict(copy["function"])
    return copy


def _setter(target: dict[str, Any], key: str) -> Callable[[str], None]:
    def write(value: str) -> None:
        target[key] = value

    return write


def _fields(index: int, message: Message, counter: TokenCounter) -> list[_Field]:
    found: list[tuple[str, dict[str, Any], str, bool]] = []
    content = message.get("content")
    if isinstance(content, str):
        found.append((content, message, "content", False))
    elif isinstance(content, list):
        for part in content:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str):
                found.append((text, part, "text", False))
    calls = message.get("tool_calls")
    functions = [
        c["function"] if isinstance(c.get("function"), dict) else c
        for c in (calls if isinstance(calls, list) else ())
        if isinstance(c, dict)
    ]
    if isinstance(message.get("function_call"), dict):
        functions.append(message["function_call"])
    for function in functions:
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            found.append((arguments, function, "arguments", True))
    return [
        _Field(index, text, _setter(target, key), is_arguments, counter.count_text(text))
        for text, target, key, is_arguments in found
    ]
