"""The dashboard in a terminal: ``compaction-proxy sessions`` and ``show SESSION``.

They read the store the proxy writes (the configured ``store.url``), every
owner's: whoever can read the store's file or Redis can read it all anyway.
Plain text, no colours; the figures are the pages' (:mod:`proxy.ui.views`).

A session is one owner's: two callers whose conversations got one id (they
started the same way) have a session each, as on the dashboard. ``sessions``
names each row's owner (the start of its digest) and ``show`` shows one
owner's session — the only one under the id, or the one ``--owner`` names —
never two callers' requests on one page.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from config import Settings
from proxy.state.stores import SessionSummary, Store, open_store
from proxy.ui.views import read_overview, read_session

#: Requests listed by ``show`` (the newest).
TIMELINE_ROWS = 40
EVENT_ROWS = 20


class UnknownSession(LookupError):
    """No session, or more than one, starts with what was asked for."""


def _open(settings: Settings) -> Store:
    store = settings.store
    return open_store(
        store.url,
        retention_seconds=store.retention_seconds,
        store_originals=store.store_originals,
        timeout=store.timeout_seconds,
        requests_retention_seconds=store.requests_retention_seconds,
        max_model_rows=store.max_model_rows,
    )


def _clock(moment: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment))


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell; the columns in ``right`` right-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


#: An owner's digest is shown cut to this many characters (``--owner`` takes any unique start).
OWNER_CHARS = 8


def _owner(owner: str) -> str:
    return owner[:OWNER_CHARS] or "-"


def render_sessions(sessions: Sequence[SessionSummary]) -> str:
    if not sessions:
        return "No sessions recorded yet."
    rows = [
        (
            s.session,
            _label(s),
            s.model,
            f"{s.requests:,}",
            f"{s.compactions:,}",
            f"{s.tokens_after:,} / {_window(s)}",
            f"{s.input_limit:,} / {s.trigger:,}",
            f"{s.saved:,}",
            _clock(s.last_at),
            _owner(s.owner),
        )
        for s in sessions
    ]
    header = (
        "SESSION",
        "LABEL",
        "MODEL",
        "REQUESTS",
        "COMPACTIONS",
        "CONTEXT / WINDOW",
        "LIMIT / TRIGGER",
        "SAVED",
        "LAST",
        "OWNER",
    )
    return table(header, rows, right=(3, 4, 5, 6, 7))


#: A label in the table is cut to this many characters.
LABEL_CHARS = 40


def _label(summary: SessionSummary) -> str:
    label = summary.label
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"


def _window(summary: SessionSummary) -> str:
    """The model's window; ``?`` for figures recorded before it was."""
    return f"{summary.context_window:,}" if summary.context_window else "?"


async def sessions_text(settings: Settings, limit: int) -> str:
    store = _open(settings)
    try:
        overview = await read_overview(store, None, limit=limit)
    finally:
        await store.close()
    totals = overview.totals
    footer = (
        f"\n{totals.sessions:,} sessions, {totals.requests:,} requests, "
        f"{totals.compactions:,} compactions, {totals.saved:,} tokens saved, "
        f"{totals.summarizer_calls:,} summarizer calls ({totals.summarizer_tokens:,} tokens), "
        f"{totals.upstream_errors:,} upstream errors; cost {totals.money.cost:,.0f} input "
        f"tokens, {totals.money.cost_without:,.0f} estimated without compaction"
    )
    return render_sessions(overview.sessions) + (footer if overview.sessions else "")


def _one_session(known: Sequence[SessionSummary], wanted: str, owner: str | None) -> SessionSummary:
    """The one session of ``known`` that ``wanted`` (an id or its start) and
    ``owner`` (a digest or its start; ``None``: any) name."""
    exact = [s for s in known if s.session == wanted]
    matches = exact or [s for s in known if s.session.startswith(wanted)]
    if owner is not None:
        matches = [s for s in matches if s.owner.startswith(owner)]
    if len({s.session for s in matches}) > 1:
        raise UnknownSession(
            f"{len({s.session for s in matches})} sessions starting with {wanted!r}"
        )
    if not matches:
        whose = f" of an owner starting with {owner!r}" if owner is not None else ""
        raise UnknownSession(f"no session starting with {wanted!r}{whose}")
    if len(matches) > 1:
        owners = ", ".join(
            f"{_owner(s.owner)} ({s.requests:,} requests, {_clock(s.last_at)})" for s in matches
        )
        raise UnknownSession(
            f"session {matches[0].session} is {len(matches)} owners' (their conversations "
            f"started the same way): {owners}; name one with --owner"
        )
    return matches[0]


async def show_text(settings: Settings, wanted: str, owner: str | None = None) -> str:
    store = _open(settings)
    try:
        found = _one_session(await store.sessions(), wanted, owner)
        view = await read_session(store, found.session, None, found.owner)
    finally:
        await store.close()
    out = [f"session {view.session} · owner {_owner(view.owner)}"]
    s = view.summary
    if s is not None:
        out.append(
            f"model {s.model} ({s.api}) · {s.requests:,} requests · {s.compactions:,} "
            f"compactions · context {s.tokens_after:,} / {_window(s)} window "
            f"(limit {s.input_limit:,}, trigger {s.trigger:,}) · {s.saved:,} tokens saved · "
            f"{s.upstream_errors:,} upstream error answers"
        )
        if s.label:
            out.insert(1, s.label)
    settings_now = view.settings
    out.append(
        "compaction: "
        + ("on" if settings_now.enabled else "OFF")
        + (f" · instructions: {settings_now.instructions}" if settings_now.instructions else "")
    )
    rows = [
        (
            _clock(r.created_at),
            r.stage,
            r.reason if r.compacted else "",
            f"{r.tokens_before:,}",
            f"{r.tokens_after:,}",
            str(r.status),
            f"{r.ms:.0f}",
        )
        for r in view.requests[-TIMELINE_ROWS:]
    ]
    # Of the session's own count, as its header says (the chart reads at most
    # CHART_REQUESTS of them).
    total = s.requests if s is not None else len(view.requests)
    out += ["", f"Timeline (the last {len(rows)} of {total:,} requests)"]
    header = ("TIME", "STAGE", "REASON", "BEFORE", "AFTER", "STATUS", "MS")
    out.append(table(header, rows, right=(3, 4, 5, 6)) if rows else "No requests recorded.")
    newest = next((shown for shown in view.checkpoints if shown.summary), None)
    if newest is not None:
        cp = newest.checkpoint
        out += [
            "",
            f"Summary (checkpoint {cp.id}, {cp.stage}, {cp.tokens_before:,} → "
            f"{cp.tokens_after:,} tokens, {_clock(cp.created_at)})",
            "",
            newest.summary or "",
        ]
    events = [
        (
            _clock(e.created_at),
            e.type + (" (background)" if e.background else ""),
            e.reason,
            e.stage or "",
            e.error or "",
        )
        for e in view.events[:EVENT_ROWS]
    ]
    if events:
        out += ["", "Events (newest first)"]
        out.append(table(("TIME", "EVENT", "REASON", "STAGE", "ERROR"), events))
    return "\n".join(out)
