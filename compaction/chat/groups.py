"""Message groups, and tool-pairing validation and repair (where the head ends
and the tail begins over these groups: :mod:`compaction.conversation.regions`).

Pure functions over ``list[Message]``; nothing here mutates its input.

A **group** is the unit every stage keeps or removes whole: an assistant
message with ``tool_calls`` (or a legacy ``function_call``) together with all
the results answering it; any other message is a group of its own. A **turn**
is a user message and the groups after it up to the next user message.

Results usually follow their call directly, but clients put other messages
between them: Codex sent the image a ``view_image`` call returned as a user
message after that call's output, before the outputs of the calls made beside
it. A group therefore runs to the last result answering one of its calls, and
the messages between are part of it — cutting anywhere inside would send a
result without its call, which every API refuses. An assistant message met
on the way adds its calls to the group; one that issues an id of the group
again starts a new round (some clients reuse ids) and ends the search.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from compaction.chat.messages import (
    MISSING_RESULT,
    RESULT_ROLES,
    call_name_and_arguments,
    is_opaque,
    is_pinned,
    is_truncation_note,
)
from compaction.types import Message


@dataclass(frozen=True, slots=True)  # slots: made for every message of every request
class Group:
    """Messages ``[start, end)`` that are kept or removed together."""

    start: int
    end: int
    kind: Literal["message", "tool_call", "orphan_result"]

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class PairingProblem:
    """One place where a tool call and its result do not line up."""

    index: int
    kind: Literal["orphan_result", "missing_result", "duplicate_result"]
    tool_call_id: str | None

    def __str__(self) -> str:
        what = {
            "orphan_result": "tool result answering no preceding call",
            "missing_result": "tool call without a result",
            "duplicate_result": "second result for the same tool call",
        }[self.kind]
        ident = f" {self.tool_call_id!r}" if self.tool_call_id else ""
        return f"messages[{self.index}]: {what}{ident}"


@dataclass(frozen=True)
class Repair:
    """The outcome of :func:`repair_tool_pairing`."""

    messages: list[Message]
    notes: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.notes)


def riding_in(
    messages: Sequence[Message], groups: Sequence[Group], start: int, end: int
) -> list[int]:
    """The indices among ``messages[start:end]`` that a condensed span keeps verbatim
    after its summary: the pinned messages, hard truncation's notes, and every
    message of a group that holds an opaque one (a group goes whole, so no result
    leaves its call).

    A truncation note stands for messages dropped whole, opaque ones among them
    perhaps; a summary of the note would claim to stand for those. So the note
    rides along: a checkpoint that truncated, applied to the next request and
    condensed there, still says what was dropped rather than summarized."""
    start, end = max(start, 0), min(end, len(messages))
    out: list[int] = []
    first = max(bisect.bisect_right([g.start for g in groups], start) - 1, 0)
    for group in groups[first:]:
        if group.start >= end:
            break
        if group.end <= start:
            continue
        span = range(max(group.start, start), min(group.end, end))
        if any(is_opaque(messages[i]) for i in range(group.start, group.end)):
            out.extend(span)
        else:
            out.extend(i for i in span if is_pinned(messages[i]) or is_truncation_note(messages[i]))
    return out


# --- groups ----------------------------------------------------------------


def _opened_call_ids(message: Message) -> list[str] | None:
    """The ids of the tool calls this message opens a group with (none for a
    legacy ``function_call`` or calls without ids); ``None`` when it opens no group.

    One look at the message: grouping runs over every message of every request.
    """
    if message.get("role") != "assistant":
        return None
    calls = message.get("tool_calls")
    opens = False
    ids: list[str] = []
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, dict):
                opens = True
                call_id = call.get("id")
                if isinstance(call_id, str):
                    ids.append(call_id)
    if opens or isinstance(message.get("function_call"), dict):
        return ids
    return None


def group_messages(messages: Sequence[Message]) -> tuple[Group, ...]:
    """Split ``messages`` into groups, in order, covering every index once.

    Results belonging to a call are the ``tool`` messages after it whose
    ``tool_call_id`` it issued, up to the last one answering it, with whatever
    lies between them (see the module doc; a legacy ``function_call`` takes
    the one ``function`` message after it). A result that answers nothing
    before it forms an ``orphan_result`` group; :func:`repair_tool_pairing`
    removes those.
    """
    return _scan(messages, None)


def group_starts(groups: Sequence[Group]) -> frozenset[int]:
    """The indices at which a group begins (plus the end of the list): the legal cut points."""
    starts = {g.start for g in groups}
    if groups:
        starts.add(groups[-1].end)
    else:
        starts.add(0)
    return frozenset(starts)


# --- pairing ---------------------------------------------------------------


@dataclass(frozen=True)
class Grouping:
    """:func:`group_messages` and :func:`validate_tool_pairing` of the same messages."""

    groups: tuple[Group, ...]
    problems: tuple[PairingProblem, ...]


def group_and_validate(messages: Sequence[Message]) -> Grouping:
    """Groups and pairing problems in one pass over ``messages`` (the proxy needs
    both for every request)."""
    problems: list[PairingProblem] = []
    groups = _scan(messages, problems)
    return Grouping(groups, tuple(problems))


def validate_tool_pairing(
    messages: Sequence[Message], groups: Sequence[Group] | None = None
) -> list[PairingProblem]:
    """Every way tool calls and results fail to pair up; an empty list means valid.

    ``groups`` are :func:`group_messages` of ``messages`` when the caller has them.
    """
    problems: list[PairingProblem] = []
    if groups is None:
        _scan(messages, problems)
        return problems
    for group in groups:
        if group.kind == "orphan_result":
            _orphan(messages, group.start, problems)
        elif group.kind == "tool_call":
            ids = _opened_call_ids(messages[group.start]) or []
            _check_results(messages, group.start, group.end, ids, problems)
    return problems


def _scan(messages: Sequence[Message], problems: list[PairingProblem] | None) -> tuple[Group, ...]:
    """The groups of ``messages``; their pairing problems added to ``problems`` if given."""
    groups: list[Group] = []
    i, n = 0, len(messages)
    later: _LaterResults | None = None  # built the first time a group reaches past its results
    while i < n:
        message = messages[i]
        role = message.get("role")
        ids = _opened_call_ids(message) if role == "assistant" else None
        if ids is not None:
            end = i + 1
            if ids:
                issued = set(ids)
                pending = set(ids)
                while end < n and messages[end].get("role") == "tool":
                    call_id = messages[end].get("tool_call_id")
                    if call_id not in issued:
                        break
                    pending.discard(call_id)
                    end += 1
                if pending:
                    later = later or _LaterResults(messages)
                    end = _reach(messages, end, issued, pending, later)
            elif end < n and messages[end].get("role") == "function":
                end += 1
            if problems is not None:
                _check_results(messages, i, end, ids, problems)
            groups.append(Group(i, end, "tool_call"))
            i = end
        elif role in RESULT_ROLES:
            if problems is not None:
                _orphan(messages, i, problems)
            groups.append(Group(i, i + 1, "orphan_result"))
            i += 1
        else:
            groups.append(Group(i, i + 1, "message"))
            i += 1
    return tuple(groups)


class _LaterResults:
    """Where the ``tool`` results answering each call id sit, for groups whose
    results do not all follow their call directly."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self._at: dict[Any, list[int]] = {}
        for index, message in enumerate(messages):
            if message.get("role") == "tool":
                self._at.setdefault(message.get("tool_call_id"), []).append(index)

    def first(self, call_ids: Iterable[str], start: int) -> int:
        """The furthest of the first results at or after ``start`` answering each
        of ``call_ids``; ``-1`` when none is answered there."""
        furthest = -1
        for call_id in call_ids:
            at = self._at.get(call_id, ())
            found = bisect.bisect_left(at, start)
            if found < len(at):
                furthest = max(furthest, at[found])
        return furthest


