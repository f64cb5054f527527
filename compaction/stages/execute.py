"""Carry out a compaction that :func:`compaction.stages.decide.decide` asked for:
prune → condense → truncate, on the whole middle (docs/compaction.md, "The stages"); with the
``mask`` and ``hybrid`` strategies, mask → (condense) → truncate
(:mod:`compaction.stages.strategies`).

::

    ┌──────── head ────────┬──────────── middle ────────────┬──── tail ────┐
    │ system, task          │ pruned → condensed → dropped   │ newest groups │
    │ (verbatim)            │                                │ (verbatim)    │
    └───────────────────────┴────────────────────────────────┴──────────────┘

Room is planned **before** the summarizer is called, never found missing
after it answered::

    room    = L − head                  what the summary and the tail share
    tail    = newest groups within min(keep_recent_tokens, L // 2, room // 2)
    summary ≤ 60 % of (room − tail), within [summary_min_tokens, summary_max_tokens]

When the minimum summary does not fit beside that tail, the tail gives way
first (its older groups join the summarized span). When it does not fit even
beside the newest group alone, no model is asked: a smaller extractive digest
takes what the newest group leaves (the newest group is not cut for it), or,
when the newest group must be cut anyway, the digest of the minimum size and
hard truncation cuts the newest group to leave room for it. A summary, once
written, is kept — fitted to its room (its text cut), never thrown away for a
truncation.

The only ``await`` is around the summarizer. Stages never mutate their
input; unchanged messages come out as the caller's own objects.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compaction.budget.calibrated import Budget
from compaction.budget.profile import Profile
from compaction.chat.groups import (
    Group,
    group_messages,
    repair_tool_pairing,
    riding_in,
    validate_tool_pairing,
)
from compaction.conversation.checkpoints import Checkpoint
from compaction.conversation.reading import Conversation
from compaction.conversation.regions import head_end, tail_start
from compaction.errors import CannotFitError, SummarizationError
from compaction.stages.condenser import condense, find_middle, summary_budget
from compaction.stages.decide import Decision
from compaction.stages.results import CompactionResult, forwarded, span_of
from compaction.stages.strategies import condenses, shrink_middle
from compaction.stages.truncate import truncate
from compaction.tokens.counter import KeyMemo, TokenCounter
from compaction.types import STAGE_ORDER, Message, Reason, Stage, Summarizer

#: Share of the room left beside the head and the tail that a summary may
#: take; the rest absorbs estimation error and the next turns.
SUMMARY_ROOM_SHARE = 0.6
#: Tokens kept aside for a truncation note and rounding.
NOTE_ROOM = 32
#: The newest group is never planned smaller than this to make room for a digest.
NEWEST_FLOOR = 256
#: A digest smaller than this says too little to be worth its place.
DIGEST_FLOOR = 200
#: Share of the plan's fill (beside the head) the verbatim tail may take: the
#: newest outputs, whole, are what the next turns read from (more would leave
#: the summary of the oldest span too little room: the request would end
#: above the fill it was planned at).
TAIL_SHARE_OF_FILL = 0.7


@dataclass
class _Run:
    """Bookkeeping of one :func:`execute` call; never escapes it."""

    counter: TokenCounter
    keys: KeyMemo
    overhead: int
    budget: Budget
    profile: Profile
    reason: Reason
    notes: list[str]
    #: Tokens expected before the compaction this run prepares (ahead of need).
    growth: int = 0
    #: Whose conversation, for the refs of what is shortened ("": no refs).
    salt: str = ""
    #: Tokens a threshold compaction aims to leave (:attr:`Decision.target`).
    target: int = 0

    def counts(self, messages: Sequence[Message]) -> list[int]:
        return self.counter.count_messages(messages, self.keys.keys(messages))

    def total(self, messages: Sequence[Message]) -> int:
        return sum(self.counts(messages)) + self.overhead


async def execute(
    conversation: Conversation,
    decision: Decision,
    summarizer: Summarizer | None = None,
    *,
    instructions: str | None = None,
) -> CompactionResult:
    """Compact ``decision.messages`` to ``decision.budget``.

    Raises :class:`~compaction.errors.CannotFitError` when the head, or the
    newest group even cut, cannot fit, or the output asked for leaves the
    input no room.
    """
    if decision.action == "forward":
        return forwarded(conversation, decision)
    run = _run_of(conversation, decision)
    # A compaction prepared ahead (``decision.checkpoint.precomputed``) is this
    # compaction: applied, it is kept as it is, and only what follows it is
    # compacted further (``decision.fixed``).
    ready = decision.checkpoint if decision.checkpoint and decision.checkpoint.precomputed else None
    if ready is not None:
        run.notes.append(f"applied the compaction prepared ahead ({ready.id})")
    messages, counts, fixed = decision.messages, decision.counts, decision.fixed
    repair = repair_tool_pairing(messages)
    if repair.changed:
        messages = repair.messages
        counts = run.counts(messages)
        run.notes.extend(repair.notes)
        fixed = 0  # the indices moved: the prepared summary is rolled up instead
    if messages is conversation.messages:
        groups, head = conversation.groups, conversation.head
    else:
        groups = group_messages(messages)
        head = head_end(messages, groups, run.profile.head_count)
    within = sum(counts) + run.overhead <= run.budget.trigger
    if decision.reason == "threshold" and within and not decision.growth and not decision.early:
        # Nothing (more) to compact: here to be repaired, or to apply a
        # compaction prepared ahead.
        outcome = _unchanged(messages, head, decision, None if repair.changed else ready)
    else:
        outcome = await _compact(
            run, messages, counts, groups, head + fixed, summarizer, instructions
        )
    span = None
    if outcome.stage not in ("none", "reused"):
        span = span_of(outcome.messages, messages, groups, head, outcome.aligned)
    return CompactionResult(
        messages=outcome.messages,
        stage=outcome.stage,
        reason=decision.reason,
        tokens_before=decision.tokens_before,
        tokens_after=run.total(outcome.messages),
        input_limit=run.budget.input_limit,
        trigger=run.budget.trigger,
        messages_before=len(conversation.messages),
        notes=tuple(run.notes),
        summary=outcome.summary,
        summarizer_used=outcome.summarizer_used,
        summarizer_calls=outcome.summarizer_calls,
        changed=outcome.messages is not conversation.messages
        and outcome.messages != conversation.messages,
        span=span,
        precomputed=ready.id if ready is not None and outcome.stage != "reused" else None,
    )


def _run_of(conversation: Conversation, decision: Decision) -> _Run:
    """What every stage of this compaction reads: the decision's budget and profile,
    the conversation's counter and keys, and the notes so far."""
    return _Run(
        counter=conversation.counter,
        keys=KeyMemo(conversation.messages, conversation.keys),
        overhead=conversation.overhead,
        budget=decision.budget,
        profile=decision.profile,
        reason=decision.reason,
        notes=list(decision.notes),
        growth=decision.growth,
        salt=conversation.recall_salt if decision.profile.recall else "",
        target=decision.target,
    )


