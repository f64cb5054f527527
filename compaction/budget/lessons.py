"""What the upstream's answers teach: how it counts, and its context window.

Pure rules; the proxy keeps what they return (in memory and in its store):

* **the ratio** — of the upstream's token count to our estimate, from each
  answer's ``usage`` (:func:`ratio_sample`), within :data:`MIN_RATIO` –
  :data:`MAX_RATIO`; how samples make the ratio budgets use is
  :mod:`compaction.tokens.calibration`'s;
* **a stated window** — an overflow error names the window (``maximum
  context length is 8192 tokens``); it is learned only when plausible: within
  :data:`WINDOW_BOUNDS`, and above the largest prompt the upstream already
  answered for the model (:func:`proven_floor`), since a window below that
  is an error that lies or quotes a number it did not mean;
* **a stated count** — the error's own count of the request that failed is
  believed unless it is larger than any window (:func:`credible_report`);
* **an empty stream** — a streamed answer that ends before its first event is
  how some servers (llama-cpp-python) refuse an over-long prompt, and how any
  server fails for other reasons; it is taken for an overflow only above the
  largest prompt already answered, and then narrows a *working limit*
  (:func:`empty_stream_lesson`), which answers of larger prompts raise again
  (:func:`working_limit_after_answer`) — but not an estimate of a stream above
  the window the server states or a size it refused (:func:`stream_answered`).
  The working limit is a guess, not a statement: nothing states it, so it is
  kept in memory only;
* **whose lesson** — the proxy keeps what overflow errors taught, and the
  ratio, per caller: one caller's errors and counts are that caller's (their
  content, their key's tier), and reach another caller only when
  :data:`AGREEING_CALLERS` callers agree (:func:`agreed_window`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
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
#: Ollama versions) shows a tenth of the prompt, one whose chat format drops
#: the tool messages two thirds of it; clamped to the bounds, such samples
#: would still pull the ratio down to its floor, answer after answer. No
#: tokenizer in use counts a fifth less than ours.
PLAUSIBLE_SAMPLES = (MIN_RATIO, MAX_RATIO * 2)
#: Windows an overflow error may teach: below the smallest models in use,
#: above any model's window, a stated figure is a misreading or a lie.
WINDOW_BOUNDS = (512, 10_000_000)
#: After an empty stream taken for an overflow, the working limit is this
#: share of what failed: far enough below it that the retry fits a window
#: anywhere above, near enough that a session which has just outgrown the
#: window keeps most of it.
EMPTY_STREAM_SHRINK = 0.75
#: Never a working limit below this, and never an overflow for a request this
#: small: the smallest window local servers start with (llama-cpp-python's
#: default ``n_ctx``) — an empty answer to less is the server's own failure.
EMPTY_STREAM_MIN_LIMIT = 2_048
#: Callers whose own lessons must agree before they apply to a caller that
#: learned nothing itself: one caller (or two, the same person with a second
#: key) cannot move another's window or ratio.
AGREEING_CALLERS = 3


def clamp_ratio(ratio: float) -> float:
    return min(max(ratio, MIN_RATIO), MAX_RATIO)


def ratio_sample(upstream_tokens: int, estimate: int) -> float | None:
    """The ratio one answer shows, or ``None`` when it is too small to tell or
    inconsistent with what was sent (beyond :data:`PLAUSIBLE_SAMPLES`): below
    it the upstream counted less than the text it was sent holds, and taking
    that would pull the ratio down to its floor and send the next requests
    uncompacted."""
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


def agreed_window(windows: Collection[int]) -> int | None:
    """The window :data:`AGREEING_CALLERS` callers' overflow errors agree on, given
    the window each caller learned: the largest that at least that many found
    the window at or below (``None`` while fewer learned one). One caller's
    window, however small, moves it no further than the next caller's."""
    if len(windows) < AGREEING_CALLERS:
        return None
    return sorted(windows)[AGREEING_CALLERS - 1]


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


@dataclass(frozen=True)
class EmptyStream:
    """A streamed answer that ended before its first event, and what is known
    of the upstream and model it came from. Every figure counts tokens as the
    upstream does (our estimate × the ratio)."""

    #: The request that got it.
    tokens: int
    #: The largest prompt answered so far (:func:`proven_floor`).
    answered: int
    #: The working limit so far; ``None``: none.
    limit: int | None = None


@dataclass(frozen=True)
class EmptyStreamLesson:
    """What an empty stream teaches."""

    #: Taken for an overflow: retry once, compacted under ``limit``.
    overflow: bool
    #: The working limit from now on (``None``: none): the context window of
    #: every request to that upstream and model is at most this.
    limit: int | None


def empty_stream_lesson(stream: EmptyStream) -> EmptyStreamLesson:
    """The lesson of ``stream``.

    At or below a size already answered (or :data:`EMPTY_STREAM_MIN_LIMIT`) an
    empty stream is not an overflow — something else is wrong, and nothing is
    learned. Above it, the working limit narrows to ::

        max(floor, min(limit, ⌊tokens × EMPTY_STREAM_SHRINK⌋))
        floor = max(answered, EMPTY_STREAM_MIN_LIMIT)

    below what failed, never below what was answered: one request can narrow
    it for every conversation on the model (it is fed by sizes only), but no
    request can push it under a prompt the upstream has answered.
    """
    floor = max(stream.answered, EMPTY_STREAM_MIN_LIMIT)
    if stream.tokens <= floor:
        return EmptyStreamLesson(overflow=False, limit=stream.limit)
    narrowed = math.floor(stream.tokens * EMPTY_STREAM_SHRINK)
    if stream.limit is not None:
        narrowed = min(narrowed, stream.limit)
    return EmptyStreamLesson(overflow=True, limit=max(floor, narrowed))


def working_limit_after_answer(limit: int | None, answered: int) -> int | None:
    """The working limit once a prompt of ``answered`` tokens was answered: an
    answer above it proves the guess wrong there, so it never sits below one."""
    return None if limit is None else max(limit, answered)


def stream_answered(streamed: int, tokens: int, ceiling: int | None) -> int:
    """The largest streamed prompt answered, once one of ``tokens`` (our
    estimate) began to be answered, when the server states a window of
    ``ceiling`` or refused a prompt that large (``None``: neither). An estimate
    above it is inconsistent with what the server said — it answered less than
    was sent (a chat format that drops tool messages) — and proves nothing: it
    must not raise the working limit past the window."""
    if ceiling is not None and tokens > ceiling:
        return streamed
    return max(streamed, tokens)
