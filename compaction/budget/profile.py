"""What the pipeline needs to know about a model: its :class:`Profile`.

Pure data: ``config/`` builds a :class:`Profile` from TOML, environment and
the built-in model table; the proxy and the CLI hand it to
:func:`compaction.compact`. A request's budget made of it is
:mod:`compaction.budget.calibrated`'s.

Each :class:`Profile` field is declared once, here: its type, its default, and
in its metadata a one-line ``"description"`` and the ``"bounds"`` its value
must lie in (``None`` when any value of the type will do; ``None`` itself is
always allowed for an optional field). ``config/`` derives the [compaction]
and [models."…"] settings and the settings table of docs/configuration.md from these
declarations.

"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from compaction.budget.pricing import PRICING_PRESETS, Prices, PricingPreset, preset_for, priced
from compaction.types import Strategy, SummarizerMode

DEFAULT_CONTEXT_WINDOW = 32_000
DEFAULT_RESERVE_TOKENS = 16_384
DEFAULT_KEEP_RECENT_TOKENS = 20_000
DEFAULT_HEAD_COUNT = 2
DEFAULT_IMAGE_TOKENS = 1_600
#: Share of the input limit left free because the token estimate can be off
#: even after calibration to the upstream's own count.
DEFAULT_SAFETY_MARGIN = 0.02

# Pruner thresholds (characters).
DEFAULT_TOOL_RESULT_CHARS = 500
DEFAULT_TOOL_ARGS_CHARS = 2_000
#: The agent's own reasoning is where its next turns' names and line numbers
#: were written: cut only past this size (a tool output is briefed far sooner).
DEFAULT_ASSISTANT_TEXT_CHARS = 8_000
DEFAULT_ASSISTANT_KEEP_START = 800
DEFAULT_ASSISTANT_KEEP_END = 400

#: A compaction by the trigger stops after pruning only when pruning brought
#: the request to this share of the trigger: a prune that leaves little room
#: would be followed by another compaction a turn or two later.
DEFAULT_PRUNE_TARGET = 0.7
#: The compaction plan (:mod:`compaction.budget.plan`) may pay this share more per
#: turn than the deepest compaction would, to keep more of the conversation.
#: Chosen on the replay benchmark (docs/benchmarks.md#replay-what-whole-sessions-cost)
#: together with the tail's share of the fill and the ledger's share.
DEFAULT_PLAN_SLACK = 0.3
#: The most tokens the plan keeps where its floor is lower: an agent's working
#: set, which does not grow with the window (chosen on the replay benchmark at 32k).
DEFAULT_PLAN_WORKING_SET = 8_000

#: With the llm summarizer, the summary the next compaction needs is prepared
#: in the background once a request passes this share of its trigger, so that
#: the turn crossing the trigger does not wait for a model (docs/compaction.md,
#: "The `llm` summarizer") — until the summary's time and the session's pace
#: are measured: then as many turns before the trigger as a summary takes.
DEFAULT_PRECOMPUTE_SHARE = 0.8

#: How the middle is made smaller (see :mod:`compaction.stages.strategies`).
DEFAULT_STRATEGY: Strategy = "summary"

# Condenser.
DEFAULT_SUMMARY_RATIO = 0.20
DEFAULT_SUMMARY_MIN_TOKENS = 500
DEFAULT_SUMMARY_MAX_TOKENS = 4_000
DEFAULT_SUMMARY_TOOL_RESULT_CHARS = 2_000
#: The ledger's share of the summary budget (its file lists aside): the errors,
#: commands, identifiers and user messages it quotes verbatim
#: (:mod:`compaction.summary.ledger`); the prose gets the rest. The names and
#: commands it quotes are what the agent's next turns use; prose mostly retells them.
DEFAULT_LEDGER_SHARE = 0.8

# Recall (compaction.chat.recall): the model reads back what compaction shortened.
#: Rounds of recall calls answered for one request before the answer is taken as it is.
DEFAULT_RECALL_ROUNDS = 3
#: Characters of an original one recall call returns (whole lines); the model asks for more.
DEFAULT_RECALL_SLICE_CHARS = 12_000
#: Tokens the recall rounds may add to one request (answers and the model's turns).
DEFAULT_RECALL_MAX_TOKENS = 24_000

#: Tool names (or substrings of them) that read files or modify them. A tool
#: whose name contains one of the "modify" words counts as modifying; otherwise
#: one containing a "read" word counts as reading. Shell commands are looked at
#: too (``cat x`` reads, ``sed -i`` / ``> x`` modify); see :mod:`compaction.summary.files`
#: and :mod:`compaction.text.shell`.
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
class Bounds:
    """The range a numeric :class:`Profile` field must lie in; ``None`` leaves a side open.

    The names are pydantic's (``Field(gt=…)``), so ``config/`` passes them on as they are.
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def holds(self, value: float) -> bool:
        return not (
            (self.gt is not None and value <= self.gt)
            or (self.ge is not None and value < self.ge)
            or (self.lt is not None and value >= self.lt)
            or (self.le is not None and value > self.le)
        )

    def requirement(self) -> str:
        """What an error says the value must do: "be positive", "be in (0, 1]"."""
        if self.lt is None and self.le is None and (self.gt, self.ge) in ((0, None), (None, 0)):
            return "be positive" if self.gt == 0 else "not be negative"
        low, high = "(-inf", "inf)"
        if self.gt is not None or self.ge is not None:
            low = f"({self.gt}" if self.gt is not None else f"[{self.ge}"
        if self.lt is not None or self.le is not None:
            high = f"{self.lt})" if self.lt is not None else f"{self.le}]"
        return f"be in {low}, {high}"


