"""Type aliases shared by the compaction modules."""

from __future__ import annotations

from typing import Any, Literal, Protocol

#: One element of ``messages``, kept as a plain dict so unknown keys survive.
Message = dict[str, Any]

Stage = Literal["none", "reused", "pruned", "masked", "condensed", "truncated"]
Reason = Literal["threshold", "overflow", "manual"]
SummarizerMode = Literal["llm", "extractive", "off"]
#: How the middle is made smaller; see :mod:`compaction.stages.strategies`.
Strategy = Literal["summary", "mask", "hybrid"]

#: Stages ordered from weakest to strongest; the result reports the strongest that ran.
STAGE_ORDER: tuple[Stage, ...] = (
    "none",
    "reused",
    "pruned",
    "masked",
    "condensed",
    "truncated",
)


class Summarizer(Protocol):
    """An LLM call that turns a summarization prompt into text.

    ``messages`` is a complete chat prompt (system + user) built by the
    condenser; ``max_tokens`` is the summary budget. Raise any exception on
    failure: the pipeline falls back to the extractive summary.
    """

    async def __call__(self, messages: list[Message], max_tokens: int) -> str: ...
