"""Per-request figures, the sessions they add up to, and per-session steering.

Every forwarded request leaves one :class:`RequestRecord` (sizes, stage,
time; never content), written off the request path by
:class:`proxy.recorder.Recorder`. A store keeps them for
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
from dataclasses import dataclass, field, replace
from typing import Final

#: Per-request figures are kept this long unless configured otherwise.
DEFAULT_REQUESTS_RETENTION_SECONDS: Final = 7 * 86400.0
#: The newest requests kept per session (memory and Redis lists; SQLite keeps
#: every one until the retention).
DEFAULT_SESSION_REQUESTS: Final = 5_000
DEFAULT_REQUESTS_LIMIT: Final = 1_000
DEFAULT_SESSIONS_LIMIT: Final = 1_000
#: Width of a bucket of :meth:`Store.savings`.
SAVINGS_BUCKET_SECONDS: Final = 3600.0
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
    status: int  #: the upstream's, or the proxy's own for ``/compact``
    ms: float
    api: str = "chat"
    summarizer_calls: int = 0
    #: What the upstream reported those calls cost (prompt and reply).
    summarizer_tokens: int = 0
    checkpoint_id: str | None = None
    owner: str = ""
    #: Not a request: a compaction prepared in the background for this session.
    #: Its summarizer calls and tokens count; it is no request and moves no
    #: figure of the context.
    background: bool = False
    created_at: float = field(default_factory=time.time)

    @property
    def compacted(self) -> bool:
        """Whether this request made a compaction (rather than reused or forwarded)."""
        return self.stage not in _QUIET_STAGES

    @property
    def saved(self) -> int:
        return 0 if self.background else max(0, self.tokens_before - self.tokens_after)


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
    #: The latest request's: the context as it stands, and its limits.
    tokens_before: int = 0
    tokens_after: int = 0
    input_limit: int = 0
    trigger: int = 0
    stages: Mapping[str, int] = field(default_factory=dict)  #: compactions by stage
    reasons: Mapping[str, int] = field(default_factory=dict)  #: compactions by reason


@dataclass(frozen=True)
class SessionSettings:
    """What a user set for one conversation."""

    #: False: this session is not compacted (a ``/compact`` still is).
    enabled: bool = True
    #: Added to the built-in summary prompt for this session's next summaries.
    instructions: str = ""
    updated_at: float = 0.0


def fold(summary: SessionSummary | None, records: Iterable[RequestRecord]) -> SessionSummary:
    """``summary`` with ``records`` (of its session, in order) added in.

    ``summary=None`` starts a new one from the first record.
    """
    for record in records:
        if summary is None:
            summary = SessionSummary(
                session=record.session,
                owner=record.owner,
                model=record.model,
                api=record.api,
                first_at=record.created_at,
                last_at=record.created_at,
            )
        summary = replace(
            summary,
            summarizer_calls=summary.summarizer_calls + record.summarizer_calls,
            summarizer_tokens=summary.summarizer_tokens + record.summarizer_tokens,
        )
        if record.background:
            continue
        stages, reasons = dict(summary.stages), dict(summary.reasons)
        if record.compacted:
            stages[record.stage] = stages.get(record.stage, 0) + 1
            reasons[record.reason] = reasons.get(record.reason, 0) + 1
        # The first request of a session first seen through its preparation is its newest.
        newest = summary.requests == 0 or record.created_at >= summary.last_at
        summary = replace(
            summary,
            requests=summary.requests + 1,
            compactions=summary.compactions + record.compacted,
            saved=summary.saved + record.saved,
            upstream_errors=summary.upstream_errors + (record.status >= 400),
            first_at=min(summary.first_at, record.created_at),
            stages=stages,
            reasons=reasons,
        )
        if newest:
            summary = replace(
                summary,
                model=record.model,
                api=record.api,
                last_at=record.created_at,
                tokens_before=record.tokens_before,
                tokens_after=record.tokens_after,
                input_limit=record.input_limit,
                trigger=record.trigger,
            )
    if summary is None:
        raise ValueError("nothing to fold")
    return summary


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
