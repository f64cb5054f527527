"""Server-sent events: the one place an event is framed, and the one place a
stream of them is split back into events.

An event is its optional name, its data one line per ``data:`` field, and a
blank line that ends it::

    event: message_start          (only for APIs that name their events)
    data: {"type": ...}           (one such line per line of the data)
    <blank line>

A line ends with ``\\n``, ``\\r\\n`` or a ``\\r`` alone; a reader joins the
data lines back with ``\\n``.

Writing (:func:`frame`, :func:`json_frame`, :data:`DONE`). The three APIs send
JSON, which ``orjson`` writes on one line, so their events are one ``data:``
line each; data holding line breaks is split over as many ``data:`` lines. A
name is one non-empty line: a line break would end the field and start
another, and an empty name reads as none. Chat Completions ends its stream
with :data:`DONE`; the other two have no terminator. The proxy relays the
upstream's own events and never reframes them: the writer is for the answers
the proxy makes itself (``/compact``, the error event of a broken or empty
stream) and the events recall rewrites to continue a stream.

Reading, for recall (:class:`EventSplitter`, :func:`fields`). To hide the
events of a call the proxy answers itself, a stream is read event by event:
the splitter takes the upstream's chunks as they come and hands back each
event once its blank line has come, as the upstream's own bytes. It reads
each byte a bounded number of times however the stream is cut, holds a
final ``\\r`` until the next byte tells whether it is the first half of a
``\\r\\n``, and holds at most :data:`MAX_EVENT_BYTES` of an event whose end
has not come: past that, the event is handed out in pieces as it comes.
:class:`RoundReader` is what the three APIs' recall streams build on: the
splitter, and the count of what a round keeps (:data:`MAX_KEPT_BYTES`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import orjson

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")

#: The longest event a reader holds while its end has not come: past it, what
#: came is handed out as it is, and so is the rest of that event as it comes
#: (a client reads it as the upstream wrote it; a recall reader can no longer
#: put that round's answer together, so the round does not recall).
MAX_EVENT_BYTES: Final = 8 << 20
#: The most a recall reader keeps of one round to put its answer together
#: (the follow-up request repeats it to the model): Chat's and Anthropic's
#: events, Responses' finished items and response. Past it, a recall call
#: that starts later in the round is dropped, and a round that has already
#: recalled keeps nothing more (its answer lacks what came after).
MAX_KEPT_BYTES: Final = 32 << 20

#: Two line ends in a row: the blank line that ends an event. A ``\r`` is a
#: line end of its own only when no ``\n`` follows; one that ends the bytes
#: read so far is settled by the next byte.
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
#: One line end where an event would start: a blank line with no event before it.
_STRAY_LINE = re.compile(rb"\r\n|\r(?!\n)|\n")
#: How far before the end of what was scanned an event end may begin and
#: still end in bytes yet to come (the longest end, ``\r\n\r\n``, less one).
_END_OVERLAP = 3
_LINE_END_BYTES = b"\r\n"


def frame(data: bytes | str, event: str | None = None) -> bytes:
    """One event carrying ``data`` (each of its lines a ``data:`` field), named
    ``event`` when given."""
    raw = data.encode() if isinstance(data, str) else data
    head = b""
    if event is not None:
        if not event or _LINE_BREAK.search(event.encode()):
            # Empty, it reads as no name; with a line break, as another field.
            raise ValueError(f"an event name is a non-empty line: {event!r}")
        head = b"event: " + event.encode() + b"\n"
    if b"\n" not in raw and b"\r" not in raw:
        return head + b"data: " + raw + b"\n\n"
    lines = _LINE_BREAK.split(raw)
    return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


def json_frame(payload: Any, event: str | None = None) -> bytes:
    """One event whose data is ``payload`` as JSON (on one line)."""
    return frame(orjson.dumps(payload), event)


#: The event that ends a Chat Completions stream.
DONE = frame(b"[DONE]")


@dataclass(frozen=True)
class Event:
    """One event as the upstream sent it, or a piece of one too long to hold."""

    #: The bytes as they came, the blank line that ends the event included.
    raw: bytes
    #: 0 for a whole event (or a blank line on its own); for an event longer
    #: than the splitter holds, 1, 2, … for its pieces in order, the last one
    #: ending with its blank line.
    piece: int = 0

    @property
    def whole(self) -> bool:
        return self.piece == 0


class EventSplitter:
    """Splits one stream's chunks into its events (see the module doc).

    ``feed`` returns the events the chunk completed, in order; ``rest`` what is
    left once the stream has ended (an event whose blank line never came).
    """

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max_event = max_event_bytes
        self._held = bytearray()
        self._scanned = 0  # bytes of _held already searched for an event end
        self._piece = 0  # the last piece handed out of the event being torn, or 0

    def feed(self, chunk: bytes) -> list[Event]:
        held = self._held
        held += chunk
        events: list[Event] = []
        start = 0
        search = max(0, self._scanned - _END_OVERLAP)
        while start < len(held):
            found = None if self._piece else _STRAY_LINE.match(held, start)
            if found is None:
                found = _EVENT_END.search(held, max(start, search))
            if found is None:
                break
            end = found.end()
            if end == len(held) and held[-1:] == b"\r":
                break  # the next byte may be the "\n" of this "\r"
            events.append(self._handed(bytes(held[start:end])))
            self._piece = 0
            start = search = end
        del held[:start]
        if self._piece or len(held) > self._max_event:
            # An event too long to hold goes out as it comes; what could be
            # the start of its blank line stays, to be searched with what follows.
            keep = len(held) - len(held.rstrip(_LINE_END_BYTES))
            if len(held) > keep:
                self._piece += 1
                events.append(Event(bytes(held[: len(held) - keep]), self._piece))
                del held[: len(held) - keep]
        self._scanned = len(held)
        return events

    def _handed(self, raw: bytes) -> Event:
        return Event(raw, self._piece + 1 if self._piece else 0)

    def rest(self) -> Event | None:
        """What is held once the stream has ended, and nothing held any more."""
        if not self._held:
            self._piece = 0
            return None
        rest = self._handed(bytes(self._held))
        self._held.clear()
        self._scanned = self._piece = 0
        return rest


class RoundReader:
    """What the three recall streams share: one client stream read event by
    event over the rounds of its answer, within both bounds.

    A subclass says what to relay of a whole event (``_whole``) and of a piece
    of one too long to hold (``_piece``), counts what it keeps of a round with
    ``_keeps``, and lets go of it in ``_stop_keeping``.
    """

    def __init__(
        self, *, max_event_bytes: int = MAX_EVENT_BYTES, max_kept_bytes: int = MAX_KEPT_BYTES
    ) -> None:
        self._max_event = max_event_bytes
        self._max_kept = max_kept_bytes
        self._splitter = EventSplitter(max_event_bytes)
        self._kept = 0  # bytes of what the round keeps, counted while keeping
        self._keeping = True  # the round may still recall (or has), so it is kept
        self._recalled = False  # the round called compaction_recall
        self._dropped = 0  # recall calls left out, over all rounds

    @property
    def recalled(self) -> bool:
        """Whether the current round called ``compaction_recall`` (to be answered)."""
        return self._recalled

    @property
    def dropped(self) -> int:
        """Recall calls left out: after a client call was relayed, or past the bounds."""
        return self._dropped

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._split(event) for event in self._splitter.feed(chunk))

    def end(self) -> bytes:
        rest = self._splitter.rest()
        return self._split(rest) if rest is not None else b""

    def _split(self, event: Event) -> bytes:
        return self._whole(event.raw) if event.whole else self._piece(event)

    def _whole(self, raw: bytes) -> bytes:
        """The bytes to relay for one whole event of the current round."""
        raise NotImplementedError

    def _piece(self, event: Event) -> bytes:
        """The bytes to relay for a piece of an event too long to hold."""
        raise NotImplementedError

    def _next_round_events(self) -> None:
        """The chunks fed next are a new round's: nothing held, nothing kept yet."""
        self._splitter = EventSplitter(self._max_event)
        self._kept = 0
        self._keeping = True
        self._recalled = False

    def _keeps(self, raw: bytes) -> bool:
        """Whether the round keeps ``raw``: while it keeps, within the bound;
        past the bound it keeps nothing more."""
        if not self._keeping:
            return False
        self._kept += len(raw)
        if self._kept <= self._max_kept:
            return True
        self._stop_keeping()
        return False

    def _stop_keeping(self) -> None:
        """The round keeps nothing more (a subclass lets go of what it kept too,
        when the round can no longer recall)."""
        self._keeping = False


