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
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from compaction.budget.profile import Profile
from compaction.chat.messages import (
    call_name_and_arguments,
    group_messages,
    message_text,
    riding_in,
    tool_calls,
)
from compaction.chat.own import is_summary
from compaction.chat.typed import first_typed
from compaction.errors import SummarizationError
from compaction.summary.checks import (
    anchor_problem,
    echo_problem,
    markup_problem,
    span_anchors,
    unchanged_problem,
)
from compaction.summary.contradictions import SpanFacts, contradiction_problem, requests_of, task_of
from compaction.summary.extractive import extractive_summary
from compaction.summary.files import FileLists, render_file_lists
from compaction.summary.format import summary_body, summary_message
from compaction.summary.ledger import (
    Ledger,
    errors_in,
    ledger_of,
    names_cut_by_pruning,
    render_ledger,
)
from compaction.summary.prompts import (
    serialize_messages,
    stands_for,
    summary_problem,
    summary_prompt,
    turn_prefix_prompt,
)
from compaction.text.cuts import one_line
from compaction.tokens.counter import KeyMemo, TokenCounter, fit_tokens
from compaction.types import Message, Summarizer

#: Room left in the summarizer's window besides the prompt and the reply: the
#: prompt is estimated with our tokenizer, which may not be the summarizer's.
DEFAULT_PROMPT_MARGIN = 256
#: A chunk of transcript is never planned smaller than this, however small the
#: window: below it, map → fold would spend more on prompts than on content.
MIN_CHUNK_TOKENS = 256
#: The summary's max_tokens is at most this fraction (1/n) of the summarizer's window.
MAX_REPLY_SHARE = 4
#: The model is not asked for a summary of fewer tokens than this: the prose
#: left beside the ledger and the file lists would not hold the sections.
MODEL_REPLY_FLOOR = 200
#: Tighter and tighter cuts tried on one message group too large for a chunk.
_HARDER_CUTS = (1_000, 500, 200)
_NOTE_CHARS = 200

SummarizerUsed = Literal["llm", "extractive"]


@dataclass(frozen=True)
class Middle:
    """What :func:`condense` replaces: ``[head_end, tail_start)``.

    ``turn_start`` is the user message that opened the turn the tail starts
    inside, when that message lies in the middle; it is kept verbatim.
    """

    head_end: int
    tail_start: int
    turn_start: int | None
    previous_summaries: tuple[int, ...]
    #: The pinned messages in the span and the groups holding opaque ones, kept
    #: verbatim (see the module doc).
    pinned: tuple[int, ...] = ()

    @property
    def main_end(self) -> int:
        """Where the main summary's span ends (the turn opener, or the tail)."""
        return self.turn_start if self.turn_start is not None else self.tail_start


@dataclass(frozen=True)
class CondenseResult:
    messages: list[Message]
    summary: Message
    summarizer_used: SummarizerUsed
    summarizer_calls: int
    summary_tokens: int
    replaced_tokens: int
    notes: tuple[str, ...]


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


