"""Per-request figures, the sessions they add up to, and per-session steering.

Every forwarded request leaves one :class:`RequestRecord` (sizes, stage,
time; never content), written off the request path by
:class:`proxy.state.recorder.Recorder`. A store keeps them for
``requests_retention_seconds`` and folds them, as they arrive, into one
:class:`SessionSummary` per (owner, session) and into hourly totals of the
tokens saved, so the dashboard reads a thousand sessions without reading a
hundred thousand requests.

:class:`SessionSettings` is what a user set for one conversation: compaction
off, or instructions for its next summary. The proxy reads it only when it is
about to compact (never on a plain forward).

The folding rules live here, once, for every backend: :func:`fold`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

#: Per-request figures are kept this long unless configured otherwise.
DEFAULT_REQUESTS_RETENTION_SECONDS: Final = 7 * 86400.0
#: The newest requests kept per session (memory and Redis lists; SQLite keeps
#: every one until the retention).
DEFAULT_SESSION_REQUESTS: Final = 5_000
DEFAULT_REQUESTS_LIMIT: Final = 1_000
DEFAULT_SESSIONS_LIMIT: Final = 1_000
#: Width of a bucket of :meth:`Store.savings`.
SAVINGS_BUCKET_SECONDS: Final = 3600.0
#: The status recorded for an upstream stream that ended before its first
#: event: an answer that was no answer, as a gateway would call it (502). The
#: record's ``error`` says which (``"upstream_empty"``), and it counts among
#: the upstream errors.
EMPTY_STREAM_STATUS: Final = 502
#: Stages that mean "nothing was compacted by this request".
_QUIET_STAGES: Final = frozenset({"none", "reused", "untouched"})


@dataclass(frozen=True)
class RequestRecord:
    """What one request did to its context: sizes and stage, never content."""

    session: str
    model: str
    stage: str
    reason: str
    tokens_before: int
    tokens_after: int
    input_limit: int
    trigger: int
    #: The upstream's, or the proxy's own for ``/compact``; an upstream stream
    #: that ended before its first event is :data:`EMPTY_STREAM_STATUS`.
    status: int
    ms: float
    api: str = "chat"
    summarizer_calls: int = 0
    #: What the upstream reported those calls cost (prompt and reply).
    summarizer_tokens: int = 0
    checkpoint_id: str | None = None
    owner: str = ""
    #: The model's whole window, in the upstream's tokens (``input_limit`` and
    #: ``trigger`` are the proxy's estimate of what fits in it); 0: not recorded.
    context_window: int = 0
    #: Where that window came from: "override" (a setting), "client" (the
    #: client's long-context beta header), "learned", "table", "default"; "": not recorded.
    window_source: str = ""
    #: Error answers the upstream gave this request: the one it was retried
    #: after (an overflow), an empty stream, the error relayed — as
    #: ``compaction_proxy_upstream_errors_total`` counts them.
    upstream_errors: int = 0
    #: What went wrong when a status cannot say it (``"upstream_empty"``).
    error: str = ""
    #: The first words of the conversation's task and the client's
    #: ``User-Agent``: how its owner tells their sessions apart.
    task: str = ""
    user_agent: str = ""
    #: Tool calls of this request that fetched again what the compaction
    #: applied to it had removed (:func:`compaction.count_rereads`).
    rereads: int = 0
    #: Not a request: a compaction prepared in the background for this session.
    #: Its summarizer calls and tokens count; it is no request and moves no
    #: figure of the context.
    background: bool = False
    #: Whether the answer reported its usage: the four counts below, as the
    #: upstream reported them (``prompt_tokens`` whole, cached parts included).
    priced: bool = False
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    #: The summarizer calls' tokens, part by part (``summarizer_tokens`` is their sum).
    summarizer_prompt_tokens: int = 0
    summarizer_output_tokens: int = 0
    #: In plain input tokens of the model's price: what the answer and the
    #: summarizer calls cost, and the estimate of the client's request sent as
    #: it came (docs/compaction.md, "What a compaction costs").
    cost: float = 0.0
    cost_without: float = 0.0
    #: The same two in US dollars; ``None``: the model's input price is unknown.
    cost_dollars: float | None = None
    cost_without_dollars: float | None = None
    created_at: float = field(default_factory=time.time)

    @property
    def compacted(self) -> bool:
        """Whether this request made a compaction (rather than reused or forwarded)."""
        return self.stage not in _QUIET_STAGES

    @property
    def saved(self) -> int:
        return 0 if self.background else max(0, self.tokens_before - self.tokens_after)

    @property
    def errors(self) -> int:
        """The upstream's error answers to this request (figures written before
        they were counted have only their status to say it)."""
        return max(self.upstream_errors, int(self.status >= 400))


@dataclass(frozen=True)
class SessionSummary:
    """One conversation's requests, added up; the latest request's figures beside."""

    session: str
    owner: str
    model: str
    api: str
    first_at: float
    last_at: float
    requests: int = 0
    compactions: int = 0
    saved: int = 0  #: tokens not sent, over all requests
    summarizer_calls: int = 0
    summarizer_tokens: int = 0
    upstream_errors: int = 0
    #: Requests retried, smaller, after the upstream's context-length error.
    overflow_retries: int = 0
    #: Tool calls that fetched again what a compaction had removed, over all requests.
    rereads: int = 0
    #: The latest request's: the context as it stands, and its limits.
    tokens_before: int = 0
    tokens_after: int = 0
    input_limit: int = 0
    trigger: int = 0
    context_window: int = 0
    window_source: str = ""  #: as :attr:`RequestRecord.window_source`
    stages: Mapping[str, int] = field(default_factory=dict)  #: compactions by stage
    reasons: Mapping[str, int] = field(default_factory=dict)  #: compactions by reason
    #: The task's first words (its first request's), the latest client's user agent.
    task: str = ""
    user_agent: str = ""
    #: Requests whose answer reported its usage, and that usage added up.
    priced_requests: int = 0
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    summarizer_prompt_tokens: int = 0
    summarizer_output_tokens: int = 0
    #: In plain input tokens: the cost (summaries prepared in the background
    #: included) and the estimate without compaction.
    cost: float = 0.0
    cost_without: float = 0.0
    #: The same in US dollars, over the ``dollar_records`` figures priced in dollars.
    cost_dollars: float = 0.0
    cost_without_dollars: float = 0.0
    dollar_records: int = 0

    @property
    def label(self) -> str:
        """A name its owner knows the session by: the task's first words, else
        the client and the model."""
        return self.task or " · ".join(part for part in (self.user_agent, self.model) if part)


@dataclass(frozen=True)
class SessionSettings:
    """What a user set for one conversation."""

    #: False: this session is not compacted (a ``/compact`` still is).
    enabled: bool = True
    #: Added to the built-in summary prompt for this session's next summaries.
    instructions: str = ""
    updated_at: float = 0.0


#: The figures a summary adds up under the record's own names: of every
#: record, and of requests only (not of a compaction prepared in the background).
_SUMS: Final = (
    "summarizer_calls",
    "summarizer_tokens",
    "summarizer_prompt_tokens",
    "summarizer_output_tokens",
    "cost",
    "cost_without",
)
_REQUEST_SUMS: Final = (
    "saved",
    "rereads",
    "prompt_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "output_tokens",
)


def fold(summary: SessionSummary | None, records: Iterable[RequestRecord]) -> SessionSummary:
    """``summary`` with ``records`` (of its session, in order) added in.

    ``summary=None`` starts a new one from the first record.
    """
    # The records are added up in one dict of the summary's fields, and one
    # summary is made of it at the end: a batch folds hundreds of records on
    # the store's thread, beside the event loop.
    values: dict[str, Any] | None = None
    if summary is not None:  # its fields to add to; its counts copied, never changed in place
        values = dict(vars(summary))
        values["stages"], values["reasons"] = dict(summary.stages), dict(summary.reasons)
    for record in records:
        if values is None:
            values = {
                **_EMPTY,
                "session": record.session,
                "owner": record.owner,
                "model": record.model,
                "api": record.api,
                "first_at": record.created_at,
                "last_at": record.created_at,
                "stages": {},
                "reasons": {},
            }
        for name in _SUMS:
            values[name] += getattr(record, name)
        if record.cost_dollars is not None:
            values["cost_dollars"] += record.cost_dollars
            values["cost_without_dollars"] += record.cost_without_dollars or 0.0
            values["dollar_records"] += 1
        if record.background:
            continue
        if record.compacted:
            stages, reasons = values["stages"], values["reasons"]
            stages[record.stage] = stages.get(record.stage, 0) + 1
            reasons[record.reason] = reasons.get(record.reason, 0) + 1
        # The first request of a session first seen through its preparation is its newest.
        newest = values["requests"] == 0 or record.created_at >= values["last_at"]
        for name in _REQUEST_SUMS:
            values[name] += getattr(record, name)
        values["requests"] += 1
        values["compactions"] += record.compacted
        values["upstream_errors"] += record.errors
        values["overflow_retries"] += record.reason == "overflow"
        values["priced_requests"] += record.priced
        values["first_at"] = min(values["first_at"], record.created_at)
        values["task"] = values["task"] or record.task
        if newest:
            values.update(
                model=record.model,
                api=record.api,
                last_at=record.created_at,
                tokens_before=record.tokens_before,
                tokens_after=record.tokens_after,
                input_limit=record.input_limit,
                trigger=record.trigger,
                context_window=record.context_window or values["context_window"],
                window_source=record.window_source or values["window_source"],
                user_agent=record.user_agent or values["user_agent"],
            )
    if values is None:
        raise ValueError("nothing to fold")
    return SessionSummary(**values)


#: A summary's fields before its first record (its stage and reason counts
#: are dicts of its own).
_EMPTY: Final[Mapping[str, Any]] = vars(SessionSummary("", "", "", "", 0.0, 0.0))


def bucket_of(created_at: float) -> float:
    """The start of the :data:`SAVINGS_BUCKET_SECONDS` bucket ``created_at`` is in."""
    return (created_at // SAVINGS_BUCKET_SECONDS) * SAVINGS_BUCKET_SECONDS


def savings_of(records: Iterable[RequestRecord]) -> dict[tuple[str, float], int]:
    """Tokens saved by (owner, bucket), for the records that saved any."""
    found: dict[tuple[str, float], int] = {}
    for record in records:
        if record.saved:
            key = (record.owner, bucket_of(record.created_at))
            found[key] = found.get(key, 0) + record.saved
    return found


def by_session(records: Iterable[RequestRecord]) -> dict[tuple[str, str], list[RequestRecord]]:
    """``records`` grouped by (owner, session), each group in the order given."""
    groups: dict[tuple[str, str], list[RequestRecord]] = {}
    for record in records:
        groups.setdefault((record.owner, record.session), []).append(record)
    return groups