@dataclass(frozen=True)
class Fields:
    """What a reader makes of one event's bytes."""

    #: The ``event:`` field (the last one), ``None`` when there is none or it is empty.
    name: str | None
    #: The ``data:`` fields joined with ``\\n``; ``None`` when there is none.
    data: bytes | None

    def json_object(self) -> dict[str, Any] | None:
        """The data as a JSON object; ``None`` for none, other JSON, or a garble."""
        if self.data is None:
            return None
        try:
            parsed = orjson.loads(self.data)
        except orjson.JSONDecodeError:
            return None
        return parsed if isinstance(parsed, dict) else None


def fields(raw: bytes) -> Fields:
    """The name and data of one event, read as the format says: a line ``name:
    value`` (one space after the colon dropped), a line without a colon a field
    with no value, a line starting with a colon a comment."""
    name: str | None = None
    data: list[bytes] = []
    for line in _LINE_BREAK.split(raw):
        if not line or line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"event":
            name = value.decode("utf-8", "replace") or None
        elif field == b"data":
            data.append(value)
    return Fields(name, b"\n".join(data) if data else None)


__all__ = [
    "DONE",
    "MAX_EVENT_BYTES",
    "MAX_KEPT_BYTES",
    "Event",
    "EventSplitter",
    "Fields",
    "RoundReader",
    "fields",
    "frame",
    "json_frame",
]