def _unchanged(
    messages: list[Message], head: int, decision: Decision, ready: Checkpoint | None
) -> _Outcome:
    """The outcome when nothing (more) is compacted: the messages as they are, as
    the compaction prepared ahead (``ready``, when it still applies) left them."""
    if ready is None:
        return _Outcome(
            messages, "reused" if decision.checkpoint is not None else "none", len(messages)
        )
    stage: Stage = next((known for known in STAGE_ORDER if known == ready.stage), "condensed")
    return _Outcome(messages, stage, len(messages) - head - len(ready.replacement))


@dataclass(frozen=True)
class _Outcome:
    messages: list[Message]
    stage: Stage
    #: How many trailing messages of ``messages`` stand for as many trailing
    #: messages of the input (the same objects, or cut the same way each time).
    aligned: int
    summary: Message | None = None
    summarizer_used: str | None = None
    summarizer_calls: int = 0


async def _compact(
    run: _Run,
    messages: list[Message],
    counts: list[int],
    groups: Sequence[Group],
    head: int,
    summarizer: Summarizer | None,
    instructions: str | None,
) -> _Outcome:
    budget = run.budget
    if budget.input_limit <= 0 and budget.requested_output >= budget.reserve:
        # The output asked for set the reserve and took the window: the head is
        # not what is too large, and no compaction can help.
        raise CannotFitError.output(
            budget.requested_output, budget.context_window, budget.input_limit
        )
    head_tokens = sum(counts[:head]) + run.overhead
    if head_tokens > budget.input_limit:
        raise CannotFitError.head(sum(counts[:head]), run.overhead, budget.input_limit)
    # Stage 1: prune the whole middle, or mask its tool outputs
    # (compaction.stages.strategies: the strategy decides).
    tail = tail_start(groups, counts, _tail_budget(run, counts, head), head)
    done = _shrunk(run, messages, head, tail)
    if run.reason == "threshold" and run.total(done.messages) + run.growth <= run.target:
        return done
    # Stage 2: condense into one summary — by the trigger, only the oldest
    # span the plan's fill needs (what lies between it and the tail stays, as
    # pruned); otherwise, or when that is not enough, the whole middle.
    # Manual and overflow compactions always condense the whole middle: the
    # user asked for it, or the upstream proved the estimate optimistic.
    room = None
    if run.reason == "threshold" and done.stage == "pruned":
        room = _oldest_span(run, messages, done.messages, groups, head, head_tokens, tail)
    if room is None:
        # Planned on the counts before pruning: the tail must not reach into
        # the pruned middle (pruned messages are smaller, and not verbatim).
        room = _plan_room(run, messages, counts, groups, head, head_tokens)
    if room is not None:
        condensed = await _condensed(
            run, messages, done.messages, head, room, summarizer, instructions
        )
        done = condensed or done
    if run.total(done.messages) <= run.budget.input_limit:
        return done
    # Stage 3: hard truncation, the guarantee (or CannotFitError).
    return _truncated(run, done, head)


