"""Which session a request belongs to: :func:`session_name`.

A session is what the dashboard, ``sessions`` and ``show`` list, and what
events, figures and per-session settings are kept under. It is named by

1. the session id the client sends, where it sends one
   (:data:`CLIENT_SESSION_HEADERS`: Claude Code's ``x-claude-code-session-id``,
   Codex's ``session-id``, its ``x-codex-window-id`` and turn metadata) — so two
   runs of one prompt are two sessions, and a client's side requests (a title,
   a quota probe) are counted in the session they were made for;
2. otherwise the conversation itself: the hash of its first request
   (:attr:`compaction.Conversation.session`).

Sessions are kept per caller (:func:`proxy.edge.access.owner_of`): two callers
with different keys whose requests carry one name (the same first words, say)
have two sessions under it, each shown to its own caller only, and ``show``
and the dashboard's admin view name the caller they show. The name is a
digest; a client's own id is never shown or stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import orjson

#: A client's session id longer than this is not one (a header the client
#: fills with something else): the conversation names the session instead.
MAX_CLIENT_SESSION_CHARS: Final = 256


def _whole(value: str) -> str:
    return value


def _window_thread(value: str) -> str:
    """Codex's window id is ``<thread>:<window number>``; the number grows with
    each of Codex's own compactions, which stay in the thread's session."""
    thread, _, number = value.rpartition(":")
    return thread if thread and number.isdigit() else value


def _turn_metadata(value: str) -> str:
    """Codex's turn metadata is a JSON object naming its ``session_id``."""
    try:
        found = orjson.loads(value)
    except orjson.JSONDecodeError:
        return ""
    session = found.get("session_id") if isinstance(found, dict) else None
    return session if isinstance(session, str) else ""


#: Headers in which clients name their own session, the first present wins,
#: and how the id is read from each.
CLIENT_SESSION_HEADERS: Final[tuple[tuple[str, Callable[[str], str]], ...]] = (
    ("x-claude-code-session-id", _whole),
    ("session-id", _whole),
    ("x-codex-window-id", _window_thread),
    ("x-codex-turn-metadata", _turn_metadata),
)


def client_session(headers: Iterable[tuple[str, str]]) -> str | None:
    """The session id the client sent in ``headers``, if any (see the module doc)."""
    sent: dict[str, str] = {}
    for name, value in headers:
        sent.setdefault(name.lower(), value)
    return sent_session(sent)


def sent_session(sent: Mapping[str, str]) -> str | None:
    """:func:`client_session` of headers already read: ``sent`` holds the first
    value of each (names lower-cased), at least of :data:`CLIENT_SESSION_HEADERS`'."""
    for name, read in CLIENT_SESSION_HEADERS:
        found = sent.get(name)
        if found is None or len(found) > MAX_CLIENT_SESSION_CHARS:
            continue
        session = read(found).strip()
        if session:
            return session
    return None


def session_name(client: str | None, conversation: str) -> str:
    """The session of a request whose client named its session ``client``
    (``None``: it named none) and whose conversation's own key is
    ``conversation`` (:attr:`compaction.Conversation.session`)."""
    if client is None:
        return conversation
    return hashlib.blake2b(f"client\x1f{client}".encode(), digest_size=8).hexdigest()
