"""Stage 2: replace the middle of a conversation with one structured summary.

Deciding is kept apart from doing: :func:`find_middle` (pure, sync) finds
what the summary covers and whether the tail starts inside a turn;
:func:`condense` (async) is the only place a summarizer is called.

::

    before  [ head ][ middle ............................. ][ tail ]
    after   [ head ][ summary ][ tail ]

    split turn (the tail starts inside the turn opened by user message U):
    before  [ head ][ ..... ][ U ][ steps of U's turn ][ tail ]
    after   [ head ][ summary ][ U ][ turn-prefix summary ][ tail ]

Head, tail and U come out as the very same objects. A pinned message (a
system or developer message inside the span: an instruction, not history) is
not summarized: it comes out as the same object right after the summary of
the part it sat in, in its original order::

    before  [ head ][ a b P c ][ tail ]      after  [ head ][ summary ][ P ][ tail ]

So does every group holding an opaque message (content no summary can stand
for: a block of a type the engine does not know, a tool reference that loads
a tool; :func:`compaction.chat.messages.is_opaque`), whole, so that its results
stay with its call. A span that holds nothing else is not condensed.

There, and not in front of the summary, it always follows a user message
(Anthropic accepts a mid-conversation system message only there), and a
later compaction, which summarizes the summary again, finds it in the same
place: the forwarded bytes change only where the summary does.

Each summary is a user message starting with
:data:`~compaction.chat.own.SUMMARY_MARKER` and ending with the
``<read-files>`` / ``<modified-files>`` blocks. Earlier summaries in the
middle are updated (rolling), never summarized as ordinary text. An LLM
failure falls back to the extractive summary; a summary that would not be
shorter than what it replaces raises :class:`SummarizationError`, and the
pipeline moves on to hard truncation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from compaction.budget.profile import Profile
from compaction.chat.messages import call_name_and_arguments, message_text, tool_calls
from compaction.errors import SummarizationError
from compaction.stages.middle import Middle, Span, find_middle, spans
from compaction.stages.summarizing import Condensing
from compaction.stages.summary_shape import summary_budget
from compaction.summary.ledger import errors_in, names_cut_by_pruning
from compaction.tokens.counter import KeyMemo, TokenCounter
from compaction.types import Message, Summarizer

__all__ = [
    "CondenseResult",
    "Middle",
    "SummarizerUsed",
    "condense",
    "find_middle",
    "summary_budget",
]


SummarizerUsed = Literal["llm", "extractive"]


@dataclass(frozen=True)
class CondenseResult:
    messages: list[Message]
    summary: Message
    summarizer_used: SummarizerUsed
    summarizer_calls: int
    summary_tokens: int
    replaced_tokens: int
    notes: tuple[str, ...]


async def condense(
    messages: Sequence[Message],
    middle: Middle,
    *,
    profile: Profile,
    counter: TokenCounter,
    summarizer: Summarizer | None,
    instructions: str | None = None,
    originals: Sequence[Message] | None = None,
    keys: KeyMemo | None = None,
    cap: int | None = None,
    salt: str = "",
    kept_after: Sequence[Message] = (),
) -> CondenseResult:
    """Replace the ``middle`` with a summary (and a turn-prefix summary when split).

    ``originals`` are the same messages before pruning, index for index: the
    summarizer (model or extractive) reads them, not the pruner's briefs, so
    error messages, commands and paths reach the summary; the file lists are
    read from their tool calls, whose long arguments the pruner cut (a
    ``sed -i '…' path`` loses its path at the end). ``keys`` are the caller's
    memo of message keys, if it has one. ``cap`` bounds the tokens of all
    that replaces the middle (summaries and the kept turn opener): a summary
    that comes out larger is cut to fit, not thrown away. ``salt`` (whose
    conversation this is, with ``profile.recall``) gives the ledger's entries
    naming a tool output the ref of that output (:mod:`compaction.chat.recall`).
    ``kept_after`` are the originals of messages kept after the span only as
    the pruner left them (their outputs briefed): the error lines they printed
    join the summary's ledger, the one place that quotes them whole, and so do
    the names of the agent's turns among them whose text the pruner cut.
    """
    originals = _checked_originals(messages, originals)
    if middle.head_end >= middle.tail_start:
        raise SummarizationError("nothing to condense: the middle is empty")
    if profile.summarizer == "off":
        raise SummarizationError("the summarizer is off")
    main, prefix = spans(messages, originals, middle)
    run = Condensing(
        profile,
        counter,
        KeyMemo() if keys is None else keys,
        summarizer,
        instructions,
        list(messages[: middle.head_end]),
        salt=salt if profile.recall else "",
        later_errors=tuple(errors_in(kept_after)),
        later_names=tuple(names_cut_by_pruning(kept_after, profile)),
        kept_text=_words(messages[middle.tail_start :]),
    )
    caps = _caps(run, messages, middle, prefix, cap)
    main_summary, prefix_summary = await _summaries(run, messages, middle, (main, prefix), caps)
    # Each summary must be smaller than the span it stands for as the client
    # sent it; one that is not (a short message, such as a client's
    # environment note, under a summary's fixed header and ledger) leaves its
    # span as it was. Against the pruned span, a summary quoting the errors
    # the pruner briefed away would lose them; the whole condensation is
    # still held to what it replaces as sent, below.
    if main_summary is not None and _not_smaller(run, main_summary, main):
        main_summary, main = None, Span([], [])
    if prefix_summary is not None and _not_smaller(run, prefix_summary, prefix):
        prefix_summary, prefix = None, Span([], [])
    written = [m for m in (main_summary, prefix_summary) if m is not None]
    replaced = run.tokens(main.messages) + run.tokens(prefix.messages)
    summary_tokens = run.tokens(written)
    if not written or summary_tokens >= replaced:
        raise SummarizationError(
            f"the summary ({summary_tokens:,} tokens) is not shorter than "
            f"the {replaced:,} tokens it would replace"
        )
    return CondenseResult(
        messages=_assembled(messages, middle, main_summary, prefix_summary),
        summary=written[0],
        summarizer_used="extractive" if run.fell_back else "llm",
        summarizer_calls=run.calls,
        summary_tokens=summary_tokens,
        replaced_tokens=replaced,
        notes=tuple(run.notes),
    )


def _checked_originals(
    messages: Sequence[Message], originals: Sequence[Message] | None
) -> Sequence[Message]:
    """``originals``, or ``messages`` when there are none; refused when they do not
    match ``messages`` index for index."""
    if originals is None:
        return messages
    if len(originals) != len(messages):
        raise ValueError(
            f"originals ({len(originals)} messages) must match messages ({len(messages)})"
        )
    return originals


def _caps(
    run: Condensing,
    messages: Sequence[Message],
    middle: Middle,
    prefix: Span,
    cap: int | None,
) -> tuple[int | None, int | None]:
    """The token caps of the main summary and of the turn prefix's: ``cap`` less the
    kept turn opener, the prefix taking at most a third of it."""
    if cap is None:
        return None, None
    opener = run.tokens([messages[middle.turn_start]]) if middle.turn_start is not None else 0
    left = max(cap - opener, 0)
    prefix_cap = None
    if prefix.messages:
        wanted = summary_budget(run.tokens(prefix.messages), run.profile, turn_prefix=True)
        prefix_cap = min(wanted, left // 3)
        left -= prefix_cap
    return left, prefix_cap


async def _summaries(
    run: Condensing,
    messages: Sequence[Message],
    middle: Middle,
    spans: tuple[Span, Span],
    caps: tuple[int | None, int | None],
) -> tuple[Message | None, Message | None]:
    """The main span's summary and the turn prefix's, each ``None`` when its span is empty."""
    main, prefix = spans
    # The two summaries do not depend on each other: asked at once, a split
    # turn costs the time of one summarizer call, not two.
    asked = []
    if main.messages:
        asked.append(run.summarize(main, request=None, cap=caps[0]))
    if middle.turn_start is not None and prefix.messages:
        request = message_text(messages[middle.turn_start])
        asked.append(run.summarize(prefix, request=request, cap=caps[1]))
    answers = list(await asyncio.gather(*asked))
    main_summary = answers.pop(0) if main.messages else None
    return main_summary, answers.pop(0) if answers else None


def _assembled(
    messages: Sequence[Message],
    middle: Middle,
    main_summary: Message | None,
    prefix_summary: Message | None,
) -> list[Message]:
    """The head, each summary (or its span as it was, when it has none) with the
    pinned messages of its span after it, the turn opener, and the tail."""
    out = list(messages[: middle.head_end])
    if main_summary is not None:
        out.append(main_summary)
        out.extend(messages[i] for i in middle.pinned if i < middle.main_end)
    else:
        out.extend(messages[middle.head_end : middle.main_end])
    if middle.turn_start is not None:
        out.append(messages[middle.turn_start])
        if prefix_summary is not None:
            out.append(prefix_summary)
            out.extend(messages[i] for i in middle.pinned if i > middle.turn_start)
        else:
            out.extend(messages[middle.turn_start + 1 : middle.tail_start])
    out.extend(messages[middle.tail_start :])
    return out


def _not_smaller(run: Condensing, summary: Message, span: Span) -> bool:
    """Whether ``summary`` holds as many tokens as ``span`` as the client sent it, or more."""
    return run.tokens([summary]) >= run.tokens(span.originals)


def _words(messages: Sequence[Message]) -> str:
    """The text of ``messages`` and their tool calls' arguments, one after the other."""
    parts: list[str] = []
    for message in messages:
        parts.append(message_text(message))
        parts.extend(call_name_and_arguments(call)[1] for call in tool_calls(message))
    return "\n".join(parts)
