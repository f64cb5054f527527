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

What the relay does with a stream that stops short — closed before its end
(:class:`Cut`) or its connection lost — is here too: the log lines, and the
error event that tells the client (:func:`dropped_event`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from proxy.dialects import sse
from proxy.dialects.base import Dialect
from proxy.flow.send import shown_url
from proxy.upstream.transport import BodyLost, UpstreamResponse

logger = logging.getLogger(__name__)


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
            # The stream's last event is no JSON: told apart before it is parsed
            # (a failed parse raises, once per stream).
            if found.data.strip() == b"[DONE]":
                return "done"
            return _chat_kind(found.json_object())
        payload = found.json_object()
        kind = payload.get("type") if payload is not None else None
        return kind if isinstance(kind, str) else (found.name or "data")


def _chat_kind(payload: dict[str, Any] | None) -> str:
    """A Chat Completions chunk's kind (``[DONE]`` told apart already):
    ``error``, ``opening`` (a ``role`` and empty fields only) or ``said``."""
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


@dataclass(frozen=True)
class Cut:
    """What a :class:`~proxy.flow.relay.Relay` does with an event stream that closes before its
    API's end (:class:`StreamEnd`): an upstream error, whatever the
    connection said. It is counted, logged, and — when not one byte of it
    reached the client (it said nothing past its opening events) — asked
    once more; otherwise the client's stream ends with the API's error event,
    code ``upstream_dropped`` (an SDK raises it as the error it is)."""

    #: Counts it as the upstream error it is.
    count: Callable[[], None]
    #: Sends the same request once more; ``None``: no second try.
    again: Callable[[], Awaitable[UpstreamResponse]] | None = None


def dropped_event(dialect: Dialect, *, lost: bool) -> bytes:
    """The error event that ends a client's stream the upstream's stopped short:
    its connection ``lost``, or closed cleanly before its API's end."""
    message = (
        "The upstream connection was lost mid-stream."
        if lost
        else "The upstream ended the stream before its end."
    )
    return dialect.error_event(message, "upstream_dropped")


def log_broken(exc: BodyLost, url: str) -> None:
    logger.warning("upstream stream broke: %s", exc, extra={"fields": {"upstream": shown_url(url)}})


def log_cut(url: str, api: str, then: str | None = None) -> None:
    """A stream that closed before its API's end, logged (``then``: what was done)."""
    fields = {"upstream": shown_url(url), "api": api}
    if then is not None:
        fields["then"] = then
    logger.warning("upstream stream ended before its end", extra={"fields": fields})


__all__ = ["ENDINGS", "Cut", "Ending", "StreamEnd", "dropped_event", "log_broken", "log_cut"]