def summary_budget(tokens: int, profile: Profile, *, turn_prefix: bool = False) -> int:
    """The summarizer's ``max_tokens``: a share of what is replaced, clamped.

    A turn-prefix summary only bridges to the steps that follow, so its
    ceiling is half the main one.
    """
    ceiling = profile.summary_max_tokens
    if turn_prefix:
        ceiling = max(profile.summary_min_tokens, ceiling // 2)
    return min(max(round(tokens * profile.summary_ratio), profile.summary_min_tokens), ceiling)


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
    main, prefix = _spans(messages, originals, middle)
    run = _Condensing(
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
        main_summary, main = None, _Span([], [])
    if prefix_summary is not None and _not_smaller(run, prefix_summary, prefix):
        prefix_summary, prefix = None, _Span([], [])
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


def _spans(
    messages: Sequence[Message], originals: Sequence[Message], middle: Middle
) -> tuple[_Span, _Span]:
    """The main span and the turn prefix (empty unless the turn is split), each
    without its pinned messages; refused when they hold only earlier summaries."""
    pinned = set(middle.pinned)
    main = _Span.of(messages, originals, middle.head_end, middle.main_end, pinned)
    prefix = _Span([], [])
    if middle.turn_start is not None:
        prefix = _Span.of(messages, originals, middle.turn_start + 1, middle.tail_start, pinned)
    if not any(not is_summary(m) for m in (*main.messages, *prefix.messages)):
        raise SummarizationError("nothing to condense: the middle holds only earlier summaries")
    return main, prefix


def _caps(
    run: _Condensing,
    messages: Sequence[Message],
    middle: Middle,
    prefix: _Span,
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
    run: _Condensing,
    messages: Sequence[Message],
    middle: Middle,
    spans: tuple[_Span, _Span],
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


def _not_smaller(run: _Condensing, summary: Message, span: _Span) -> bool:
    """Whether ``summary`` holds as many tokens as ``span`` as the client sent it, or more."""
    return run.tokens([summary]) >= run.tokens(span.originals)


@dataclass(frozen=True)
class _Span:
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
    ) -> _Span:
        """``[start, end)`` without the pinned messages (kept, not summarized)."""
        kept = [i for i in range(start, end) if i not in pinned]
        return cls([messages[i] for i in kept], [originals[i] for i in kept])


@dataclass
class _Shape:
    """How one summary message is put together: its heading's count, the rendered
    ledger once the budget is known, and the cap its tokens must fit."""

    condensed: int
    turn_prefix: bool
    cap: int | None
    counter: TokenCounter
    rendered: str = ""

    def wrap(self, body: str, blocks: str) -> Message:
        return summary_message(
            body, condensed=self.condensed, ledger=blocks, turn_prefix=self.turn_prefix
        )

    def prose_budget(
        self, budget: int, ledger: Ledger, profile: Profile, *, asks_model: bool
    ) -> int:
        """What is left of ``budget`` for the prose once the ledger is rendered.

        The ledger takes its share of the budget; the prose the rest — but a
        model's prose is what is paid for, and the ledger leaves it room to be
        asked when the budget has it.
        """
        lists = render_file_lists(ledger.files)
        if self.cap is not None:
            frame = self.counter.count_message(self.wrap("", lists))
            budget = max(min(budget, self.cap - frame), 1)
        ledger_budget = round(budget * profile.ledger_share)
        if asks_model and budget >= 2 * MODEL_REPLY_FLOOR:
            ledger_budget = min(ledger_budget, budget - MODEL_REPLY_FLOOR)
        self.rendered = render_ledger(ledger, ledger_budget, self.counter)
        taken = self.counter.count_text(self.rendered) - self.counter.count_text(lists)
        return max(budget - taken, 1)

    def fitted(self, body: str) -> Message:
        """The summary message of ``body``, its prose cut to fit the cap."""
        message = self.wrap(body, self.rendered)
        if self.cap is not None and self.counter.count_message(message) > self.cap:
            frame = self.counter.count_message(self.wrap("", self.rendered))
            body = fit_tokens(body, max(self.cap - frame, 0), self.counter)
            message = self.wrap(body, self.rendered)
        if not body.strip() and not self.rendered.strip():
            # A header over nothing would claim the span was summarized
            # when it was dropped; truncation says so instead.
            raise SummarizationError(f"no room for a summary of {self.condensed} messages")
        return message


def _words(messages: Sequence[Message]) -> str:
    """The text of ``messages`` and their tool calls' arguments, one after the other."""
    parts: list[str] = []
    for message in messages:
        parts.append(message_text(message))
        parts.extend(call_name_and_arguments(call)[1] for call in tool_calls(message))
    return "\n".join(parts)


@dataclass
class _Condensing:
    """One condense call: its settings, and what happened so far."""

    profile: Profile
    counter: TokenCounter
    keys: KeyMemo
    summarizer: Summarizer | None
    instructions: str | None
    head: list[Message]
    salt: str = ""
    #: Error lines printed after the span, by messages kept pruned (see condense).
    later_errors: tuple[str, ...] = ()
    #: The names of the agent's turns kept after the span with their text cut
    #: by the pruner (:func:`compaction.summary.ledger.names_cut_by_pruning`).
    later_names: tuple[str, ...] = ()
    #: What the messages kept after the span say (their text and their tool
    #: calls' arguments, as sent): names found there need no ledger entry.
    kept_text: str = ""
    calls: int = 0
    fell_back: bool = False
    notes: list[str] = field(default_factory=list)

    def tokens(self, messages: Sequence[Message]) -> int:
        return sum(self.counter.count_messages(messages, self.keys.keys(messages)))

    @functools.cached_property
    def task(self) -> str:
        """The first words typed in the head, read once for every summary of this
        call: its ledger, its extractive Goal and the check of a model's Goal."""
        return first_typed(self.head)

    async def summarize(
        self, whole: _Span, *, request: str | None, cap: int | None = None
    ) -> Message:
        """The summary message for ``whole``; ``request`` is set for a turn prefix.
        ``cap`` bounds its tokens: a longer summary is cut to fit."""
        turn_prefix = request is not None
        span = whole.messages
        ordinary = [m for m in whole.originals if not is_summary(m)]
        previous = [summary_body(message_text(m)) for m in span if is_summary(m)]
        if not ordinary and len(span) == 1:
            return span[0]  # a lone earlier summary: nothing new to fold into it
        span_tokens = self.tokens(span)
        ledger = self._ledger(whole, turn_prefix=turn_prefix)
        # The client's messages it stands for: an earlier summary folded in counts its own.
        shape = _Shape(stands_for(span), turn_prefix, cap, self.counter)
        asks_model = self.profile.summarizer == "llm" and self.summarizer is not None
        budget = summary_budget(span_tokens, self.profile, turn_prefix=turn_prefix)
        budget = shape.prose_budget(budget, ledger, self.profile, asks_model=asks_model)
        label = "turn prefix: " if turn_prefix else ""
        if asks_model and budget < MODEL_REPLY_FLOOR:
            # Too little room for prose: a model asked for a few tokens is cut
            # off and billed all the same.
            self.notes.append(
                f"{label}summarizer not called: {budget} tokens left for its reply; used extractive"
            )
            asks_model = False
        if asks_model:
            try:
                body = await self._llm(ordinary, previous, budget, request)
                problem = self._problem(body, ordinary, previous, ledger.files, request)
                if problem is not None:
                    raise SummarizationError(f"not a summary: {problem}")
                message = shape.fitted(body)
                tokens = self.counter.count_message(message)
                if tokens >= span_tokens:
                    raise SummarizationError(
                        f"{tokens:,} tokens, not shorter than the {span_tokens:,} it replaces"
                    )
                return message
            except SummarizationError as exc:
                self.notes.append(f"{label}llm summary unusable ({exc}); used extractive")
            except Exception as exc:  # any failure of the injected call falls back
                detail = one_line(f"{type(exc).__name__}: {exc}", _NOTE_CHARS)
                self.notes.append(f"{label}llm summarizer failed ({detail}); used extractive")
        elif self.profile.summarizer == "llm" and self.summarizer is None and not self.fell_back:
            self.notes.append("no llm summarizer available; used extractive")
        self.fell_back = True
        body = extractive_summary(
            ordinary,
            task=self.task,
            previous=previous,
            budget=budget,
            counter=self.counter,
            instructions=self.instructions,
            files=ledger.files,
            turn_prefix=turn_prefix,
        )
        return shape.fitted(body)

    def _ledger(self, whole: _Span, *, turn_prefix: bool) -> Ledger:
        """The span's ledger: computed once per summary, from the originals (not the
        pruned briefs), with the ledgers of earlier summaries in the span folded in,
        and for a main summary the errors printed after it by messages kept pruned
        and the names of the agent's turns there whose text was cut; without the
        names that the messages kept after it already hold."""
        ledger = ledger_of(whole.originals, self.profile, task=self.task, salt=self.salt)
        if self.later_errors and not turn_prefix:
            ledger = ledger.merge(Ledger(errors=self.later_errors))
        if self.later_names and not turn_prefix:
            ledger = ledger.merge(Ledger(identifiers=self.later_names))
        if not turn_prefix:
            ledger = ledger.naming_only_what_is_gone(self.kept_text)
        return ledger

    def _problem(
        self,
        body: str,
        ordinary: list[Message],
        previous: list[str],
        files: FileLists,
        request: str | None,
    ) -> str | None:
        """Why a model's ``body`` cannot stand for the span, or ``None``: not in the
        summary's form, missing the span's anchors, the earlier summary unchanged,
        or claiming what the span's tool calls and the user's words contradict."""
        turn_prefix = request is not None
        problem = summary_problem(body, turn_prefix=turn_prefix)
        if problem is not None and turn_prefix and summary_problem(body) is None:
            problem = None  # a whole summary's sections serve a turn prefix too
        if problem is not None:
            return problem
        anchors = span_anchors(ordinary)
        problem = anchor_problem(body, anchors)
        problem = problem or unchanged_problem(body, previous, anchors)
        facts = SpanFacts(
            files,
            task_of(self.head, previous, task=self.task),
            not turn_prefix,
            requests_of(self.head, ordinary, previous, request),
        )
        return problem or contradiction_problem(body, facts)

    async def _llm(
        self,
        ordinary: list[Message],
        previous: list[str],
        budget: int,
        request: str | None,
    ) -> str:
        """Map → fold: summarize chunk by chunk, each call updating the running summary."""
        assert self.summarizer is not None

        def prompt(transcript: str, running: Sequence[str]) -> list[Message]:
            if request is None:
                return summary_prompt(
                    transcript, previous=running, instructions=self.instructions, budget=budget
                )
            return turn_prefix_prompt(
                transcript,
                request=request,
                previous=running,
                instructions=self.instructions,
                budget=budget,
            )

        window = self.profile.summarizer_context_window or self.profile.context_window
        # A reply may not crowd the transcript out of a small summarizer window.
        budget = min(budget, max(window // MAX_REPLY_SHARE, 1))
        available = window - budget - max(DEFAULT_PROMPT_MARGIN, window // 20)
        available -= sum(self.counter.count_messages(prompt("", ())))
        first = available - sum(self.counter.count_text(p) + 8 for p in previous)
        following = available - budget - 8
        running: list[str] = previous
        for chunk in self._chunks(ordinary, first, following):
            self.calls += 1  # counted before awaiting: a failed call was still made
            reply = await self.summarizer(prompt(chunk, running), budget)
            if not isinstance(reply, str):
                raise SummarizationError(f"the reply is {type(reply).__name__}, not text")
            body = summary_body(reply)
            if not body:
                raise SummarizationError("empty reply")
            # Checked on every reply, not only the last: the next call would
            # fold an echoed template or a continued transcript in as the
            # previous summary, and keep it.
            problem = echo_problem(body) or markup_problem(body)
            if problem is not None:
                raise SummarizationError(f"not a summary: {problem}")
            running = [body]
        return running[0]

    def _chunks(self, messages: list[Message], first: int, following: int) -> list[str]:
        """The serialized transcript split at group boundaries into chunks that fit."""
        limit = self.profile.summary_tool_result_chars
        chunks: list[str] = []
        parts: list[str] = []
        used = 0
        for group in group_messages(messages):
            text = serialize_messages(messages[group.start : group.end], limit)
            tokens = self.counter.count_text(text) + 2
            capacity = max(first if not chunks else following, MIN_CHUNK_TOKENS)
            if parts and used + tokens > capacity:
                chunks.append("\n\n".join(parts))
                parts, used = [], 0
                capacity = max(following, MIN_CHUNK_TOKENS)
            if tokens > capacity:
                text, tokens = self._squeeze(messages[group.start : group.end], capacity)
            parts.append(text)
            used += tokens
        if parts or not chunks:
            chunks.append("\n\n".join(parts))
        return chunks

    def _squeeze(self, group: list[Message], capacity: int) -> tuple[str, int]:
        """One group serialized with its results cut harder until it fits ``capacity``."""
        text = ""
        for limit in _HARDER_CUTS:
            text = serialize_messages(group, limit)
            if self.counter.count_text(text) + 2 <= capacity:
                break
        text = fit_tokens(text, capacity - 2, self.counter)
        return text, self.counter.count_text(text) + 2
