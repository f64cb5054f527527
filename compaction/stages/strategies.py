"""What the first stage of a compaction does, per strategy (``Profile.strategy``).

Three strategies share the pipeline's frame — the same head, the same verbatim
tail, the same budget, hard truncation as the guarantee — and differ in how
the middle is made smaller:

``summary``
    Today's pipeline, unchanged: prune the middle (long tool results become
    one-line briefs with the first error line, long assistant text and
    arguments are cut), stop there if that brought the request to
    ``prune_target`` × trigger, otherwise condense the middle into one
    summary, then truncate if still above the input limit.

``mask``
    Observation masking: every tool result in the middle (older than the
    verbatim tail) longer than :data:`MASK_MIN_CHARS` is replaced by a
    placeholder; the assistant's own messages — its reasoning and its tool
    calls, arguments included — stay as they were. No summarizer is ever
    called; when the masked request is still above the input limit, hard
    truncation drops the oldest groups.

``hybrid``
    Mask first; when masking alone does not bring the request to
    ``prune_target`` × trigger (or the compaction is manual or an overflow,
    which always condense), condense the masked middle as ``summary`` does,
    then truncate if needed.

The placeholder (:func:`placeholder`) keeps the tool's name, the output's size
in lines and characters, and says that it was hidden and how to see it again::

    [output hidden to save context: bash, 212 lines, 9,431 chars; repeat the call to see it]

With ``Profile.recall`` and a caller's salt, `` [ref: r…]`` follows, the ref
the model reads the output back by (:mod:`compaction.chat.recall`).

It keeps no part of the output on purpose: that is the difference from the
pruner's brief, and the point of masking — the model's own next message,
kept verbatim, already says what it concluded from the output. The name and
size tell the model what it is missing and what re-reading would cost; the
word "hidden" keeps it from reading the placeholder as an empty output. Short
outputs (at most :data:`MASK_MIN_CHARS`) stay whole: they cost little and are
often the very line that mattered (``File edited.``, one error).

Masking a masked conversation changes nothing (a placeholder is shorter than
:data:`MASK_MIN_CHARS`), so the same history always masks to the same bytes,
which keeps upstream prompt caches hitting (docs/state.md). Pure functions;
the input is never mutated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compaction.budget.profile import Profile
from compaction.chat.calls import call_for_result
from compaction.chat.messages import RESULT_ROLES, call_name_and_arguments, message_text
from compaction.chat.own import own
from compaction.chat.recall import brief_ref, mark, ref_of
from compaction.stages.pruner import prune
from compaction.types import Message, Stage, Strategy

STRATEGIES: tuple[Strategy, ...] = ("summary", "mask", "hybrid")

#: Tool results up to this many characters are not masked: a placeholder
#: (~90 characters) would save little, and short outputs are often the line
#: that mattered.
MASK_MIN_CHARS = 200
_NAME_CHARS = 64
PLACEHOLDER_PREFIX = "[output hidden to save context: "


@dataclass(frozen=True)
class Shrunk:
    """The middle after the first stage, and what that stage is called."""

    messages: list[Message]
    stage: Stage
    changed: int


def shrink_middle(
    messages: Sequence[Message], start: int, end: int, profile: Profile, *, salt: str = ""
) -> Shrunk:
    """The first stage of ``profile.strategy`` on messages ``[start, end)``:
    prune for ``summary``, mask for ``mask`` and ``hybrid``; with
    ``profile.recall`` and a ``salt``, each brief or placeholder ends with the
    ref of the output it stands for (:mod:`compaction.chat.recall`)."""
    if profile.strategy == "summary":
        pruned = prune(messages, start, end, profile, salt=salt)
        return Shrunk(pruned.messages, "pruned", pruned.pruned)
    return mask(messages, start, end, salt=salt if profile.recall else "")


def condenses(profile: Profile) -> bool:
    """Whether the strategy may condense the middle into a summary."""
    return profile.strategy != "mask" and profile.summarizer != "off"


def mask(messages: Sequence[Message], start: int, end: int, *, salt: str = "") -> Shrunk:
    """Replace the tool results in ``[start, end)`` longer than
    :data:`MASK_MIN_CHARS` by a placeholder; every other message comes back
    as the same object. With a ``salt``, each placeholder ends with the ref
    of the output it hides."""
    out = list(messages)
    masked = 0
    for i in range(max(start, 0), min(end, len(out))):
        message = messages[i]
        if message.get("role") not in RESULT_ROLES:
            continue
        text = message_text(message)
        if len(text) <= MASK_MIN_CHARS:
            continue
        name, _ = call_name_and_arguments(call_for_result(messages, i) or {})
        hidden = placeholder(name, text)
        if salt:
            hidden = mark(hidden, brief_ref(message) or ref_of(salt, text))
        out[i] = own({**message, "content": hidden})
        masked += 1
    return Shrunk(out, "masked", masked)


def placeholder(name: str, text: str) -> str:
    """What stands for a hidden tool output (see the module docstring)."""
    name = " ".join(name.split())[:_NAME_CHARS] or "tool"
    lines = text.count("\n") + 1
    return (
        f"{PLACEHOLDER_PREFIX}{name}, {lines:,} line{'s' if lines != 1 else ''}, "
        f"{len(text):,} chars; repeat the call to see it]"
    )
