"""Whether an upstream stream has said anything yet, and whether it ended as
its API ends a stream.

A stream that closes cleanly before its API's last event — a ``role`` chunk
and then nothing, say — is an upstream failure all the same (a crashed slot,
a server that dropped the generation): it is not an answer, however cleanly
its connection closed. :class:`StreamEnd` watches the events of one stream
as they are relayed and answers two questions:

* ``said`` — whether an event past the API's opening ones has come (the
  opening ones, the ``role`` chunk, ``message_start``, ``response.created``,
  say nothing the client could use, so while only they have come the stream
  can be asked again without the client noticing);
* ``ended`` — whether the API's last event came: ``data: [DONE]`` (Chat
  Completions), ``message_stop`` (Anthropic Messages), ``response.completed``
  / ``failed`` / ``incomplete`` (Responses), or an error event in any of them.

One table says it per API (:data:`ENDINGS`). An event is parsed only until the
stream has said something; after that only an event whose bytes hold one of
the last events' names is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from proxy.dialects import sse


@dataclass(frozen=True)
class Ending:
    """How one API opens and ends a stream."""

    #: Event types that say nothing yet.
    opening: frozenset[str]
    #: Event types that end a stream (an error event included).
    closing: frozenset[str]
    #: What an event's bytes must hold to be one of ``closing`` (a cheap test
    #: before it is parsed).
    marks: tuple[bytes, ...]


#: Chat Completions names no event types: its chunks are read by what they
#: hold (see :func:`_chat_kind`), its end is ``[DONE]``.
_CHAT = "chat"

ENDINGS: Final[dict[str, Ending]] = {
    _CHAT: Ending(
        opening=frozenset({"opening"}),
        closing=frozenset({"done", "error"}),
        marks=(b"[DONE]", b'"error"'),
    ),
    "anthropic": Ending(
        opening=frozenset({"message_start", "ping"}),
        closing=frozenset({"message_stop", "error"}),
        marks=(b"message_stop", b"error"),
    ),
    "responses": Ending(
        opening=frozenset({"response.created", "response.in_progress", "response.queued"}),
        closing=frozenset(
            {"response.completed", "response.failed", "response.incomplete", "error"}
        ),
        marks=(b"response.completed", b"response.failed", b"response.incomplete", b"error"),
    ),
}


class StreamEnd:
    """Watches one stream of ``api`` (see the module doc)."""

    def __init__(self, ending: Ending) -> None:
        self._ending = ending
        self._chat = ending is ENDINGS[_CHAT]
        self._splitter = sse.EventSplitter()
        self.said = False
        self.ended = False

    @classmethod
    def of(cls, api: str) -> StreamEnd | None:
        """A watcher for a stream of ``api``; ``None`` for an API it does not know."""
        ending = ENDINGS.get(api)
        return cls(ending) if ending is not None else None

    def feed(self, chunk: bytes) -> None:
        for event in self._splitter.feed(chunk):
            if not event.whole:
                self.said = True  # an event too long to hold says something
                continue
            raw = event.raw
            if self.said and not any(mark in raw for mark in self._ending.marks):
                continue
            kind = self._kind(raw)
            if kind is None:
                continue
            if kind in self._ending.closing:
                self.ended = True
            if kind not in self._ending.opening:
                self.said = True

    def _kind(self, raw: bytes) -> str | None:
        """The event's type; ``None`` for a comment or a blank line."""
        found = sse.fields(raw)
        if found.data is None:
            return None
        if self._chat:
            return _chat_kind(found.data, found.json_object())
        payload = found.json_object()
        kind = payload.get("type") if payload is not None else None
        return kind if isinstance(kind, str) else (found.name or "data")


def _chat_kind(data: bytes, payload: dict[str, Any] | None) -> str:
    """A Chat Completions chunk's kind: ``done``, ``error``, ``opening`` (a
    ``role`` and empty fields only) or ``said``."""
    if data.strip() == b"[DONE]":
        return "done"
    if payload is None:
        return "said"
    if "error" in payload:
        return "error"
    if payload.get("usage"):
        return "said"
    choices = payload.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
            return "said"
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(
            key != "role" and value not in (None, "") for key, value in delta.items()
        ):
            return "said"
    return "opening"


__all__ = ["ENDINGS", "Ending", "StreamEnd"]