POSITIVE = Bounds(gt=0)
NON_NEGATIVE = Bounds(ge=0)
RATIO = Bounds(gt=0, le=1)  #: a share: above 0, at most all of it


def _about(description: str, bounds: Bounds | None = None) -> dict[str, Any]:
    """The metadata of a Profile field: a one-line description and its bounds."""
    return {"description": description, "bounds": bounds}


@dataclass(frozen=True)
class Profile:
    """Every tunable of the pipeline for one model. Defaults are the design's."""

    context_window: int = field(
        default=DEFAULT_CONTEXT_WINDOW,
        metadata=_about(
            "Context window in tokens, for models the built-in table does not know.", POSITIVE
        ),
    )
    reserve_tokens: int = field(
        default=DEFAULT_RESERVE_TOKENS,
        metadata=_about(
            "Tokens kept free for the reply (at most a quarter of the window).", NON_NEGATIVE
        ),
    )
    keep_recent_tokens: int = field(
        default=DEFAULT_KEEP_RECENT_TOKENS,
        metadata=_about(
            "Newest tokens kept verbatim (at most half the input limit).", NON_NEGATIVE
        ),
    )
    threshold: int | None = field(
        default=None,
        metadata=_about(
            "Absolute trigger in tokens; compaction starts above min(threshold, limit).", POSITIVE
        ),
    )
    head_count: int = field(
        default=DEFAULT_HEAD_COUNT,
        metadata=_about(
            "Leading messages never compacted (extended over leading system messages).",
            NON_NEGATIVE,
        ),
    )
    summarizer: SummarizerMode = field(
        default="llm", metadata=_about("How the middle is summarized: llm, extractive or off.")
    )
    strategy: Strategy = field(
        default=DEFAULT_STRATEGY,
        metadata=_about(
            "How the middle is made smaller: summary (prune, then condense), mask (hide old "
            "tool outputs, never summarize) or hybrid (mask, condense only if not enough)."
        ),
    )
    image_tokens: int = field(
        default=DEFAULT_IMAGE_TOKENS,
        metadata=_about("Tokens counted for each image.", NON_NEGATIVE),
    )
    safety_margin: float = field(
        default=DEFAULT_SAFETY_MARGIN,
        metadata=_about(
            "Share of the input limit kept free for the error of the token estimate "
            "(on top of calibration to the upstream's own count).",
            Bounds(ge=0, lt=0.5),
        ),
    )

    tool_result_chars: int = field(
        default=DEFAULT_TOOL_RESULT_CHARS,
        metadata=_about("Pruner: tool results longer than this become a one-line brief.", POSITIVE),
    )
    tool_args_chars: int = field(
        default=DEFAULT_TOOL_ARGS_CHARS,
        metadata=_about("Pruner: tool-call arguments longer than this are shortened.", POSITIVE),
    )
    assistant_text_chars: int = field(
        default=DEFAULT_ASSISTANT_TEXT_CHARS,
        metadata=_about("Pruner: assistant text longer than this is cut in the middle.", POSITIVE),
    )
    assistant_keep_start: int = field(
        default=DEFAULT_ASSISTANT_KEEP_START,
        metadata=_about(
            "Pruner: characters kept from the start of cut assistant text.", NON_NEGATIVE
        ),
    )
    assistant_keep_end: int = field(
        default=DEFAULT_ASSISTANT_KEEP_END,
        metadata=_about(
            "Pruner: characters kept from the end of cut assistant text.", NON_NEGATIVE
        ),
    )
    prune_target: float = field(
        default=DEFAULT_PRUNE_TARGET,
        metadata=_about(
            "The most a compaction leaves, as a share of the trigger: pruning alone ends it "
            "only below the plan's fill, which never exceeds this; otherwise the oldest "
            "span is condensed, to leave room for later turns.",
            RATIO,
        ),
    )

    summary_must_pay: bool = field(
        default=True,
        metadata=_about(
            "With the llm summarizer, ask the model only where its summary costs no more "
            "than half the cache reads the compaction saves until the next one; otherwise "
            "the extractive summary is used (false: always ask the model)."
        ),
    )
    plan_slack: float = field(
        default=DEFAULT_PLAN_SLACK,
        metadata=_about(
            "How much more per turn (a share of the cheapest) the compaction plan may spend "
            "to keep more of the conversation: 0 compacts as deep as is cheapest, "
            "prune_target caps the fill (docs/compaction.md#the-plan).",
            Bounds(ge=0, le=10),
        ),
    )
    plan_working_set: int = field(
        default=DEFAULT_PLAN_WORKING_SET,
        metadata=_about(
            "The most tokens a compaction plans to keep where its floor is lower: what an "
            "agent uses next does not grow with the window, so a large one compacts deeper "
            "and more rarely; 0: no such bound (docs/compaction.md#the-plan).",
            NON_NEGATIVE,
        ),
    )

    precompute_share: float = field(
        default=DEFAULT_PRECOMPUTE_SHARE,
        metadata=_about(
            "With the llm summarizer, the next summary is prepared in the background once a "
            "request passes this share of the trigger, until a summary's time and the "
            "session's pace are measured (then as many turns before the trigger as a summary "
            "takes); 0 turns that off.",
            Bounds(ge=0, lt=1),
        ),
    )

    summary_ratio: float = field(
        default=DEFAULT_SUMMARY_RATIO,
        metadata=_about("Summary budget as a share of the middle's tokens.", RATIO),
    )
    summary_min_tokens: int = field(
        default=DEFAULT_SUMMARY_MIN_TOKENS,
        metadata=_about("Lower bound of the summary budget.", POSITIVE),
    )
    summary_max_tokens: int = field(
        default=DEFAULT_SUMMARY_MAX_TOKENS,
        metadata=_about("Upper bound of the summary budget.", POSITIVE),
    )
    ledger_share: float = field(
        default=DEFAULT_LEDGER_SHARE,
        metadata=_about(
            "Share of the summary budget for the ledger after the prose: the newest error "
            "lines, commands, identifiers and user messages, verbatim; 0 keeps the file lists "
            "only.",
            Bounds(ge=0, lt=1),
        ),
    )
    summary_tool_result_chars: int = field(
        default=DEFAULT_SUMMARY_TOOL_RESULT_CHARS,
        metadata=_about("Tool results are cut to this length for the summarizer.", POSITIVE),
    )
    #: ``None`` means the chat model's own. A middle whose prompt would not fit
    #: is summarized in chunks.
    summarizer_context_window: int | None = field(
        default=None,
        metadata=_about("Window of the summary model, if smaller than the chat model's.", POSITIVE),
    )

    recall: bool = field(
        default=True,
        metadata=_about(
            "Add the compaction_recall tool to tool-using requests forwarded over a "
            "compaction, and answer its calls from the request's own history; the briefs "
            "and ledger entries of shortened content then carry a [ref: …] to read it by."
        ),
    )
    recall_rounds: int = field(
        default=DEFAULT_RECALL_ROUNDS,
        metadata=_about(
            "Recall: rounds of compaction_recall calls answered for one request.",
            Bounds(ge=1, le=8),
        ),
    )
    recall_slice_chars: int = field(
        default=DEFAULT_RECALL_SLICE_CHARS,
        metadata=_about(
            "Recall: characters of the original one call returns (whole lines; the model "
            "is told how to ask for the rest).",
            Bounds(ge=500, le=200_000),
        ),
    )
    recall_max_tokens: int = field(
        default=DEFAULT_RECALL_MAX_TOKENS,
        metadata=_about(
            "Recall: tokens the rounds may add to one request (the answers and the model's "
            "turns that called the tool), within the room left under the input limit.",
            Bounds(ge=1_000, le=1_000_000),
        ),
    )

    pricing: PricingPreset = field(
        default="auto",
        metadata=_about(
            "Prompt-cache prices the compaction plan and the cost figures use: auto, "
            "anthropic, openai, local or none (docs/compaction.md#what-a-compaction-costs)."
        ),
    )
    cache_read_price: float | None = field(
        default=None,
        metadata=_about(
            "A cached prompt token's price as a multiple of a plain input token's "
            "(unset: the preset's).",
            NON_NEGATIVE,
        ),
    )
    cache_write_price: float | None = field(
        default=None,
        metadata=_about(
            "A prompt token written to the cache, as a multiple of a plain input token "
            "(unset: the preset's).",
            NON_NEGATIVE,
        ),
    )
    output_price: float | None = field(
        default=None,
        metadata=_about(
            "An output token's price as a multiple of a plain input token's (unset: the preset's).",
            NON_NEGATIVE,
        ),
    )
    cache_lifetime_seconds: float | None = field(
        default=None,
        metadata=_about(
            "Seconds an unused cached prompt lives upstream (unset: the preset's).",
            NON_NEGATIVE,
        ),
    )
    input_price_per_mtok: float | None = field(
        default=None,
        metadata=_about(
            "US dollars per million plain input tokens, to show costs in dollars (unset: "
            "costs are shown in input-token equivalents).",
            NON_NEGATIVE,
        ),
    )

    read_tools: tuple[str, ...] = field(
        default=DEFAULT_READ_TOOLS,
        metadata=_about("Tool-name words that mean a file was read (for the file lists)."),
    )
    modify_tools: tuple[str, ...] = field(
        default=DEFAULT_MODIFY_TOOLS,
        metadata=_about("Tool-name words that mean a file was modified (for the file lists)."),
    )

    @property
    def prepares_ahead(self) -> bool:
        """Whether its compactions are prepared in the background: the llm
        summarizer (the others never make a turn wait), a strategy that
        summarizes (``mask`` never does) and a ``precompute_share``."""
        return self.summarizer == "llm" and self.strategy != "mask" and self.precompute_share > 0

    def prices(self, *, api: str = "chat", host: str = "") -> Prices:
        """The prices of the upstream at ``host`` for the ``api`` the request
        speaks: the preset (``auto`` resolved), with the fields set here."""
        return priced(
            preset_for(self.pricing, api=api, host=host),
            cache_read=self.cache_read_price,
            cache_write=self.cache_write_price,
            output=self.output_price,
            cache_lifetime=self.cache_lifetime_seconds,
            input_per_mtok=self.input_price_per_mtok,
        )

    def __post_init__(self) -> None:
        for declared in fields(self):
            bounds: Bounds | None = declared.metadata["bounds"]
            value = getattr(self, declared.name)
            if bounds is not None and value is not None and not bounds.holds(value):
                raise ValueError(f"{declared.name} must {bounds.requirement()}, got {value}")
        if self.summary_max_tokens < self.summary_min_tokens:
            raise ValueError("summary_max_tokens must be at least summary_min_tokens")
        if self.assistant_keep_start + self.assistant_keep_end >= self.assistant_text_chars:
            raise ValueError(
                "assistant_keep_start + assistant_keep_end must be below assistant_text_chars"
            )
        if self.summarizer not in ("llm", "extractive", "off"):
            raise ValueError(f"summarizer must be llm, extractive or off, got {self.summarizer!r}")
        if self.pricing not in PRICING_PRESETS:
            raise ValueError(
                f"pricing must be one of {', '.join(PRICING_PRESETS)}, got {self.pricing!r}"
            )
        if self.strategy not in ("summary", "mask", "hybrid"):
            raise ValueError(f"strategy must be summary, mask or hybrid, got {self.strategy!r}")