def _reach(
    messages: Sequence[Message],
    start: int,
    issued: set[str],
    pending: set[str],
    later: _LaterResults,
) -> int:
    """One past the last result answering the group's ``pending`` calls, looking
    from ``start`` over the messages in between (see the module doc); ``start``
    when none answers them there. ``issued`` and ``pending`` grow with the calls
    of assistant messages met on the way."""
    end = start
    target = later.first(pending, start)
    j = start
    while j <= target:
        message = messages[j]
        role = message.get("role")
        if role == "assistant":
            opened = _opened_call_ids(message)
            if opened is not None:
                if not opened or not issued.isdisjoint(opened):
                    break  # a legacy call, or a new round reusing the ids
                issued.update(opened)
                pending.update(opened)
                target = max(target, later.first(opened, j))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if call_id in pending:
                pending.discard(call_id)
                end = j + 1
                if not pending:
                    break
        j += 1
    return end


def group_of(groups: Sequence[Group], index: int) -> Group:
    """The group holding ``messages[index]``."""
    found = bisect.bisect_right([g.start for g in groups], index) - 1
    if found < 0 or not groups[found].start <= index < groups[found].end:
        raise IndexError(index)
    return groups[found]


def _orphan(messages: Sequence[Message], index: int, problems: list[PairingProblem]) -> None:
    problems.append(PairingProblem(index, "orphan_result", messages[index].get("tool_call_id")))


