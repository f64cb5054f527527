"""The orchestrator: budget → prune → condense → truncate (DESIGN.md §5).

``compact`` is the only entry point. It decides nothing the stages decide;
it runs them in order on the whole middle, stops at the first stage that
brings the request within its bound, checks tool pairing after every stage,
and reports what happened as a :class:`CompactionResult`::

    ┌──────── head ────────┬──────────── middle ────────────┬──── tail ────┐
    │ system, task (verbatim)│ pruned → condensed → dropped │ newest groups │
    └────────────────────────┴────────────────────────────────┴──────────────┘

Stages never mutate the request; the result holds new lists whose unchanged
messages are the caller's own objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction.condenser import condense, plan_condense
from compaction.errors import SummarizationError
from compaction.messages import (
    check_messages,
    group_messages,
    head_end,
    repair_tool_pairing,
    tail_start,
    validate_tool_pairing,
)
from compaction.profile import Budget, Profile, compute_budget, requested_output_tokens
from compaction.pruner import prune
from compaction.tokens import KeyMemo, TokenCounter, count_messages_off_loop
from compaction.truncate import truncate
from compaction.types import Message, Reason, Stage, Summarizer


@dataclass(frozen=True)
class CompactionResult:
    """What :func:`compact` did to one request."""

    messages: list[Message]
    stage: Stage
    reason: Reason
    tokens_before: int
    tokens_after: int
    input_limit: int
    trigger: int
    messages_before: int
    notes: tuple[str, ...] = ()
    summary: Message | None = None
    summarizer_used: str | None = None
    summarizer_calls: int = 0
    #: False when ``messages`` is exactly the input (the caller may then
    #: forward the original bytes).
    changed: bool = False

    @property
    def messages_after(self) -> int:
        return len(self.messages)


@dataclass
class _Run:
    """Mutable bookkeeping of one ``compact`` call; never escapes it."""

    request: Mapping[str, Any]
    profile: Profile
    budget: Budget
    counter: TokenCounter
    overhead: int
    reason: Reason
    notes: list[str]
    keys: KeyMemo

    def total(self, messages: Sequence[Message]) -> int:
        return sum(self.counter.count_messages(messages, self.keys.keys(messages))) + self.overhead


async def compact(
    request: Mapping[str, Any],
    profile: Profile,
    summarizer: Summarizer | None = None,
    *,
    reason: Reason = "threshold",
    instructions: str | None = None,
    counter: TokenCounter | None = None,
    keys: Sequence[bytes] | None = None,
) -> CompactionResult:
    """Bring a chat-completions request within its model's input limit.

    ``request`` is the body (``messages`` plus ``model``, ``tools``,
    ``max_tokens``…); only ``messages`` is rewritten, and the caller rebuilds
    the body. ``reason="threshold"`` returns the request unchanged when it is
    within the trigger; ``"overflow"`` and ``"manual"`` always compact.

    Raises :class:`~compaction.errors.InvalidMessagesError` for input that is
    not a list of messages and :class:`~compaction.errors.CannotFitError`
    when the head alone (or the newest group, even shrunk) exceeds the limit.

    ``keys`` are the :func:`~compaction.tokens.message_key` of each of the
    request's messages, when the caller has computed them already.
    """
    original = check_messages(request.get("messages"))
    counter = counter or TokenCounter(request.get("model"), image_tokens=profile.image_tokens)
    run = _Run(
        request=request,
        profile=profile,
        budget=compute_budget(profile, requested_output_tokens(request)),
        counter=counter,
        overhead=counter.request_overhead(request),
        reason=reason,
        notes=[],
        keys=KeyMemo(original, keys),
    )
    counts = await count_messages_off_loop(counter, original, run.keys.keys(original))
    tokens_before = sum(counts) + run.overhead

    repair = repair_tool_pairing(original)
    messages = repair.messages
    run.notes.extend(repair.notes)
    if repair.changed:
        counts = counter.count_messages(messages, run.keys.keys(messages))

    def finish(
        final: list[Message],
        stage: Stage,
        summary: Message | None = None,
        used: str | None = None,
        calls: int = 0,
    ) -> CompactionResult:
        return CompactionResult(
            messages=final,
            stage=stage,
            reason=reason,
            tokens_before=tokens_before,
            tokens_after=run.total(final),
            input_limit=run.budget.input_limit,
            trigger=run.budget.trigger,
            messages_before=len(original),
            notes=tuple(run.notes),
            summary=summary,
            summarizer_used=used,
            summarizer_calls=calls,
            changed=final is not original and final != original,
        )

    if reason == "threshold" and sum(counts) + run.overhead <= run.budget.trigger:
        return finish(messages if repair.changed else original, "none")

    groups = group_messages(messages)
    head = head_end(messages, groups, profile.head_count)
    tail = tail_start(groups, counts, _tail_budget(run, counts, head), head)

    # Stage 1: prune the whole middle.
    stage: Stage = "none"
    unpruned = messages  # the file lists must see arguments before the pruner cut them
    pruned = prune(messages, head, tail, profile)
    if pruned.pruned and _valid(pruned.messages, "prune", run.notes):
        messages, stage = pruned.messages, "pruned"
    if reason == "threshold" and run.total(messages) <= run.budget.trigger * profile.prune_target:
        return finish(messages, stage)

    # Stage 2: condense the middle into one summary. Manual and overflow
    # compactions always condense: the user asked for it, or the upstream
    # proved our estimate optimistic.
    if profile.summarizer != "off" and tail > head:
        try:
            condensed = await condense(
                messages,
                plan_condense(messages, head, tail),
                profile=_fit_summary_budget(run, messages, head, tail),
                counter=counter,
                summarizer=summarizer,
                instructions=instructions,
                originals=unpruned,
                keys=run.keys,
            )
        except SummarizationError as exc:
            run.notes.append(f"condense skipped: {exc}")
        else:
            run.notes.extend(condensed.notes)
            if _valid(condensed.messages, "condense", run.notes) and run.total(
                condensed.messages
            ) < run.total(messages):
                messages, stage = condensed.messages, "condensed"
                if run.total(messages) <= run.budget.input_limit:
                    return finish(
                        messages,
                        stage,
                        condensed.summary,
                        condensed.summarizer_used,
                        condensed.summarizer_calls,
                    )

    # Stage 3: hard truncation, the guarantee (or CannotFitError).
    if run.total(messages) <= run.budget.input_limit:
        return finish(messages, stage)
    cut = truncate(
        messages,
        head_end=head,
        limit=run.budget.input_limit,
        counter=counter,
        overhead=run.overhead,
    )
    run.notes.extend(cut.notes)
    if not _valid(cut.messages, "truncate", run.notes):
        raise AssertionError("hard truncation produced split tool groups")  # pragma: no cover
    return finish(cut.messages, "truncated")


#: Share of the room left between head + tail and the input limit that a
#: summary may take; the rest absorbs estimation error and the next turns.
SUMMARY_ROOM_SHARE = 0.6


def _fit_summary_budget(run: _Run, messages: Sequence[Message], head: int, tail: int) -> Profile:
    """The profile with its summary ceiling lowered to what the window has room for.

    On a small window 20 % of a large middle (up to 4000 tokens) would not fit
    beside the head and tail, and truncation would then drop the tail.
    """
    kept = run.total([*messages[:head], *messages[tail:]])
    room = int((run.budget.input_limit - kept) * SUMMARY_ROOM_SHARE)
    profile = run.profile
    ceiling = max(profile.summary_min_tokens, min(profile.summary_max_tokens, room))
    if ceiling == profile.summary_max_tokens:
        return profile
    return dataclasses.replace(profile, summary_max_tokens=ceiling)


def _tail_budget(run: _Run, counts: Sequence[int], head: int) -> int:
    """The budget of the verbatim tail.

    A user who types ``/compact`` expects something to be condensed even when
    the whole conversation would fit in the usual tail, so a manual
    compaction keeps at most half of what follows the head.
    """
    if run.reason == "manual":
        return min(run.budget.tail_budget, sum(counts[head:]) // 2)
    return run.budget.tail_budget


def _valid(messages: Sequence[Message], stage: str, notes: list[str]) -> bool:
    problems = validate_tool_pairing(messages)
    if problems:
        notes.append(f"{stage} output discarded (bug): {problems[0]}")
        return False
    return True
