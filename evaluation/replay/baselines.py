"""The strategies the proxy is measured against, run in-process turn by turn.

Each is a per-session object with one method, :meth:`Baseline.send`: given the
history the client holds at a cut point, the messages it sends (and a summary
call made first, if any). None of them is the proxy; all are priced by the same
cache simulator (:mod:`evaluation.replay.records`)::

    unlimited    the whole history every turn (may exceed the window: the
                 impossible reference every cost is divided by)
    truncation   head + the newest whole groups that fit under L
    masking      tool outputs older than the newest MASK_KEEP replaced by a
                 placeholder; then truncation if still above L
    claude-code  above CLAUDE_CODE_SHARE of the window (or L, if lower: held
                 to the same input limit as every other strategy, since a prompt
                 above it leaves the answer less room than the proxy reserves),
                 everything after the head becomes one summary (the engine's
                 extractive summarizer;
                 the newest group stays, as the engine always keeps it); new
                 turns are appended to head + summary until the next crossing

``L = window − min(16384, window // 4)`` (the proxy's input limit for a
request that asks no output size). The head is the system prompt and the first
user message (:func:`compaction.head_end` with two messages). A group — an
assistant message with its tool calls and their results — is kept or dropped
whole; the newest group is always sent, even when it alone is above L.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from compaction import (
    CompactionError,
    Message,
    Profile,
    compact,
    group_messages,
    message_text,
)
from evaluation.replay.prompts import message_segment, prompt_segments

#: Newest tool outputs observation masking leaves as they are.
MASK_KEEP: Final = 10
#: Claude Code compacts when the prompt passes this share of the window.
CLAUDE_CODE_SHARE: Final = 0.835
#: What a masked tool output becomes ({chars}: the original's length).
MASK_PLACEHOLDER: Final = "[Old tool output hidden to save context ({chars:,} characters).]"
#: What the client asks the model when it compacts (Claude Code sends the
#: conversation with such an instruction appended, so the call reads the cache).
SUMMARY_REQUEST: Final = (
    "Your task is to create a detailed summary of the conversation so far, so that the "
    "work can continue from it without losing context."
)

Count = Callable[[str], int]


def input_limit(window: int) -> int:
    """The input limit the proxy derives from ``window`` when no output size is asked."""
    return window - min(16_384, window // 4)


@dataclass(frozen=True)
class Sent:
    """What a strategy sends at one cut point."""

    messages: list[Message]
    #: A summary call the client made first: its prompt messages and reply tokens.
    summary_prompt: list[Message] | None = None
    summary_output: int = 0

    @property
    def compacted(self) -> bool:
        return self.summary_prompt is not None


@dataclass(frozen=True)
class Context:
    """What every baseline of one session needs."""

    window: int
    head: int  #: index one past the head
    tools: Any  #: the body's tool schemas, or None
    count: Count  #: tokens of one segment's text (the simulator's own count)

    @property
    def limit(self) -> int:
        return input_limit(self.window)

    def tokens(self, messages: Sequence[Message]) -> int:
        """The prompt's size as the simulated provider counts it."""
        body = {"tools": self.tools, "messages": messages}
        return sum(self.count(segment) for segment in prompt_segments(body))


class Baseline(Protocol):
    async def send(self, history: list[Message]) -> Sent: ...


class Unlimited:
    def __init__(self, context: Context) -> None:
        self._context = context

    async def send(self, history: list[Message]) -> Sent:
        return Sent(history)


def truncated(messages: Sequence[Message], context: Context) -> list[Message]:
    """The head and the newest whole groups of ``messages`` that fit under the limit
    (the newest always)."""
    head = list(messages[: context.head])
    groups = [g for g in group_messages(messages) if g.start >= context.head]
    if not groups:
        return list(messages)
    room = context.limit - context.tokens(head)
    first = groups[-1].start
    used = sum(context.count(message_segment(m)) for m in messages[first:])
    for group in reversed(groups[:-1]):
        size = sum(context.count(message_segment(m)) for m in messages[group.start : group.end])
        if used + size > room:
            break
        used += size
        first = group.start
    return head + list(messages[first:])


class Truncation:
    def __init__(self, context: Context) -> None:
        self._context = context

    async def send(self, history: list[Message]) -> Sent:
        if self._context.tokens(history) <= self._context.limit:
            return Sent(history)
        return Sent(truncated(history, self._context))


def masked(messages: Sequence[Message], head: int, keep: int = MASK_KEEP) -> list[Message]:
    """``messages`` with every tool output after the head but the newest ``keep``
    replaced by a placeholder (the input is not changed)."""
    results = [i for i, m in enumerate(messages) if i >= head and m.get("role") == "tool"]
    hidden = set(results[:-keep] if keep else results)
    out: list[Message] = []
    for i, message in enumerate(messages):
        text = message_text(message)
        placeholder = MASK_PLACEHOLDER.format(chars=len(text))
        if i in hidden and len(text) > len(placeholder):
            message = {**message, "content": placeholder}
        out.append(message)
    return out


class Masking:
    def __init__(self, context: Context) -> None:
        self._context = context

    async def send(self, history: list[Message]) -> Sent:
        if self._context.tokens(history) <= self._context.limit:
            return Sent(history)
        hidden = masked(history, self._context.head)
        if self._context.tokens(hidden) <= self._context.limit:
            return Sent(hidden)
        return Sent(truncated(hidden, self._context))


class ClaudeCode:
    """Claude Code's auto-compact, as it works from the outside: one summary of
    everything after the head once the prompt passes the share of the window."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self._base: list[Message] | None = None  #: head + summary (+ the newest group)
        self._since = 0  #: where the turns after the summary begin in the history

    async def send(self, history: list[Message]) -> Sent:
        context = self._context
        current = history if self._base is None else self._base + history[self._since :]
        trigger = min(CLAUDE_CODE_SHARE * context.window, input_limit(context.window))
        if context.tokens(current) <= trigger:
            return Sent(current)
        profile = Profile(
            context_window=context.window,
            summarizer="extractive",
            keep_recent_tokens=0,
            recall=False,
        )
        request = {"messages": current, "tools": context.tools}
        try:
            result = await compact(request, profile, reason="manual")
        except CompactionError:
            return Sent(current)  # nothing the summary could replace: sent as it is
        summary = result.summary
        output = context.count(message_text(summary)) if summary is not None else 0
        prompt = [*current, {"role": "user", "content": SUMMARY_REQUEST}]
        self._base, self._since = list(result.messages), len(history)
        return Sent(list(result.messages), prompt, output)


BASELINES: Final[dict[str, Callable[[Context], Baseline]]] = {
    "unlimited": Unlimited,
    "truncation": Truncation,
    "masking": Masking,
    "claude-code": ClaudeCode,
}
