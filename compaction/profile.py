"""What the pipeline needs to know about a model, and the budget arithmetic.

Pure data and pure functions: ``config/`` builds a :class:`Profile` from TOML,
environment and the built-in model table; the proxy and the CLI hand it to
:func:`compaction.compact`.

The budget (DESIGN.md §3)::

    R_eff   = max(min(R, W // 4), requested_output)
    L       = W - R_eff                       input limit: nothing leaves above it
    trigger = min(threshold, L)               compaction starts above this
    tail    = min(keep_recent_tokens, L // 2) kept verbatim, never fills the window
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from compaction.types import SummarizerMode

DEFAULT_CONTEXT_WINDOW = 32_000
DEFAULT_RESERVE_TOKENS = 16_384
DEFAULT_KEEP_RECENT_TOKENS = 20_000
DEFAULT_HEAD_COUNT = 2
DEFAULT_IMAGE_TOKENS = 1_600

# Pruner thresholds (characters).
DEFAULT_TOOL_RESULT_CHARS = 500
DEFAULT_TOOL_ARGS_CHARS = 200
DEFAULT_ASSISTANT_TEXT_CHARS = 2_000
DEFAULT_ASSISTANT_KEEP_START = 800
DEFAULT_ASSISTANT_KEEP_END = 400

#: A compaction by the trigger stops after pruning only when pruning brought
#: the request to this share of the trigger: a prune that leaves little room
#: would be followed by another compaction a turn or two later.
DEFAULT_PRUNE_TARGET = 0.7

# Condenser.
DEFAULT_SUMMARY_RATIO = 0.20
DEFAULT_SUMMARY_MIN_TOKENS = 500
DEFAULT_SUMMARY_MAX_TOKENS = 4_000
DEFAULT_SUMMARY_TOOL_RESULT_CHARS = 2_000

#: Tool names (or substrings of them) that read files or modify them. A tool
#: whose name contains one of the "modify" words counts as modifying; otherwise
#: one containing a "read" word counts as reading. Shell commands are looked at
#: too (``cat x`` reads, ``sed -i`` / ``> x`` modify); see :mod:`compaction.files`
#: and :mod:`compaction.shell`.
DEFAULT_READ_TOOLS: tuple[str, ...] = (
    "read",
    "view",
    "cat",
    "open",
    "grep",
    "search",
    "find",
    "list",
    "ls",
    "glob",
    "show",
)
DEFAULT_MODIFY_TOOLS: tuple[str, ...] = (
    "write",
    "edit",
    "create",
    "patch",
    "apply",
    "replace",
    "insert",
    "delete",
    "remove",
    "move",
    "rename",
    "str_replace",
    "update",
)


@dataclass(frozen=True)
class Profile:
    """Every tunable of the pipeline for one model. Defaults are the design's."""

    context_window: int = DEFAULT_CONTEXT_WINDOW
    reserve_tokens: int = DEFAULT_RESERVE_TOKENS
    keep_recent_tokens: int = DEFAULT_KEEP_RECENT_TOKENS
    threshold: int | None = None
    head_count: int = DEFAULT_HEAD_COUNT
    summarizer: SummarizerMode = "llm"
    image_tokens: int = DEFAULT_IMAGE_TOKENS

    tool_result_chars: int = DEFAULT_TOOL_RESULT_CHARS
    tool_args_chars: int = DEFAULT_TOOL_ARGS_CHARS
    assistant_text_chars: int = DEFAULT_ASSISTANT_TEXT_CHARS
    assistant_keep_start: int = DEFAULT_ASSISTANT_KEEP_START
    assistant_keep_end: int = DEFAULT_ASSISTANT_KEEP_END
    prune_target: float = DEFAULT_PRUNE_TARGET

    summary_ratio: float = DEFAULT_SUMMARY_RATIO
    summary_min_tokens: int = DEFAULT_SUMMARY_MIN_TOKENS
    summary_max_tokens: int = DEFAULT_SUMMARY_MAX_TOKENS
    summary_tool_result_chars: int = DEFAULT_SUMMARY_TOOL_RESULT_CHARS
    #: Window of the model that writes summaries; ``None`` means the chat
    #: model's own. A middle whose prompt would not fit is summarized in chunks.
    summarizer_context_window: int | None = None

    read_tools: tuple[str, ...] = DEFAULT_READ_TOOLS
    modify_tools: tuple[str, ...] = DEFAULT_MODIFY_TOOLS

    def __post_init__(self) -> None:
        positive = {
            "context_window": self.context_window,
            "tool_result_chars": self.tool_result_chars,
            "tool_args_chars": self.tool_args_chars,
            "assistant_text_chars": self.assistant_text_chars,
            "summary_min_tokens": self.summary_min_tokens,
            "summary_tool_result_chars": self.summary_tool_result_chars,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        non_negative = {
            "reserve_tokens": self.reserve_tokens,
            "keep_recent_tokens": self.keep_recent_tokens,
            "head_count": self.head_count,
            "image_tokens": self.image_tokens,
            "assistant_keep_start": self.assistant_keep_start,
            "assistant_keep_end": self.assistant_keep_end,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")
        if self.threshold is not None and self.threshold <= 0:
            raise ValueError(f"threshold must be positive, got {self.threshold}")
        if not 0 < self.prune_target <= 1:
            raise ValueError(f"prune_target must be in (0, 1], got {self.prune_target}")
        if not 0 < self.summary_ratio <= 1:
            raise ValueError(f"summary_ratio must be in (0, 1], got {self.summary_ratio}")
        if self.summary_max_tokens < self.summary_min_tokens:
            raise ValueError("summary_max_tokens must be at least summary_min_tokens")
        if self.assistant_keep_start + self.assistant_keep_end >= self.assistant_text_chars:
            raise ValueError(
                "assistant_keep_start + assistant_keep_end must be below assistant_text_chars"
            )
        if self.summarizer not in ("llm", "extractive", "off"):
            raise ValueError(f"summarizer must be llm, extractive or off, got {self.summarizer!r}")


@dataclass(frozen=True)
class Budget:
    """The token figures one request is held to."""

    context_window: int
    reserve: int  #: R_eff
    input_limit: int  #: L
    trigger: int
    tail_budget: int
    requested_output: int = 0


def requested_output_tokens(request: Mapping[str, Any]) -> int:
    """The output the client asked for: ``max_completion_tokens`` or ``max_tokens``."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = request.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def compute_budget(profile: Profile, requested_output: int = 0) -> Budget:
    """Apply DESIGN.md §3 to one request.

    ``L`` can come out at or below zero when the client asks for more output
    than the window holds; the pipeline then reports that the head cannot fit.
    """
    window = profile.context_window
    reserve = max(min(profile.reserve_tokens, window // 4), requested_output)
    limit = window - reserve
    trigger = limit if profile.threshold is None else min(profile.threshold, limit)
    tail = min(profile.keep_recent_tokens, max(limit, 0) // 2)
    return Budget(
        context_window=window,
        reserve=reserve,
        input_limit=limit,
        trigger=trigger,
        tail_budget=tail,
        requested_output=requested_output,
    )
