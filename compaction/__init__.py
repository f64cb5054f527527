"""compaction: keep a chat conversation inside a model's context window.

A pure library: no HTTP server, no settings files. The summarizer is injected
as an async callable, so everything here runs and tests without a network::

    result = await compaction.compact(request_body, compaction.Profile(context_window=8192))
    body = {**request_body, "messages": result.messages}
"""

from compaction.errors import (
    CannotFitError,
    CompactionError,
    InvalidMessagesError,
    SummarizationError,
)
from compaction.messages import (
    SUMMARY_MARKER,
    PairingProblem,
    repair_tool_pairing,
    validate_tool_pairing,
)
from compaction.pipeline import CompactionResult, compact
from compaction.profile import Budget, Profile, compute_budget, requested_output_tokens
from compaction.tokens import TokenCounter, encoding_for_model
from compaction.types import Message, Reason, Stage, Summarizer, SummarizerMode

__all__ = [
    "SUMMARY_MARKER",
    "Budget",
    "CannotFitError",
    "CompactionError",
    "CompactionResult",
    "InvalidMessagesError",
    "Message",
    "PairingProblem",
    "Profile",
    "Reason",
    "Stage",
    "SummarizationError",
    "Summarizer",
    "SummarizerMode",
    "TokenCounter",
    "compact",
    "compute_budget",
    "encoding_for_model",
    "repair_tool_pairing",
    "requested_output_tokens",
    "validate_tool_pairing",
]