def _shrunk(run: _Run, messages: list[Message], head: int, tail: int) -> _Outcome:
    """The middle pruned or masked, or ``messages`` as they are when that changes
    nothing (or would split a tool group)."""
    shrunk = shrink_middle(messages, head, tail, run.profile, salt=run.salt)
    # What a checkpoint of a prune (or a mask) keeps as it is: the verbatim
    # tail. The briefs (placeholders) go into the checkpoint, so that later
    # requests carry the same bytes even when the tail has moved on.
    if shrunk.changed and _valid(shrunk.messages, shrunk.stage, run.notes):
        return _Outcome(shrunk.messages, shrunk.stage, len(messages) - tail)
    return _Outcome(messages, "none", len(messages) - tail)


async def _condensed(
    run: _Run,
    messages: list[Message],
    current: list[Message],
    head: int,
    room: _Room,
    summarizer: Summarizer | None,
    instructions: str | None,
) -> _Outcome | None:
    """``current`` with the span before ``room.tail`` condensed into a summary, or
    ``None`` when no usable summary came of it (the reason is in the notes)."""
    if not room.llm and run.profile.summarizer == "llm":
        run.notes.append(
            "summarizer not called: the head and the newest turn leave no room "
            "for the minimum summary; used extractive"
        )
    try:
        middle = find_middle(current, head, room.tail)
        if room.verbatim != room.tail:
            # The oldest span is one summary: the turn it ends inside goes
            # on in the pruned messages kept after it, and its opening
            # request is quoted by the summary's ledger.
            middle = dataclasses.replace(middle, turn_start=None)
        condensed = await condense(
            current,
            middle,
            profile=room.profile,
            counter=run.counter,
            summarizer=summarizer if room.llm else None,
            instructions=instructions,
            originals=messages,
            keys=run.keys,
            cap=room.cap,
            salt=run.salt,
            kept_after=messages[room.tail : room.verbatim],
        )
    except SummarizationError as exc:
        run.notes.append(f"condense skipped: {exc}")
        return None
    run.notes.extend(condensed.notes)
    if not _valid(condensed.messages, "condense", run.notes):
        return None
    return _Outcome(
        condensed.messages,
        "condensed",
        len(messages) - room.verbatim,
        condensed.summary,
        condensed.summarizer_used,
        condensed.summarizer_calls,
    )


