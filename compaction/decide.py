"""Decide what one request needs: forward it, forward it over a stored
checkpoint, or compact it — and to which budget.

Pure and synchronous: plain data in, a frozen :class:`Decision` out. The
caller looks the checkpoints up, takes the single-flight lock and runs the
plan (:func:`compaction.execute.execute`); the policy lives here:

* **calibration** — the upstream counts with its own tokenizer and chat
  template; the ratio of its count to our estimate (learned per upstream and
  model from ``usage`` and from overflow errors) scales every budget::

      scale   = (1 − safety_margin) / ratio
      limit   = ⌊L × scale⌋                   in estimated tokens
      trigger = min(⌊min(threshold, L) × scale⌋, limit)

* **the trigger** — a request within it is forwarded (over its checkpoint);
* **the progress guard** — a span whose last compaction barely shrank the
  request is not summarized again until new messages outgrow the tail;
* **the retry rule** — after an upstream overflow, the retry aims below the
  window the error states, below ``failed × limit ÷ stated count``, and never
  above 90 % of what failed: it can never resend the same bytes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from compaction.checkpoints import Checkpoint, apply_checkpoint, find_checkpoint
from compaction.conversation import Conversation
from compaction.profile import Budget, Profile, compute_budget
from compaction.types import Message, Reason

#: Bounds of a learned ratio: beyond them a sample is a misreading (a
#: provider that reports cached tokens apart, an error counting the reply).
MIN_RATIO = 0.8
MAX_RATIO = 2.0
#: Requests smaller than this teach no ratio: a chat template's few fixed
#: tokens would dominate it.
MIN_CALIBRATION_TOKENS = 1_000
#: How far one sample moves the ratio: fast up (an overflow is expensive),
#: slowly down (one small request must not undo what an overflow taught).
RATIO_RISE = 0.5
RATIO_FALL = 0.1
#: A retry never aims above this share of what failed.
RETRY_CEILING = 0.9
#: Without any figure in the error, the retry aims at this share of what failed.
BLIND_RETRY_SHARE = 0.5
#: A compaction that shrank the request by less than this share is not
#: summarized again for the same span until the tail has grown (progress guard).
DEFAULT_PROGRESS_MIN_RATIO = 0.1

Action = Literal["forward", "compact"]


def clamp_ratio(ratio: float) -> float:
    return min(max(ratio, MIN_RATIO), MAX_RATIO)


def ratio_sample(upstream_tokens: int, estimate: int) -> float | None:
    """The ratio one answer shows, or ``None`` when it is too small to tell."""
    if estimate < MIN_CALIBRATION_TOKENS or upstream_tokens <= 0:
        return None
    return upstream_tokens / estimate


def update_ratio(old: float | None, sample: float) -> float:
    """The smoothed ratio after ``sample``: the first sample is taken as it is."""
    sample = clamp_ratio(sample)
    if old is None:
        return sample
    weight = RATIO_RISE if sample > old else RATIO_FALL
    return clamp_ratio(old + weight * (sample - old))


def calibrated_budget(profile: Profile, requested_output: int = 0, ratio: float = 1.0) -> Budget:
    """:func:`~compaction.profile.compute_budget` in estimated tokens: scaled by
    the upstream's ratio and the safety margin (see the module docstring)."""
    raw = compute_budget(profile, requested_output)
    scale = (1 - profile.safety_margin) / clamp_ratio(ratio)
    limit = math.floor(raw.input_limit * scale) if raw.input_limit > 0 else raw.input_limit
    return _limited(raw, profile, limit, min(math.floor(raw.trigger * scale), limit))


