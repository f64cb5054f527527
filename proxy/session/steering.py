"""Steering a conversation's compaction: edit a summary, set per-session
instructions or switch compaction off, and "compact now".

Used by the JSON routes (:mod:`proxy.api.steering`) and the dashboard's buttons
alike, and by :func:`steering_for`, the one call
:func:`proxy.session.conversation.compact_if_needed` makes into this module: it reads
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
from proxy.edge.errors import BadRequest, NotFound, ProxyError
from proxy.session.service import Conversations
from proxy.state.stores import Event, SessionSettings

#: How many owners an ambiguous session's 409 names.
_OWNERS_NAMED: Final = 10


class AmbiguousSession(ProxyError):
    """The admin steered a session id that several owners use, without naming one."""

    status = 409
    type = "invalid_request_error"
    code = "ambiguous_session"


def compact_now_pending(conversations: Conversations, session: str, owner: str) -> bool:
    """Whether a "compact now" waits for ``owner``'s ``session`` in this process."""
    return (owner, session) in conversations.compact_now


async def steering_for(
    conversations: Conversations, session: str, owner: str, *, preview: bool = False
) -> Steering:
    """What ``owner`` set for ``session``, as :func:`compaction.decide` takes it.

    A pending "compact now" is taken by this request (it stays pending for a
    ``preview``, which does nothing).
    """
    pending = compact_now_pending(conversations, session, owner)
    if pending and not preview:
        conversations.compact_now.discard((owner, session))
    settings = await conversations.store.session_settings(session, owner)
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
    conversations: Conversations, checkpoint_id: str, text: str, viewer: str | None
) -> Checkpoint:
    """Replace the summary of ``viewer``'s checkpoint (anyone's for ``None``, the admin).

    The edit is stored under the owner the checkpoint was stored as, read from
    the store: an admin's edit never changes whose it is, and one whose owner
    cannot be read is refused (404; 503 when the store cannot say)."""
    text = _plain_lines(text)
    if not text.strip():
        raise BadRequest("The summary must not be empty.", param="summary")
    limit = conversations.settings.server.max_summary_chars
    if len(text) > limit:
        raise BadRequest(f"The summary is longer than {limit:,} characters.", param="summary")
    found = await conversations.store.get(checkpoint_id, owner=viewer)
    if found is None:
        raise NotFound("No such checkpoint.")
    index = _summary_index(found)
    if index is None:
        raise BadRequest(
            f"This checkpoint holds no summary to edit (its stage is {found.stage}).",
            param="summary",
        )
    owner = viewer if viewer is not None else await conversations.store.owner_of(checkpoint_id)
    if owner is None:  # gone since it was read
        raise NotFound("No such checkpoint.")
    previous = summary_text(found) or ""
    replacement = list(found.replacement)
    replacement[index] = with_body(replacement[index], text)
    edited = dataclasses.replace(found, replacement=tuple(replacement))
    await conversations.store.put(edited, None, owner=owner)
    await conversations.store.add_event(
        Event(
            compaction_id=uuid.uuid4().hex,
            type="checkpoint.edited",
            session=found.session,
            model=found.model,
            reason="edit",
            instance=conversations.instance,
            stage=found.stage,
            checkpoint_id=found.id,
            owner=owner,
            previous_summary=previous,
        )
    )
    return edited


def check_session_id(conversations: Conversations, session: str) -> None:
    """A 400 for a session id longer than any the proxy makes (or allows)."""
    limit = conversations.settings.server.max_session_id_chars
    if len(session) > limit:
        raise BadRequest(f"The session id is longer than {limit:,} characters.", param="session")


async def session_exists(conversations: Conversations, session: str, viewer: str | None) -> bool:
    """Whether ``viewer`` (``None``: the admin) has anything of ``session`` —
    figures or events. Another caller's session does not exist for them, so
    steering it is the same 404 as steering one that never was."""
    if await conversations.store.requests(session, owner=viewer, limit=1):
        return True
    return bool(await conversations.store.events(session=session, owner=viewer, limit=1))


async def steered_session(
    conversations: Conversations, session: str, viewer: str | None, owner: str | None = None
) -> str:
    """The owner whose ``session`` ``viewer`` steers, or a 404 when ``viewer``
    has nothing of it (see :func:`session_exists`); ``owner`` is the one the
    admin names (see :func:`session_owner`)."""
    check_session_id(conversations, session)
    if not await session_exists(conversations, session, viewer if owner is None else owner):
        raise NotFound("No such session.")
    return await session_owner(conversations, session, viewer, owner)


async def session_owner(
    conversations: Conversations, session: str, viewer: str | None, owner: str | None = None
) -> str:
    """The owner whose ``session`` is steered.

    A caller steers only their own: ``owner``, if given, must be theirs (else
    a 404, as for a session they have nothing of). The admin (``viewer=None``)
    steers the ``owner`` named, else the one owner the store knows with a
    session by that id; two callers may use one id, and then the admin must
    name one (:class:`AmbiguousSession`, a 409 listing them) — a setting is
    never put on a guessed owner's session.
    """
    if viewer is not None:
        if owner is not None and owner != viewer:
            raise NotFound("No such session.")
        return viewer
    if owner is not None:
        return owner
    owners = await conversations.store.owners_of_session(session)
    if not owners:
        raise NotFound("No such session.")
    if len(owners) > 1:
        named = ", ".join(repr(name) for name in owners[:_OWNERS_NAMED])
        raise AmbiguousSession(
            f"{len(owners)} owners have a session {session!r}; name one with ?owner= "
            f"(one of {named}).",
            param="owner",
        )
    return owners[0]


async def update_settings(
    conversations: Conversations,
    session: str,
    owner: str,
    *,
    enabled: bool | None = None,
    instructions: str | None = None,
) -> SessionSettings:
    """Change what is given, keep the rest; the settings now in force."""
    limit = conversations.settings.server.max_instructions_chars
    if instructions is not None and len(instructions) > limit:
        raise BadRequest(
            f"The instructions are longer than {limit:,} characters.", param="instructions"
        )
    if instructions is not None:
        instructions = _plain_lines(instructions)
    current = await conversations.store.session_settings(session, owner)
    changed = dataclasses.replace(
        current,
        enabled=current.enabled if enabled is None else enabled,
        instructions=current.instructions if instructions is None else instructions.strip(),
        updated_at=time.time(),
    )
    await conversations.store.set_session_settings(session, owner, changed)
    return changed


def _plain_lines(text: str) -> str:
    # A browser's form sends a textarea's lines ended with CR LF.
    return text.replace("\r\n", "\n")


def compact_now(conversations: Conversations, session: str, owner: str) -> None:
    """Compact ``owner``'s ``session`` at its next request through this process,
    as ``/compact`` would."""
    conversations.compact_now.add((owner, session))