def _truncated(run: _Run, done: _Outcome, head: int) -> _Outcome:
    """``done`` cut down to the input limit by hard truncation."""
    cut = truncate(
        done.messages,
        head_end=head,
        limit=run.budget.input_limit,
        counter=run.counter,
        overhead=run.overhead,
    )
    run.notes.extend(cut.notes)
    if not _valid(cut.messages, "truncate", run.notes):
        raise AssertionError("hard truncation produced split tool groups")  # pragma: no cover
    return _Outcome(
        cut.messages,
        "truncated",
        min(cut.suffix, done.aligned),
        done.summary,
        done.summarizer_used,
        done.summarizer_calls,
    )


@dataclass(frozen=True)
class _Room:
    tail: int  #: where what follows the summary starts
    cap: int  #: tokens the written messages (summaries, turn opener) may take
    profile: Profile  #: with the summary's budget as its ceiling
    llm: bool  #: whether the model may be asked
    #: Where the verbatim tail starts when pruned messages lie between the
    #: summary and it (:func:`_oldest_span`); ``None``: at ``tail``.
    kept_pruned: int | None = None

    @property
    def verbatim(self) -> int:
        """Where the verbatim tail starts."""
        return self.tail if self.kept_pruned is None else self.kept_pruned


def _oldest_span(
    run: _Run,
    messages: Sequence[Message],
    pruned: Sequence[Message],
    groups: Sequence[Group],
    head: int,
    head_tokens: int,
    tail: int,
) -> _Room | None:
    """The shortest oldest span whose summary brings the pruned request to the
    plan's fill, or ``None`` when even the whole pruned middle does not.

    The messages between the span and the verbatim tail stay as the pruner
    left them — the agent's own turns whole, old outputs as briefs with
    their refs — so a compaction summarizes only what it must: the facts
    the next turns use are mostly in the newer turns, and in the agent's own
    commands."""
    profile = run.profile
    if not condenses(profile) or tail <= head:
        return None
    counts = run.counts(pruned)
    target = run.target - run.growth - NOTE_ROOM
    after = sum(counts[head:])
    span = pinned = 0  # the span's tokens, and those of its pinned messages
    for group in groups:
        if group.start < head:
            continue
        if group.start >= tail:
            break
        span += sum(counts[group.start : group.end])
        pinned += sum(counts[i] for i in riding_in(messages, (group,), group.start, group.end))
        end = group.end
        if end >= tail:
            continue
        wanted = summary_budget(span - pinned, profile)
        cap = target - head_tokens - (after - span) - pinned
        if cap >= wanted:
            return _Room(end, cap, _with_ceiling(profile, wanted), llm=True, kept_pruned=tail)
    return None


