"""Asking for one summary and checking what comes back.

:class:`Condensing` is one condense call's run: for each span it computes the
ledger, asks the injected summarizer map → fold (the transcript in chunks
that fit its window, each reply updating the running summary), checks every
reply (:mod:`compaction.summary.checks`,
:mod:`compaction.summary.contradictions`) and falls back to the extractive
summary when the model fails or its reply cannot stand for the span.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from compaction.budget.profile import Profile
from compaction.chat.groups import group_messages
from compaction.chat.messages import message_text
from compaction.chat.own import is_summary
from compaction.chat.typed import first_typed
from compaction.errors import SummarizationError
from compaction.stages.middle import Span
from compaction.stages.summary_shape import MODEL_REPLY_FLOOR, Shape, summary_budget
from compaction.summary.checks import (
    anchor_problem,
    echo_problem,
    markup_problem,
    span_anchors,
    unchanged_problem,
)
from compaction.summary.contradictions import SpanFacts, contradiction_problem, requests_of, task_of
from compaction.summary.extractive import extractive_summary
from compaction.summary.files import FileLists
from compaction.summary.format import summary_body
from compaction.summary.ledger import Ledger, ledger_of
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
#: Tighter and tighter cuts tried on one message group too large for a chunk.
_HARDER_CUTS = (1_000, 500, 200)
_NOTE_CHARS = 200


@dataclass
class Condensing:
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
        self, whole: Span, *, request: str | None, cap: int | None = None
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
        shape = Shape(stands_for(span), turn_prefix, cap, self.counter)
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

    def _ledger(self, whole: Span, *, turn_prefix: bool) -> Ledger:
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
