"""A request's budget: the profile's arithmetic (:class:`Budget`,
:func:`compute_budget`), in estimated tokens (:func:`calibrated_budget`), and
the retry's after an upstream overflow (:func:`retry_budget`).

**The budget** (docs/compaction.md, "The budget")::

    R_eff   = max(min(R, W // 4), requested_output)
    L       = W - R_eff                       input limit: nothing leaves above it
    trigger = min(threshold, L)               compaction starts above this
    tail    = min(keep_recent_tokens, L // 2) kept verbatim, never fills the window

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from compaction.budget.lessons import OverflowReport, clamp_ratio
from compaction.budget.profile import Profile


@dataclass(frozen=True)
class Budget:
    """The token figures one request is held to."""

    context_window: int
    reserve: int  #: R_eff
    input_limit: int  #: L
    trigger: int
    tail_budget: int
    requested_output: int = 0
    #: Tokens held back under the window's own limit for what the proxy adds
    #: to a compacted request (the recall tool): ``input_limit`` is already
    #: that much lower, so the request with it still fits.
    held_back: int = 0

    def holding_back(self, tokens: int) -> Budget:
        """This budget with ``tokens`` more held back from its limit and trigger.

        The request declares tools, and once it is compacted the recall tool
        joins them: counted in from the start, the tools block never has to
        leave again when the conversation grows towards the trigger (which
        would break the provider's prompt cache at every turn after). A
        budget made for a request holds them back as it is made
        (:func:`compute_budget`'s ``held_back``); this is for one made
        otherwise (the overflow retry's)."""
        if tokens <= 0:
            return self
        limit = self.input_limit - tokens
        return dataclasses.replace(
            self,
            input_limit=limit,
            trigger=min(self.trigger, limit),
            held_back=self.held_back + tokens,
        )


def requested_output_tokens(request: Mapping[str, Any]) -> int:
    """The output the client asked for: ``max_completion_tokens`` or ``max_tokens``."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = request.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def compute_budget(
    profile: Profile, requested_output: int = 0, *, scale: float = 1.0, held_back: int = 0
) -> Budget:
    """Apply the budget (docs/compaction.md, "The budget") to one request.

    ``L`` can come out at or below zero when the client asks for more output
    than the window holds; the pipeline then reports that the head cannot fit.
    ``scale``: the upstream's tokens in the caller's units (our estimate's,
    :func:`calibrated_budget`), applied to ``L`` and
    the trigger (rounded down) and so to the tail, in the one budget made;
    ``held_back``: then taken off by :meth:`Budget.holding_back` (not called
    for none, as for most requests).
    """
    window = profile.context_window
    reserve = max(min(profile.reserve_tokens, window // 4), requested_output)
    limit = window - reserve
    trigger = limit if profile.threshold is None else min(profile.threshold, limit)
    if limit > 0:
        limit = math.floor(limit * scale)
    trigger = min(math.floor(trigger * scale), limit)
    budget = Budget(
        context_window=window,
        reserve=reserve,
        input_limit=limit,
        trigger=trigger,
        tail_budget=min(profile.keep_recent_tokens, max(limit, 0) // 2),
        requested_output=requested_output,
    )
    return budget.holding_back(held_back) if held_back > 0 else budget


#: A retry never aims above this share of what failed.
RETRY_CEILING = 0.9
#: Without any figure in the error, the retry aims at this share of what failed.
BLIND_RETRY_SHARE = 0.5


def calibrated_budget(
    profile: Profile, requested_output: int = 0, ratio: float = 1.0, *, held_back: int = 0
) -> Budget:
    """:func:`compute_budget` in estimated tokens: scaled by
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
