"""Server-sent events as the proxy writes them: the one place an event is framed.

An event is its optional name, its data one line per ``data:`` field, and a
blank line that ends it::

    event: message_start          (only for APIs that name their events)
    data: {"type": ...}           (one such line per line of the data)
    <blank line>

The three APIs send JSON, which ``orjson`` writes on one line, so their events
are one ``data:`` line each; data holding line breaks (``\\n``, ``\\r\\n`` or
``\\r``, all of which end a line in the format) is split over as many
``data:`` lines, which a reader joins back with ``\\n``. A name is one
non-empty line: a line break would end the field and start another, and an
empty name reads as none. Chat Completions ends
its stream with :data:`DONE`; the other two have no terminator.

The proxy relays the upstream's own events as they arrive and never reframes
them: this writer is for the answers the proxy makes itself (``/compact``,
the error event of a broken or empty stream).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


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

__all__ = ["DONE", "frame", "json_frame"]