def _plan_room(
    run: _Run,
    messages: Sequence[Message],
    counts: Sequence[int],
    groups: Sequence[Group],
    head: int,
    head_tokens: int,
) -> _Room | None:
    """Where the tail starts and how large the summary may be, or ``None``
    when there is nothing to condense (see the module docstring).

    The pinned messages of the condensed span, and its groups holding opaque
    ones, are kept beside the summary (:mod:`compaction.stages.condenser`): they take
    their room before it does."""
    profile = run.profile
    if not condenses(profile):
        return None
    whole = run.budget.input_limit - head_tokens - NOTE_ROOM
    minimum = profile.summary_min_tokens
    # The tail takes at most half of the room beside the head: with a large
    # head (a long system prompt, many tool schemas) L // 2 alone would leave
    # no room to grow, and the next turn would compact again. Ahead of need,
    # the tokens still to come will join the tail: it is planned that much
    # shorter (down to a quarter), and the summary's room that much smaller.
    half = max(whole, 0) // 2
    room = whole - run.growth
    tail_budget = min(_tail_budget(run, counts, head), max(half - run.growth, half // 4))

    def kept(tail: int) -> int:
        """The tokens that stay: the tail, and the pinned messages before it."""
        return sum(counts[tail:]) + sum(counts[i] for i in riding_in(messages, groups, head, tail))

    tail = tail_start(groups, counts, tail_budget, head)
    leftover = room - kept(tail)
    if leftover < minimum:
        # The tail gives way before the summary does.
        tail = tail_start(groups, counts, max(room - minimum, 0), head)
        leftover = room - kept(tail)
    if tail <= head:
        return None
    if leftover >= minimum:
        # What the summary stands for: all after the head but what stays (room - leftover).
        wanted = summary_budget(sum(counts[head:]) - (room - leftover), profile)
        ceiling = max(minimum, min(wanted, int(leftover * SUMMARY_ROOM_SHARE)))
        return _Room(tail, leftover, _with_ceiling(profile, ceiling), llm=True)
    # The tail is the newest group alone now, and no model is asked.
    if leftover >= DIGEST_FLOOR:
        # It fits: a smaller digest beside it, the newest group whole.
        return _Room(tail, leftover, _digest(profile, leftover), llm=False)
    if leftover < 0 and room - minimum >= NEWEST_FLOOR:
        # It must be cut anyway: cut it a little more, for the digest.
        return _Room(tail, minimum, _digest(profile, minimum), llm=False)
    return None


def _digest(profile: Profile, cap: int) -> Profile:
    """The profile of an extractive digest of at most ``cap`` tokens."""
    return dataclasses.replace(
        profile,
        summarizer="extractive",
        summary_min_tokens=min(profile.summary_min_tokens, cap),
        summary_max_tokens=min(profile.summary_max_tokens, cap),
    )


def _with_ceiling(profile: Profile, ceiling: int, **changes: Any) -> Profile:
    if ceiling == profile.summary_max_tokens and not changes:
        return profile
    return dataclasses.replace(
        profile,
        summary_max_tokens=max(ceiling, profile.summary_min_tokens),
        **changes,
    )


def _tail_budget(run: _Run, counts: Sequence[int], head: int) -> int:
    """The budget of the verbatim tail.

    A user who types ``/compact`` expects something to be condensed even when
    the whole conversation would fit in the usual tail, so a manual
    compaction keeps at most half of what follows the head. Ahead of need,
    the tail is shorter by the growth still expected (down to a quarter of
    its budget): the messages that will arrive complete it.
    """
    if run.reason == "manual":
        return min(run.budget.tail_budget, sum(counts[head:]) // 2)
    tail = run.budget.tail_budget
    if run.reason == "threshold" and run.target and condenses(run.profile):
        # The verbatim tail takes at most this share of what the plan's fill
        # leaves beside the head; the rest is for the summary and the briefs.
        # (Masking keeps nothing of what it hides: its tail stays as it was.)
        beside = run.target - sum(counts[:head]) - run.overhead
        tail = min(tail, max(math.floor(beside * TAIL_SHARE_OF_FILL), 0))
    return max(tail - run.growth, tail // 4)


def _valid(messages: Sequence[Message], stage: str, notes: list[str]) -> bool:
    problems = validate_tool_pairing(messages)
    if problems:
        notes.append(f"{stage} output discarded (bug): {problems[0]}")
        return False
    return True
