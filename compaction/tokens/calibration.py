"""How the upstream counts, from its recent answers: a ratio one odd request
cannot poison.

Pure; the proxy keeps one :class:`Calibration` per upstream and model and
feeds it each answer's sample (:func:`compaction.budget.lessons.ratio_sample`: the
upstream's count ÷ our estimate of the same request).

The samples of one model vary with what a request holds: a tool output full
of digits counts twice our estimate on a tokenizer that splits digits one by
one, while prose counts about what we thought. The ratio scales the limit of
every conversation on the model, so it must follow what the model usually
does, not the last request:

* the last :data:`WINDOW` samples are kept, and the ratio moves toward their
  **median** — a single odd sample barely moves a median, however odd;
* it moves by at most :data:`MAX_STEP` of itself per answer, so no one answer
  moves any conversation's limit by more than a few percent, whatever the
  window held before;
* the very first sample is all that is known: it is taken as it is (within
  :data:`~compaction.budget.lessons.MIN_RATIO` – :data:`~compaction.budget.lessons.MAX_RATIO`);
  a ratio restored from the store (:func:`restored_calibration`) is a prior with no
  samples, which the next answers move by steps;
* a sustained change (every answer at a new level) moves the median once half
  the window shows it, and the ratio follows it by steps: a change up to
  ``(1 + MAX_STEP) ** (WINDOW // 2 - 1)`` (about ×1.4) is followed within
  :data:`WINDOW` answers, a larger one within :func:`answers_to_follow`
  (at most 28 answers from one bound to the other).

The ratio is kept per caller (:mod:`compaction.budget.lessons`): a caller whose content
the upstream counts at twice our estimate moves its own ratio, not the others'.
A caller with no sample of its own starts from :func:`agreed_ratio`.

Content our estimate systematically undercounts (long digit runs) is counted
up front instead (:mod:`compaction.tokens.counter`), so the samples of a model stay
close together and the median is its usual ratio.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection
from dataclasses import dataclass

from compaction.budget.lessons import AGREEING_CALLERS, clamp_ratio

#: Answers whose samples the ratio is the median of.
WINDOW = 16
#: The most one answer moves the ratio, as a share of the ratio.
MAX_STEP = 0.05


@dataclass(frozen=True)
class Calibration:
    """The ratio of one upstream and model, and the samples it follows."""

    #: The upstream's count ÷ our estimate that budgets are scaled by.
    ratio: float
    #: The last :data:`WINDOW` samples, oldest first (none for a restored prior).
    samples: tuple[float, ...] = ()


def restored_calibration(ratio: float) -> Calibration:
    """A ratio read back from the store: a prior that answers move by steps."""
    return Calibration(clamp_ratio(ratio))


def calibrate(previous: Calibration | None, sample: float) -> Calibration:
    """The calibration after one more answer showed ``sample`` (module doc)."""
    sample = clamp_ratio(sample)
    if previous is None:
        return Calibration(sample, (sample,))
    samples = (*previous.samples[-(WINDOW - 1) :], sample)
    target = statistics.median(samples)
    low, high = previous.ratio * (1 - MAX_STEP), previous.ratio * (1 + MAX_STEP)
    return Calibration(clamp_ratio(min(max(target, low), high)), samples)


def agreed_ratio(ratios: Collection[float]) -> float | None:
    """The ratio for a caller that has none of its own, from the other callers'
    ratios: their median once :data:`~compaction.budget.lessons.AGREEING_CALLERS` have
    one (``None`` before: the caller starts from no ratio). A median moves no
    further than the next caller's ratio, whatever one caller's counts."""
    if len(ratios) < AGREEING_CALLERS:
        return None
    return clamp_ratio(statistics.median(ratios))


def answers_to_follow(old: float, new: float) -> int:
    """At most how many answers, all at ``new``, bring a ratio settled at ``old``
    (its window at ``old`` too) to ``new``: half the window to move the median,
    then a step per answer. From any state at all, :data:`WINDOW` answers more
    than the steps from one bound to the other (every sample is then ``new``)."""
    old, new = clamp_ratio(old), clamp_ratio(new)
    if math.isclose(old, new):
        return 0
    steps = math.ceil(abs(math.log(new / old)) / math.log(1 + MAX_STEP))
    return WINDOW // 2 + 1 + steps
