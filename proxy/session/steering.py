"""Steering a conversation's compaction: edit a summary, set per-session
instructions or switch compaction off, and "compact now".

Used by the JSON routes (:mod:`proxy.api.steering`) and the dashboard's buttons
alike, and by :func:`steering_for`, the one call
:func:`proxy.session.conversation.resolve` makes into this module: it reads
the session's settings (alongside the store's lookup of its checkpoints, at
the same time) and a pending "compact now" into the
:class:`compaction.Steering` that :func:`compaction.decide` takes — the rules
(compaction off turns a compaction into a forward, ``/compact`` still
compacts; the instructions join those of a ``/compact``) are the engine's.

An edited summary is stored in place of the old one under the same id, so the
next request of the conversation forwards the edited text; the old text is
kept in a ``checkpoint.edited`` event. The summary's format, and so what a
user may edit of it (the body, not the file lists the proxy computed), is
:mod:`compaction.summary`'s.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Final

from compaction import Checkpoint, Steering, is_summary, parse_summary, with_body
from proxy.edge.errors import BadRequest, NotFound
from proxy.state.runtime import ProxyState
from proxy.state.stores import Event, SessionSettings

#: Sessions searched for the owner of a session the admin steers.
_OWNER_SEARCH: Final = 1_000


async def steering_for(
    state: ProxyState, session: str, owner: str, *, preview: bool = False
) -> Steering:
    """What ``owner`` set for ``session``, as :func:`compaction.decide` takes it.

    A pending "compact now" is taken by this request (it stays pending for a
    ``preview``, which does nothing).
    """
    pending = (owner, session) in state.compact_now
    if pending and not preview:
        state.compact_now.discard((owner, session))
    settings = await state.store.session_settings(session, owner)
    return Steering(settings.enabled, settings.instructions, compact_now=pending)


# --- the actions -------------------------------------------------------------


def _summary_index(checkpoint: Checkpoint) -> int | None:
    return next((i for i, m in enumerate(checkpoint.replacement) if is_summary(m)), None)


def summary_text(checkpoint: Checkpoint) -> str | None:
    """The checkpoint's summary as a reader edits it: the body alone (no marker,
    no heading, none of the file lists the proxy computed)."""
    index = _summary_index(checkpoint)
    if index is None:
        return None
    parts = parse_summary(checkpoint.replacement[index])
    return parts.body if parts is not None else None


async def edit_summary(
    state: ProxyState, checkpoint_id: str, text: str, viewer: str | None
) -> Checkpoint:
    """Replace the summary of ``viewer``'s checkpoint (anyone's for ``None``, the admin)."""
    text = _plain_lines(text)
    if not text.strip():
        raise BadRequest("The summary must not be empty.", param="summary")
    limit = state.settings.server.max_summary_chars
    if len(text) > limit:
        raise BadRequest(f"The summary is longer than {limit:,} characters.", param="summary")
    found = await state.store.get(checkpoint_id, owner=viewer)
    if found is None:
        raise NotFound("No such checkpoint.")
    index = _summary_index(found)
    if index is None:
        raise BadRequest(
            f"This checkpoint holds no summary to edit (its stage is {found.stage}).",
            param="summary",
        )
    owner = viewer if viewer is not None else await _owner_of_checkpoint(state, found)
    previous = summary_text(found) or ""
    replacement = list(found.replacement)
    replacement[index] = with_body(replacement[index], text)
    edited = dataclasses.replace(found, replacement=tuple(replacement))
    await state.store.put(edited, None, owner=owner)
    await state.store.add_event(
        Event(
            compaction_id=uuid.uuid4().hex,
            type="checkpoint.edited",
            session=found.session,
            model=found.model,
            reason="edit",
            instance=state.instance,
            stage=found.stage,
            checkpoint_id=found.id,
            owner=owner,
            previous_summary=previous,
        )
    )
    return edited


async def _owner_of_checkpoint(state: ProxyState, checkpoint: Checkpoint) -> str:
    """Whose checkpoint the admin edits (it stays theirs): the owner of the
    events that made it, written before the checkpoint was ever answered with."""
    events = await state.store.events(session=checkpoint.session, limit=_OWNER_SEARCH)
    for event in events:
        if event.checkpoint_id == checkpoint.id:
            return event.owner
    return await session_owner(state, checkpoint.session, None)


def check_session_id(state: ProxyState, session: str) -> None:
    """A 400 for a session id longer than any the proxy makes (or allows)."""
    limit = state.settings.server.max_session_id_chars
    if len(session) > limit:
        raise BadRequest(f"The session id is longer than {limit:,} characters.", param="session")


async def session_exists(state: ProxyState, session: str, viewer: str | None) -> bool:
    """Whether ``viewer`` (``None``: the admin) has anything of ``session`` —
    figures or events. Another caller's session does not exist for them, so
    steering it is the same 404 as steering one that never was."""
    if await state.store.requests(session, owner=viewer, limit=1):
        return True
    return bool(await state.store.events(session=session, owner=viewer, limit=1))


async def steered_session(state: ProxyState, session: str, viewer: str | None) -> str:
    """The owner whose ``session`` ``viewer`` steers, or a 404 when ``viewer``
    has nothing of it (see :func:`session_exists`)."""
    check_session_id(state, session)
    if not await session_exists(state, session, viewer):
        raise NotFound("No such session.")
    return await session_owner(state, session, viewer)


async def session_owner(state: ProxyState, session: str, viewer: str | None) -> str:
    """The owner whose ``session`` is steered: the viewer's own, or for the admin
    the owner of the session as its events or figures say (the anonymous owner
    if nothing says)."""
    if viewer is not None:
        return viewer
    events = await state.store.events(session=session, limit=1)
    if events:
        return events[0].owner
    for summary in await state.store.sessions(limit=_OWNER_SEARCH):
        if summary.session == session:
            return summary.owner
    return ""


async def update_settings(
    state: ProxyState,
    session: str,
    owner: str,
    *,
    enabled: bool | None = None,
    instructions: str | None = None,
) -> SessionSettings:
    """Change what is given, keep the rest; the settings now in force."""
    limit = state.settings.server.max_instructions_chars
    if instructions is not None and len(instructions) > limit:
        raise BadRequest(
            f"The instructions are longer than {limit:,} characters.", param="instructions"
        )
    if instructions is not None:
        instructions = _plain_lines(instructions)
    current = await state.store.session_settings(session, owner)
    changed = dataclasses.replace(
        current,
        enabled=current.enabled if enabled is None else enabled,
        instructions=current.instructions if instructions is None else instructions.strip(),
        updated_at=time.time(),
    )
    await state.store.set_session_settings(session, owner, changed)
    return changed


def _plain_lines(text: str) -> str:
    # A browser's form sends a textarea's lines ended with CR LF.
    return text.replace("\r\n", "\n")


def compact_now(state: ProxyState, session: str, owner: str) -> None:
    """Compact ``owner``'s ``session`` at its next request through this process,
    as ``/compact`` would."""
    state.compact_now.add((owner, session))