def _limited(budget: Budget, profile: Profile, limit: int, trigger: int) -> Budget:
    """``budget`` held to another input limit and trigger, its tail following."""
    tail = min(profile.keep_recent_tokens, max(limit, 0) // 2)
    return dataclasses.replace(budget, input_limit=limit, trigger=trigger, tail_budget=tail)


@dataclass(frozen=True)
class OverflowReport:
    """What an upstream's context-length error states: its window, and its own
    count of the request that failed (either may be missing)."""

    window: int | None = None
    count: int | None = None


@dataclass(frozen=True)
class RetryBudget:
    budget: Budget
    ratio: float  #: the ratio the error taught (the old one when it stated no count)


def retry_budget(
    profile: Profile,
    requested_output: int,
    ratio: float,
    failed_tokens: int,
    report: OverflowReport,
) -> RetryBudget:
    """The budget of the one retry after ``failed_tokens`` (our estimate) overflowed."""
    if report.count and failed_tokens > 0:
        ratio = max(ratio, clamp_ratio(report.count / failed_tokens))
    stated = (
        dataclasses.replace(profile, context_window=report.window) if report.window else profile
    )
    budget = compute_budget(stated, requested_output)
    limit = budget.input_limit
    margin = 1 - profile.safety_margin
    targets = [math.floor(failed_tokens * RETRY_CEILING)]
    if report.window:
        targets.append(math.floor(limit * margin / clamp_ratio(ratio)))
    if report.count:
        targets.append(math.floor(failed_tokens * limit / report.count * margin))
    if not report.window and not report.count:
        targets.append(math.floor(failed_tokens * BLIND_RETRY_SHARE))
    target = min(targets)
    return RetryBudget(_limited(budget, profile, target, target), ratio)


@dataclass(frozen=True)
class Decision:
    """What to do with one request.

    ``messages`` is the conversation as it stands: the client's, or with the
    stored ``checkpoint`` applied. With ``action == "forward"`` it is what to
    send; with ``"compact"`` it is what :func:`~compaction.execute.execute`
    compacts to ``budget`` under ``profile`` (the progress guard may have
    turned its summarizer off).
    """

    action: Action
    reason: Reason
    messages: list[Message]
    counts: list[int]  #: of ``messages``
    checkpoint: Checkpoint | None  #: the stored compaction applied, if any
    budget: Budget
    profile: Profile
    tokens_before: int  #: the client's request, estimated
    tokens: int  #: ``messages`` with the rest of the request, estimated
    notes: tuple[str, ...] = ()

    @property
    def untouched(self) -> bool:
        return self.checkpoint is None


def decide(
    conversation: Conversation,
    profile: Profile,
    budget: Budget,
    *,
    reason: Reason = "threshold",
    stored: Mapping[str, Checkpoint] | None = None,
    progress_min_ratio: float = DEFAULT_PROGRESS_MIN_RATIO,
) -> Decision:
    """Apply the newest of ``stored`` (the store's answer for the chain) and
    choose: forward, or compact to ``budget``.

    A checkpoint that would split a tool group is not applied (a note says
    so) and the conversation is compacted afresh.
    """
    messages, counts, used = conversation.messages, conversation.counts, None
    problems = conversation.problems
    notes: list[str] = []
    found = find_checkpoint(conversation.chain, stored) if stored else None
    if found is not None and found.window not in (0, budget.context_window):
        # Made for another window: its summary was sized for another budget.
        notes.append(f"checkpoint {found.id} was made for another context window")
        found = None
    if found is not None:
        applied = apply_checkpoint(messages, conversation.head, found, conversation.groups)
        if applied is None:
            notes.append(f"replay error: checkpoint {found.id} would split a message group")
        else:
            used = found
            head, cut = conversation.head, conversation.head + found.covered
            messages = applied.messages
            counts = [
                *counts[:head],
                *conversation.counter.count_messages(list(found.replacement)),
                *counts[cut:],
            ]
            # Pairing problems inside the replaced span are gone with it.
            problems = tuple(p for p in problems if not head <= p.index < cut)
    tokens = sum(counts) + conversation.overhead
    action: Action = "compact"
    if reason == "threshold" and tokens <= budget.trigger and not problems:
        action = "forward"
    elif used is not None:
        profile = _guarded(profile, budget, used, conversation, progress_min_ratio)
    return Decision(
        action=action,
        reason=reason,
        messages=messages,
        counts=counts,
        checkpoint=used,
        budget=budget,
        profile=profile,
        tokens_before=conversation.tokens,
        tokens=tokens,
        notes=tuple(notes),
    )


def _guarded(
    profile: Profile,
    budget: Budget,
    used: Checkpoint,
    conversation: Conversation,
    progress_min_ratio: float,
) -> Profile:
    """The progress guard: after a compaction that barely shrank the request,
    summarize again only once enough new material arrived to make progress.

    Right after that compaction the messages after its span were the verbatim
    tail; summarizing again is worth a call only when they have outgrown the
    tail by ``progress_min_ratio`` of the input limit. Until then pruning and
    truncation keep the request within the limit at no cost.
    """
    if used.progress_ok or profile.summarizer == "off":
        return profile
    newer = conversation.counts[conversation.head + used.covered :]
    needed = budget.tail_budget + progress_min_ratio * budget.input_limit
    if sum(newer) > needed:
        return profile
    return dataclasses.replace(profile, summarizer="off")
