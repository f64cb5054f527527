"""How often agents fetch again what they already fetched, with no compaction at all.

The proxy counts a *re-read* when a tool call repeats one whose output a
compaction removed (:func:`compaction.count_rereads`: the same tool with the
same arguments, or a read of a file such a call read). Agents repeat calls
anyway — ``git diff`` after every edit, a file read again after changing it
— so a rise in re-reads means something only against that natural rate.

This measures it on uncompacted conversations with the same rule: each tool
call is checked against every earlier call of its conversation after the
head, as if a compaction had removed them all (a checkpoint covering every
message before the call's round). What it counts is therefore the most the
re-read counter could show for that conversation; a compaction that removes
less can only count fewer.

Each round is checked against its whole prefix: quadratic in the rounds of a
conversation, which is fine offline (the fixtures take well under a second).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from compaction import (
    Checkpoint,
    Message,
    Profile,
    check_messages,
    count_rereads,
    group_messages,
    head_end,
    tool_calls,
)
from evaluation.corpus import Body

_ROLES_OF_RESULTS = frozenset({"tool", "function"})


@dataclass(frozen=True)
class Repeats:
    """Tool calls over some conversations, and how many repeated an earlier one."""

    bodies: int = 0  #: conversations with at least one tool call
    calls: int = 0  #: tool calls looked at (those whose results the conversation holds)
    repeats: int = 0
    by_tool: dict[str, int] = field(default_factory=dict)  #: repeats per tool, most first

    @property
    def rate(self) -> float | None:
        """The share of tool calls that repeat an earlier one; ``None`` with no calls."""
        return self.repeats / self.calls if self.calls else None


def conversation_repeats(messages: Sequence[Message], profile: Profile) -> tuple[int, list[str]]:
    """``(tool calls, the tool name of each repeating one)`` of one conversation."""
    head = head_end(messages, group_messages(messages), profile.head_count)
    calls = 0
    repeated: list[str] = []
    for index in range(head, len(messages)):
        message = messages[index]
        if message.get("role") != "assistant" or not tool_calls(message):
            continue
        end = index + 1
        while end < len(messages) and messages[end].get("role") in _ROLES_OF_RESULTS:
            end += 1
        if end == index + 1:
            continue  # no results: the request was sent before they came
        calls += len(tool_calls(message))
        if index == head:
            continue  # nothing before it to repeat
        everything_before = _covering(index - head)
        repeated += count_rereads(messages[:end], everything_before, profile, head=head).tools
    return calls, repeated


@dataclass(frozen=True)
class RepeatReport:
    """:class:`Repeats` over every conversation, and per source folder."""

    total: Repeats
    by_source: dict[str, Repeats]  #: by the first folder of each body's name, sorted


def natural_repeats(
    bodies: Iterable[Body], profile_for: Callable[[str | None], Profile]
) -> RepeatReport:
    """:func:`conversation_repeats` summed over ``bodies``, and per source folder."""
    sums: dict[str, tuple[int, int, Counter[str]]] = {}
    for body in bodies:
        model = body.request.get("model")
        profile = profile_for(model if isinstance(model, str) else None)
        made, repeated = conversation_repeats(check_messages(body.request.get("messages")), profile)
        if not made:
            continue
        source = body.name.split("/", 1)[0] if "/" in body.name else "."
        for key in ("", source):
            conversations, calls, tools = sums.get(key) or (0, 0, Counter())
            sums[key] = (conversations + 1, calls + made, tools + Counter(repeated))
    repeats = {key: _repeats(*value) for key, value in sorted(sums.items())}
    total = repeats.pop("", Repeats())
    return RepeatReport(total, repeats)


def _repeats(conversations: int, calls: int, tools: Counter[str]) -> Repeats:
    return Repeats(conversations, calls, sum(tools.values()), dict(tools.most_common()))


def _covering(covered: int) -> Checkpoint:
    """A compaction that removed the ``covered`` messages after the head."""
    return Checkpoint(
        session="",
        end_hash="",
        covered=covered,
        replacement=(),
        stage="summarized",
        reason="threshold",
        tokens_before=0,
        tokens_after=0,
        id="",
        created_at=0.0,
    )
