"""compaction: keep a chat conversation inside a model's context window.

A pure library: no HTTP server, no settings files, no clocks, no ids. The
summarizer is injected as an async callable, so everything here runs and
tests without a network::

    result = await compaction.compact(request_body, compaction.Profile(context_window=8192))
    body = {**request_body, "messages": result.messages}

A caller that keeps state between requests (the proxy) uses the three steps
``compact`` is made of — read once, decide, execute — and stores checkpoints
in between::

    conversation = read_conversation(body, messages, counter, profile.head_count)
    decision = decide(conversation, profile, budget, stored=checkpoints_on_its_chain)
    result = await execute(conversation, decision, summarizer)

Everything a caller may use is named in ``__all__``.
"""

from compaction.budget.calibrated import (
    Budget,
    RetryBudget,
    calibrated_budget,
    compute_budget,
    requested_output_tokens,
    retry_budget,
)
from compaction.budget.lessons import (
    WINDOW_BOUNDS,
    EmptyStream,
    EmptyStreamLesson,
    OverflowReport,
    WindowLesson,
    agreed_window,
    credible_report,
    empty_stream_lesson,
    proven_floor,
    ratio_sample,
    stream_answered,
    window_to_learn,
    working_limit_after_answer,
)
from compaction.budget.plan import Depth, Pace
from compaction.budget.pricing import PRICING_PRESETS, Prices
from compaction.budget.profile import Bounds, Profile
from compaction.chat.calls import key_argument
from compaction.chat.groups import (
    PairingProblem,
    group_messages,
    repair_tool_pairing,
    validate_tool_pairing,
)
from compaction.chat.messages import (
    OPAQUE_KEY,
    call_name_and_arguments,
    check_messages,
    message_text,
    tool_calls,
)
from compaction.chat.own import SUMMARY_MARKER, is_summary
from compaction.chat.recall import (
    RECALL_TOOL_DESCRIPTION,
    RECALL_TOOL_NAME,
    RECALL_TOOL_PARAMETERS,
    REF_PATTERN,
    RecallRequest,
    find_original,
    mark,
    parse_request,
    recalled_text,
    ref_of,
)
from compaction.chat.typed import first_typed, system_texts, typed_text
from compaction.conversation.checkpoints import Checkpoint, session_key
from compaction.conversation.incremental import DEFAULT_READING_CACHE_BYTES, ReadingCache
from compaction.conversation.reading import Conversation, read_conversation, read_conversation_async
from compaction.conversation.regions import head_end, tail_start
from compaction.conversation.rereads import NO_REREADS, Rereads, count_rereads
from compaction.errors import (
    CannotFitError,
    CompactionError,
    InvalidMessagesError,
    SummarizationError,
)
from compaction.stages.decide import (
    Decision,
    Steering,
    ahead,
    decide,
    made_progress,
    steering_can_matter,
)
from compaction.stages.execute import execute
from compaction.stages.pipeline import compact
from compaction.stages.results import CompactionResult, Span, forwarded, new_checkpoint
from compaction.summary.format import SummaryParts, parse_summary, with_body
from compaction.summary.ledger import Ledger, ledger_of, parse_ledger, render_ledger
from compaction.tokens.calibration import Calibration, agreed_ratio, calibrate, restored_calibration
from compaction.tokens.counter import (
    ORIGIN_KEY,
    TokenCounter,
    encoding_for_model,
    splits_digits,
    text_size,
)
from compaction.tokens.encodings import load_encoding
from compaction.types import Message, Reason, Stage, Strategy, Summarizer, SummarizerMode

__all__ = [
    "DEFAULT_READING_CACHE_BYTES",
    "NO_REREADS",
    "OPAQUE_KEY",
    "ORIGIN_KEY",
    "PRICING_PRESETS",
    "RECALL_TOOL_DESCRIPTION",
    "RECALL_TOOL_NAME",
    "RECALL_TOOL_PARAMETERS",
    "REF_PATTERN",
    "SUMMARY_MARKER",
    "WINDOW_BOUNDS",
    "Bounds",
    "Budget",
    "Calibration",
    "CannotFitError",
    "Checkpoint",
    "CompactionError",
    "CompactionResult",
    "Conversation",
    "Decision",
    "Depth",
    "EmptyStream",
    "EmptyStreamLesson",
    "InvalidMessagesError",
    "Ledger",
    "Message",
    "OverflowReport",
    "Pace",
    "PairingProblem",
    "Prices",
    "Profile",
    "ReadingCache",
    "Reason",
    "RecallRequest",
    "Rereads",
    "RetryBudget",
    "Span",
    "Stage",
    "Steering",
    "Strategy",
    "SummarizationError",
    "Summarizer",
    "SummarizerMode",
    "SummaryParts",
    "TokenCounter",
    "WindowLesson",
    "agreed_ratio",
    "agreed_window",
    "ahead",
    "calibrate",
    "calibrated_budget",
    "call_name_and_arguments",
    "check_messages",
    "compact",
    "compute_budget",
    "count_rereads",
    "credible_report",
    "decide",
    "empty_stream_lesson",
    "encoding_for_model",
    "execute",
    "find_original",
    "first_typed",
    "forwarded",
    "group_messages",
    "head_end",
    "is_summary",
    "key_argument",
    "ledger_of",
    "load_encoding",
    "made_progress",
    "mark",
    "message_text",
    "new_checkpoint",
    "parse_ledger",
    "parse_request",
    "parse_summary",
    "proven_floor",
    "ratio_sample",
    "read_conversation",
    "read_conversation_async",
    "recalled_text",
    "ref_of",
    "render_ledger",
    "repair_tool_pairing",
    "requested_output_tokens",
    "restored_calibration",
    "retry_budget",
    "session_key",
    "splits_digits",
    "steering_can_matter",
    "stream_answered",
    "system_texts",
    "tail_start",
    "text_size",
    "tool_calls",
    "typed_text",
    "validate_tool_pairing",
    "window_to_learn",
    "with_body",
    "working_limit_after_answer",
]
