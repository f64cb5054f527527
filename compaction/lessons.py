"""What the upstream's answers teach: how it counts, and its context window.

Pure rules; the proxy keeps what they return (in memory and in its store):

* **the ratio** — of the upstream's token count to our estimate, from each
  answer's ``usage`` (:func:`ratio_sample`), within :data:`MIN_RATIO` –
  :data:`MAX_RATIO`; how samples make the ratio budgets use is
  :mod:`compaction.calibration`'s;
* **a stated window** — an overflow error names the window (``maximum
  context length is 8192 tokens``); it is learned only when plausible: within
  :data:`WINDOW_BOUNDS`, and above the largest prompt the upstream already
  answered for the model (:func:`proven_floor`), since a window below that
  is an error that lies or quotes a number it did not mean;
* **a stated count** — the error's own count of the request that failed is
  believed unless it is larger than any window (:func:`credible_report`);
* **an empty stream** — a streamed answer that ends before its first event,
  for a request using at least :data:`EMPTY_STREAM_NEAR_LIMIT` of its input
  limit, is taken for an overflow (:func:`empty_stream_is_overflow`): some
  servers (llama-cpp-python) answer an over-long streamed prompt that way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

#: Bounds of a learned ratio: beyond them a sample is a misreading (a
#: provider that reports cached tokens apart, an error counting the reply).
MIN_RATIO = 0.8
MAX_RATIO = 2.0
#: Requests smaller than this teach no ratio: a chat template's few fixed
#: tokens would dominate it.
MIN_CALIBRATION_TOKENS = 1_000
#: Samples beyond these are misreadings, not tokenizers, and teach nothing: a
#: server that counts only the part of a prompt it did not have cached (some
#: Ollama versions) shows a tenth of the prompt; clamped to the bounds, such
#: samples would still pull the ratio down to its floor, answer after answer.
PLAUSIBLE_SAMPLES = (MIN_RATIO / 2, MAX_RATIO * 2)
#: Windows an overflow error may teach: below the smallest models in use,
#: above any model's window, a stated figure is a misreading or a lie.
WINDOW_BOUNDS = (512, 10_000_000)
#: An empty stream is an overflow for a request using at least this share of
#: its input limit; below it, it is the upstream's own failure.
EMPTY_STREAM_NEAR_LIMIT = 0.5


def clamp_ratio(ratio: float) -> float:
    return min(max(ratio, MIN_RATIO), MAX_RATIO)


def ratio_sample(upstream_tokens: int, estimate: int) -> float | None:
    """The ratio one answer shows, or ``None`` when it is too small to tell or
    beyond :data:`PLAUSIBLE_SAMPLES`."""
    if estimate < MIN_CALIBRATION_TOKENS or upstream_tokens <= 0:
        return None
    sample = upstream_tokens / estimate
    low, high = PLAUSIBLE_SAMPLES
    return sample if low <= sample <= high else None


@dataclass(frozen=True)
class OverflowReport:
    """What an upstream's context-length error states: its window, and its own
    count of the request that failed (either may be missing)."""

    window: int | None = None
    count: int | None = None


@dataclass(frozen=True)
class WindowLesson:
    """What an overflow error's stated window teaches."""

    #: The window is plausible: the retry may aim below it.
    taken: bool
    #: The window to remember now; ``None`` when it is refused or already known.
    remember: int | None


def window_to_learn(current: int | None, stated: int, proven: int) -> WindowLesson:
    """The lesson of an error stating ``stated`` as the window, when ``current``
    is the window learned so far (``None``: none) and ``proven`` the largest
    prompt the upstream answered for the model."""
    low, high = WINDOW_BOUNDS
    if not low <= stated <= high or stated <= proven:
        return WindowLesson(taken=False, remember=None)
    return WindowLesson(taken=True, remember=None if current == stated else stated)


def proven_floor(proven: int, answered: int) -> int:
    """The largest prompt answered, after one of ``answered`` tokens was: the
    window is at least that."""
    return max(proven, answered)


def credible_report(report: OverflowReport, *, window_taken: bool) -> OverflowReport:
    """``report`` with the figures that are not to be aimed at removed: a window
    that was not taken (:func:`window_to_learn`), and a count larger than any
    window (no prompt is that large)."""
    if report.window and not window_taken:
        report = dataclasses.replace(report, window=None)
    if report.count and report.count > WINDOW_BOUNDS[1]:
        report = dataclasses.replace(report, count=None)
    return report


def empty_stream_is_overflow(tokens_sent: int, input_limit: int) -> bool:
    """Whether a stream that ended before its first event is taken for an
    overflow of a request of ``tokens_sent`` under ``input_limit`` (module doc)."""
    return tokens_sent >= EMPTY_STREAM_NEAR_LIMIT * input_limit
