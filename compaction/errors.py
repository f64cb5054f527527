"""Errors raised by the compaction library.

CompactionError
 ├── CannotFitError         the conversation cannot be brought under the limit
 ├── SummarizationError     a summarizer failed or returned something unusable
 └── InvalidMessagesError   the input is not a list of chat messages
"""

from __future__ import annotations


class CompactionError(Exception):
    """Base class of every error this library raises on purpose."""


class CannotFitError(CompactionError):
    """Even the parts that are never dropped exceed the input limit.

    ``part`` names what is too large (``"head"``: the system prompt and the
    first messages; ``"newest group"``: the latest message group even after
    cutting it), so that the proxy can tell the user which part to shorten.
    """

    def __init__(self, part: str, tokens: int, limit: int) -> None:
        self.part = part
        self.tokens = tokens
        self.limit = limit
        super().__init__(
            f"the {part} alone is {tokens:,} tokens, above the input limit of {limit:,} tokens"
        )


class SummarizationError(CompactionError):
    """The summarizer failed, or its reply cannot serve as a summary."""


class InvalidMessagesError(CompactionError):
    """``messages`` is not a list of message objects; ``where`` points at the culprit."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")
