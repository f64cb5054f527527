"""Choosing what a condensation replaces (:mod:`compaction.stages.condenser`).

Pure and synchronous: :func:`find_middle` finds the span between head and
tail, the user message that opened the turn the tail starts inside, the
earlier summaries in the span and the messages that ride along verbatim
(pinned ones and groups holding opaque ones); :func:`spans` cuts it into the
main span and the turn prefix that each summary stands for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compaction.chat.groups import group_messages, riding_in
from compaction.chat.own import is_summary
from compaction.errors import SummarizationError
from compaction.types import Message


@dataclass(frozen=True)
class Middle:
    """What :func:`~compaction.stages.condenser.condense` replaces: ``[head_end, tail_start)``.

    ``turn_start`` is the user message that opened the turn the tail starts
    inside, when that message lies in the middle; it is kept verbatim.
    """

    head_end: int
    tail_start: int
    turn_start: int | None
    previous_summaries: tuple[int, ...]
    #: The pinned messages in the span and the groups holding opaque ones, kept
    #: verbatim (see :mod:`compaction.stages.condenser`).
    pinned: tuple[int, ...] = ()

    @property
    def main_end(self) -> int:
        """Where the main summary's span ends (the turn opener, or the tail)."""
        return self.turn_start if self.turn_start is not None else self.tail_start


def find_middle(messages: Sequence[Message], head_end: int, tail_start: int) -> Middle:
    """Find the turn opener (if the tail starts inside a turn) and the earlier summaries."""
    if not 0 <= head_end <= tail_start <= len(messages):
        raise ValueError(
            f"need 0 <= head_end ({head_end}) <= tail_start ({tail_start}) "
            f"<= len(messages) ({len(messages)})"
        )
    opener: int | None = None
    if tail_start < len(messages) and messages[tail_start].get("role") in (
        "assistant",
        "tool",
        "function",
    ):
        # An earlier summary is a user message but opens no turn: look past it.
        for i in range(tail_start - 1, head_end - 1, -1):
            message = messages[i]
            if message.get("role") == "user" and not is_summary(message):
                opener = i
                break
    previous = tuple(i for i in range(head_end, tail_start) if is_summary(messages[i]))
    pinned = tuple(riding_in(messages, group_messages(messages), head_end, tail_start))
    if opener is not None and any(i < opener < j for i, j in _runs(pinned)):
        # The opener sits inside a group that rides along: kept apart from it, the
        # group's results would leave their call. The tail goes on without it.
        opener = None
    return Middle(head_end, tail_start, opener, previous, pinned)


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive ``indices`` as ``(first, last)`` pairs."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def spans(
    messages: Sequence[Message], originals: Sequence[Message], middle: Middle
) -> tuple[Span, Span]:
    """The main span and the turn prefix (empty unless the turn is split), each
    without its pinned messages; refused when they hold only earlier summaries."""
    pinned = set(middle.pinned)
    main = Span.of(messages, originals, middle.head_end, middle.main_end, pinned)
    prefix = Span([], [])
    if middle.turn_start is not None:
        prefix = Span.of(messages, originals, middle.turn_start + 1, middle.tail_start, pinned)
    if not any(not is_summary(m) for m in (*main.messages, *prefix.messages)):
        raise SummarizationError("nothing to condense: the middle holds only earlier summaries")
    return main, prefix


@dataclass(frozen=True)
class Span:
    """Messages ``[start, end)`` as condensed, and the same ones before pruning."""

    messages: list[Message]
    originals: list[Message]

    @classmethod
    def of(
        cls,
        messages: Sequence[Message],
        originals: Sequence[Message],
        start: int,
        end: int,
        pinned: set[int],
    ) -> Span:
        """``[start, end)`` without the pinned messages (kept, not summarized)."""
        kept = [i for i in range(start, end) if i not in pinned]
        return cls([messages[i] for i in kept], [originals[i] for i in kept])
