"""What one summary message may take and how it is put together.

:func:`summary_budget` is the summarizer's ``max_tokens`` for a span;
:class:`Shape` renders the span's ledger within that budget, leaves the rest
to the prose and wraps both in the summary message, cut to the cap its
tokens must fit (:mod:`compaction.summary.format`).
"""

from __future__ import annotations

from dataclasses import dataclass

from compaction.budget.profile import Profile
from compaction.errors import SummarizationError
from compaction.summary.files import render_file_lists
from compaction.summary.format import summary_message
from compaction.summary.ledger import Ledger, render_ledger
from compaction.tokens.counter import TokenCounter, fit_tokens
from compaction.types import Message

#: The model is not asked for a summary of fewer tokens than this: the prose
#: left beside the ledger and the file lists would not hold the sections.
MODEL_REPLY_FLOOR = 200


def summary_budget(tokens: int, profile: Profile, *, turn_prefix: bool = False) -> int:
    """The summarizer's ``max_tokens``: a share of what is replaced, clamped.

    A turn-prefix summary only bridges to the steps that follow, so its
    ceiling is half the main one.
    """
    ceiling = profile.summary_max_tokens
    if turn_prefix:
        ceiling = max(profile.summary_min_tokens, ceiling // 2)
    return min(max(round(tokens * profile.summary_ratio), profile.summary_min_tokens), ceiling)


@dataclass
class Shape:
    """How one summary message is put together: its heading's count, the rendered
    ledger once the budget is known, and the cap its tokens must fit."""

    condensed: int
    turn_prefix: bool
    cap: int | None
    counter: TokenCounter
    rendered: str = ""

    def wrap(self, body: str, blocks: str) -> Message:
        return summary_message(
            body, condensed=self.condensed, ledger=blocks, turn_prefix=self.turn_prefix
        )

    def prose_budget(
        self, budget: int, ledger: Ledger, profile: Profile, *, asks_model: bool
    ) -> int:
        """What is left of ``budget`` for the prose once the ledger is rendered.

        The ledger takes its share of the budget; the prose the rest — but a
        model's prose is what is paid for, and the ledger leaves it room to be
        asked when the budget has it.
        """
        lists = render_file_lists(ledger.files)
        if self.cap is not None:
            frame = self.counter.count_message(self.wrap("", lists))
            budget = max(min(budget, self.cap - frame), 1)
        ledger_budget = round(budget * profile.ledger_share)
        if asks_model and budget >= 2 * MODEL_REPLY_FLOOR:
            ledger_budget = min(ledger_budget, budget - MODEL_REPLY_FLOOR)
        self.rendered = render_ledger(ledger, ledger_budget, self.counter)
        taken = self.counter.count_text(self.rendered) - self.counter.count_text(lists)
        return max(budget - taken, 1)

    def fitted(self, body: str) -> Message:
        """The summary message of ``body``, its prose cut to fit the cap."""
        message = self.wrap(body, self.rendered)
        if self.cap is not None and self.counter.count_message(message) > self.cap:
            frame = self.counter.count_message(self.wrap("", self.rendered))
            body = fit_tokens(body, max(self.cap - frame, 0), self.counter)
            message = self.wrap(body, self.rendered)
        if not body.strip() and not self.rendered.strip():
            # A header over nothing would claim the span was summarized
            # when it was dropped; truncation says so instead.
            raise SummarizationError(f"no room for a summary of {self.condensed} messages")
        return message
