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
    first messages, with the rest of the request; ``"newest group"``: the
    latest message group even after cutting it; ``"output"``: the output the
    request asks for, which leaves its input no room in the window) and
    ``tokens`` is that part's own size; ``room`` is what the limit leaves for
    it. The message says so in words the proxy can show the user as they are.
    """

    def __init__(
        self, part: str, tokens: int, limit: int, *, room: int | None = None, detail: str = ""
    ) -> None:
        self.part = part
        self.tokens = tokens
        self.limit = limit
        self.room = limit if room is None else room
        #: The context window, for an ``"output"`` that takes it whole (else 0).
        self.window = 0
        where = (
            f"above the input limit of {limit:,} tokens"
            if self.room == limit
            else f"above the {self.room:,} tokens the input limit of {limit:,} leaves for it"
        )
        super().__init__(f"the {part}{detail} is {tokens:,} tokens, {where}")

    @classmethod
    def output(cls, requested: int, window: int, limit: int) -> CannotFitError:
        """The output the request asks for (``requested`` tokens, which set the
        budget's reserve) leaves no input room in ``window``: ``limit``, the
        input limit, is at or below zero, so nothing the request holds can fit
        however it is compacted."""
        error = cls("output", requested, limit)
        error.window = window
        error.args = (
            f"it asks for up to {requested:,} output tokens of a {window:,}-token window, "
            "which leaves no room for its input",
        )
        return error

    @classmethod
    def head(cls, messages: int, rest: int, limit: int) -> CannotFitError:
        """The head's messages (``messages`` tokens) with the rest of the request
        (tool schemas, ``response_format``, reply priming: ``rest``) exceed ``limit``."""
        detail = f" (its messages {messages:,} tokens, tool schemas and other fields {rest:,})"
        return cls("head", messages + rest, limit, detail=detail)


class SummarizationError(CompactionError):
    """The summarizer failed, or its reply cannot serve as a summary."""


class InvalidMessagesError(CompactionError):
    """``messages`` is not a list of message objects; ``where`` points at the culprit."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")
