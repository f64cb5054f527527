"""What the dashboard, its JSON routes and the CLI show: read from the store,
as plain frozen data (no HTML, no terminal codes).

    overview = await read_overview(store, viewer)          # /ui, `sessions`
    session = await read_session(store, "3f2a…", viewer)   # /ui/sessions/…, `show`

``viewer`` is the owner whose state is read (``None``: everyone's, the admin
and the CLI), as for the state routes (:mod:`proxy.edge.access`); the admin
reads one owner's session with ``read_session(store, id, None, owner)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Final

from compaction import Checkpoint, Message
from proxy.session.steering import summary_text
from proxy.state.stores import (
    Event,
    FigureStore,
    RequestRecord,
    SessionSettings,
    SessionSummary,
    Store,
)

#: The session page charts this many of the newest requests.
CHART_REQUESTS: Final = 2_000
#: Events and checkpoints listed on the session page.
SESSION_EVENTS: Final = 200
SESSION_CHECKPOINTS: Final = 10
#: An owner is a digest of 32 hex characters; a longer one named in a page's
#: address is refused, as on the JSON routes (:mod:`proxy.api.steering`).
MAX_OWNER_CHARS: Final = 64
#: The newest checkpoints whose originals are read for the page (they can be
#: hundreds of kilobytes each; the JSON route has every one).
ORIGINALS_SHOWN: Final = 3


@dataclass(frozen=True)
class Totals:
    """The overview's sums over the sessions shown."""

    sessions: int
    requests: int
    compactions: int
    saved: int
    summarizer_calls: int
    summarizer_tokens: int
    #: The upstream's error answers (as ``compaction_proxy_upstream_errors_total``
    #: counts those to chat requests: an overflow retried, an empty stream, an
    #: error relayed).
    upstream_errors: int
    overflow_retries: int
    stages: dict[str, int]
    reasons: dict[str, int]
    #: What the answers' usage reported (over ``priced_requests`` of the
    #: requests) and the summarizer calls used, and what it all cost
    #: (:class:`~proxy.state.stores.SessionSummary` has each field).
    money: Money


@dataclass(frozen=True)
class Money:
    """Tokens by part and their price, added up over sessions."""

    priced_requests: int = 0
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    summarizer_prompt_tokens: int = 0
    summarizer_output_tokens: int = 0
    cost: float = 0.0
    cost_without: float = 0.0
    cost_dollars: float = 0.0
    cost_without_dollars: float = 0.0
    dollar_records: int = 0

    @property
    def saved(self) -> float:
        """What compaction saved, in plain input tokens (negative: what it cost)."""
        return self.cost_without - self.cost


def money_of(sessions: Sequence[SessionSummary]) -> Money:
    return Money(**{name: sum(getattr(s, name) for s in sessions) for name in _MONEY})


#: The fields of :class:`Money`, all of them :class:`SessionSummary`'s too.
_MONEY: Final = tuple(field.name for field in fields(Money))


@dataclass(frozen=True)
class Overview:
    sessions: list[SessionSummary]  #: newest first
    totals: Totals
    savings: list[tuple[float, int]]  #: tokens saved per hour, oldest first
    #: Sessions kept for other callers than the viewer, which it may not see
    #: (counted only when asked: only their number is ever shown).
    hidden: int = 0


@dataclass(frozen=True)
class ShownCheckpoint:
    checkpoint: Checkpoint
    summary: str | None  #: the summary's text alone; None when it holds none
    originals: list[Message] | None  #: what it replaced, if kept


@dataclass(frozen=True)
class SessionView:
    session: str
    owner: str
    summary: SessionSummary | None
    requests: list[RequestRecord]  #: oldest first
    events: list[Event]  #: newest first
    checkpoints: list[ShownCheckpoint]  #: newest first
    settings: SessionSettings


def totals_of(sessions: list[SessionSummary]) -> Totals:
    stages: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for summary in sessions:
        stages.update(summary.stages)
        reasons.update(summary.reasons)
    return Totals(
        sessions=len(sessions),
        requests=sum(s.requests for s in sessions),
        compactions=sum(s.compactions for s in sessions),
        saved=sum(s.saved for s in sessions),
        summarizer_calls=sum(s.summarizer_calls for s in sessions),
        summarizer_tokens=sum(s.summarizer_tokens for s in sessions),
        upstream_errors=sum(s.upstream_errors for s in sessions),
        overflow_retries=sum(s.overflow_retries for s in sessions),
        stages=dict(stages.most_common()),
        reasons=dict(reasons.most_common()),
        money=money_of(sessions),
    )


async def read_overview(
    store: FigureStore, viewer: str | None, *, limit: int = 1_000, count_hidden: bool = False
) -> Overview:
    """``count_hidden``: also count the sessions of other callers (the number
    alone), so that a visitor who is not signed in learns there is more to see."""
    sessions = await store.sessions(owner=viewer, limit=limit)
    hidden = 0
    if count_hidden and viewer is not None:
        everyone = await store.session_count()
        hidden = max(everyone - await store.session_count(owner=viewer), 0)
    return Overview(sessions, totals_of(sessions), await store.savings(owner=viewer), hidden)


async def read_session(
    store: Store, session: str, viewer: str | None, owner: str | None = None
) -> SessionView:
    """One session as ``viewer`` may see it.

    Two callers may use one session id, and each one's session is another: a
    caller sees only their own (``owner`` is then theirs or ``None``). The
    admin (``viewer=None``) sees the ``owner`` named — that owner's requests,
    events, checkpoints and settings alone — or, naming none, everything kept
    under the id (the CLI's ``show``) with the settings of its latest owner.
    """
    reader = viewer if viewer is not None else owner
    # The summary first: figures recorded between the reads then show in the
    # requests, never a summary counting requests the list does not hold yet.
    summaries = [s for s in await store.sessions(owner=reader) if s.session == session]
    summary = summaries[0] if summaries else None
    requests = await store.requests(session, owner=reader, limit=CHART_REQUESTS)
    # The chart is of requests: a compaction prepared in the background is none.
    requests = [r for r in reversed(requests) if not r.background]
    events = await store.events(session=session, owner=reader, limit=SESSION_EVENTS)
    whose = reader if reader is not None else (summary.owner if summary else "")
    ids = list(dict.fromkeys(e.checkpoint_id for e in events if e.checkpoint_id))
    shown: list[ShownCheckpoint] = []
    for checkpoint_id in ids[:SESSION_CHECKPOINTS]:
        found = await store.get(checkpoint_id, owner=reader)
        if found is not None:
            wanted = len(shown) < ORIGINALS_SHOWN
            originals = await store.originals(checkpoint_id) if wanted else None
            shown.append(ShownCheckpoint(found, summary_text(found), originals))
    settings = await store.session_settings(session, whose)
    return SessionView(session, whose, summary, requests, events, shown, settings)
