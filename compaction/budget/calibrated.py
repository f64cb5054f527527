"""A request's budget in estimated tokens: :func:`calibrated_budget`, and the
retry's after an upstream overflow, :func:`retry_budget`.

**Calibration.** The upstream counts with its own tokenizer and chat
template; the ratio of its count to our estimate (learned per upstream and
model from ``usage`` and from overflow errors, :mod:`compaction.budget.lessons`)
scales every budget::

    scale   = (1 − safety_margin) / ratio
    limit   = ⌊L × scale⌋                   in estimated tokens
    trigger = min(⌊min(threshold, L) × scale⌋, limit)

**The retry rule.** After an upstream overflow, the retry aims below the
window the error states, below ``failed × limit ÷ stated count``, and never
above 90 % of what failed: it can never resend the same bytes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from compaction.budget.lessons import OverflowReport, clamp_ratio
from compaction.budget.profile import Budget, Profile, compute_budget

#: A retry never aims above this share of what failed.
RETRY_CEILING = 0.9
#: Without any figure in the error, the retry aims at this share of what failed.
BLIND_RETRY_SHARE = 0.5


def calibrated_budget(
    profile: Profile, requested_output: int = 0, ratio: float = 1.0, *, held_back: int = 0
) -> Budget:
    """:func:`~compaction.budget.profile.compute_budget` in estimated tokens: scaled by
    the upstream's ratio and the safety margin (see the module docstring);
    ``held_back`` tokens kept for what joins a compacted request."""
    scale = (1 - profile.safety_margin) / clamp_ratio(ratio)
    return compute_budget(profile, requested_output, scale=scale, held_back=held_back)


def _limited(budget: Budget, profile: Profile, limit: int, trigger: int) -> Budget:
    """``budget`` held to another input limit and trigger, its tail following."""
    tail = min(profile.keep_recent_tokens, max(limit, 0) // 2)
    return dataclasses.replace(budget, input_limit=limit, trigger=trigger, tail_budget=tail)


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
