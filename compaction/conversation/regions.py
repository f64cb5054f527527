"""Where a conversation's parts lie: the head kept verbatim, the turn a
message belongs to, and the tail of newest groups that fits a budget.
Indices over the messages and their groups (:func:`compaction.chat.groups.group_messages`)."""

from __future__ import annotations

from collections.abc import Sequence

from compaction.chat.groups import Group
from compaction.chat.messages import HEAD_ROLES
from compaction.chat.typed import context_end
from compaction.types import Message


def head_end(
    messages: Sequence[Message],
    groups: Sequence[Group],
    head_count: int,
    context: int | None = None,
) -> int:
    """Index one past the head: leading system/developer messages and at least
    ``head_count`` messages, extended so that no group is cut.

    When the client sent context of its own before the first message a person
    typed (Codex's environment and AGENTS.md, aider's example exchange and
    repository map: :func:`compaction.chat.typed.context_end`), the head runs
    through that context and the message after it, so the task is kept
    verbatim and the client's boilerplate is never what a summary stands for.
    ``context`` is that function's answer, when the caller has it: found
    without it, every system text of the conversation is read.
    """
    leading = 0
    while leading < len(messages) and messages[leading].get("role") in HEAD_ROLES:
        leading += 1
    wanted = max(head_count, leading)
    if context is None:
        context = context_end(messages)
    if context > leading:
        wanted = max(wanted, context + 1)
    wanted = min(wanted, len(messages))
    if wanted == 0:
        return 0
    for group in groups:
        if group.end >= wanted:
            return group.end
    return len(messages)


def turn_start(messages: Sequence[Message], index: int, floor: int = 0) -> int | None:
    """Index of the user message opening the turn that holds ``index`` (not below ``floor``)."""
    for i in range(min(index, len(messages) - 1), floor - 1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def tail_start(
    groups: Sequence[Group],
    counts: Sequence[int],
    budget: int,
    floor: int,
) -> int:
    """Index where the tail begins: the newest groups whose tokens fit ``budget``.

    The newest group is always in the tail, even when it alone exceeds the
    budget, so that the latest request is never condensed away; hard
    truncation shrinks it if it cannot fit the window. The tail never reaches
    into the head (``floor``).
    """
    if not groups or groups[-1].end <= floor:
        return max(floor, groups[-1].end if groups else 0)
    start = groups[-1].end
    used = 0
    for group in reversed(groups):
        if group.start < floor:
            break
        size = sum(counts[group.start : group.end])
        if used + size > budget and start != groups[-1].end:
            break
        used += size
        start = group.start
    return start