def _check_results(
    messages: Sequence[Message],
    start: int,
    end: int,
    ids: list[str],
    problems: list[PairingProblem],
) -> None:
    """The problems of the tool group ``[start, end)`` whose opener issued ``ids``."""
    if not ids:  # legacy function_call
        if end - start == 1:
            problems.append(PairingProblem(start, "missing_result", None))
        return
    if end - start - 1 == len(ids):
        answered = [messages[j].get("tool_call_id") for j in range(start + 1, end)]
        if answered == ids and len(set(ids)) == len(ids):
            return  # the usual case, checked on every request: one result per call, in order
    # Results reaching past other messages, or not one per call: in order, each
    # answers a call made before it in the group.
    calls = [(call_id, start) for call_id in ids]  # (id, index of the message issuing it)
    issued = set(ids)
    seen: set[Any] = set()
    for j in range(start + 1, end):
        message = messages[j]
        role = message.get("role")
        if role == "assistant":
            more = _opened_call_ids(message) or []
            calls.extend((call_id, j) for call_id in more)
            issued.update(more)
        elif role in RESULT_ROLES:
            call_id = message.get("tool_call_id")
            if role != "tool" or call_id not in issued:
                _orphan(messages, j, problems)
            elif call_id in seen:
                problems.append(PairingProblem(j, "duplicate_result", call_id))
            else:
                seen.add(call_id)
    problems.extend(
        PairingProblem(at, "missing_result", call_id)
        for call_id, at in calls
        if call_id not in seen
    )


def repair_tool_pairing(messages: Sequence[Message]) -> Repair:
    """Repair broken pairing in the smallest way, and say what was done.

    An orphan or duplicate result is dropped; a call without a result gets a
    ``[no result recorded]`` result placed after the results it has. Input
    that is already valid comes back as the same objects with no notes.
    """
    groups = group_messages(messages)
    problems = validate_tool_pairing(messages, groups)
    if not problems:
        return Repair(list(messages), ())
    drop = {p.index for p in problems if p.kind != "missing_result"}
    missing: dict[int, list[str | None]] = {}
    for p in problems:
        if p.kind == "missing_result":
            missing.setdefault(p.index, []).append(p.tool_call_id)
    inserts: dict[int, list[Message]] = {}
    for start, call_ids in missing.items():
        opener = messages[start]
        placeholders: list[Message] = []
        for call_id in call_ids:
            if call_id is None:
                name, _ = call_name_and_arguments(opener.get("function_call") or {})
                placeholders.append({"role": "function", "name": name, "content": MISSING_RESULT})
            else:
                placeholders.append(
                    {"role": "tool", "tool_call_id": call_id, "content": MISSING_RESULT}
                )
        # After the results the group has: an opener inside a group that
        # reaches past other messages is not where its group ends.
        inserts.setdefault(group_of(groups, start).end, []).extend(placeholders)

    repaired: list[Message] = []
    for i, message in enumerate(messages):
        repaired.extend(inserts.get(i, ()))
        if i not in drop:
            repaired.append(message)
    repaired.extend(inserts.get(len(messages), ()))
    notes = tuple(f"repaired input: {p}" for p in problems)
    return Repair(repaired, notes)
