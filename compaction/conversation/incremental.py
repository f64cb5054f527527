"""Reading a growing conversation in proportion to what is new.

An agent resends its whole history on every turn, so a conversation's next
request is, byte for byte, its previous request up to the last message,
then the new messages, then the fields written after the array. Parsing,
keying, grouping and chaining 6 MB of JSON each turn costs tens of
milliseconds at a million tokens; comparing the bytes costs a fraction of
one. So a request's reading is remembered as a :class:`Reading` — its bytes,
where its message array's last element ends, the fields before the array and
the :class:`~compaction.conversation.reading.Conversation` read from it — and the
next request that starts with those exact bytes is read as that reading plus
its tail (:func:`continue_body`, then
:func:`~compaction.conversation.reading.read_conversation_async` with ``previous``).
Anything else — another conversation, an edit, a rewind, bytes that do not
line up — is read in full, as if nothing were remembered.

Where the array ends is found once per request, from the end of the body:
the last ``]`` after which the rest parses as the remainder of an object with
exactly the fields the full parse found after the array (a ``]`` inside a
later field's value cannot be followed by that). The bytes before it, less
whitespace, end with the last message's closing brace.

:class:`ReadingCache` holds the readings: keyed by owner and conversation (a
caller's bytes are only ever compared with that caller's own readings), least
recently used evicted first, bounded by an estimate of the memory held.
Thread-safe: a large request is read in a worker thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from compaction.conversation.reading import Conversation
from compaction.types import Message

#: What the cache may hold, by default: a few conversations at a million
#: tokens (about 6 MB of JSON each, held as bytes and as parsed objects).
DEFAULT_READING_CACHE_BYTES = 256 * 1024 * 1024
#: Bodies smaller than this are read in full and not remembered: their
#: whole reading costs less than a millisecond.
MIN_READING_BYTES = 32 * 1024
#: Readings kept per owner: the owner's conversations at once (an agent and
#: its sub-agents), each found by comparing bytes, so the count stays small.
READINGS_PER_OWNER = 32
#: Parsed JSON held per byte of it, about (strings, dicts, lists): what the
#: memory estimate charges besides the bytes themselves.
PARSED_BYTES_PER_BYTE = 1.5
#: Places tried when finding where the array ends (each a parse of what
#: follows it): a field after the array quoting its neighbour's key should not
#: make it costly.
MAX_BOUNDARY_TRIES = 16
#: Bytes compared first, before the whole prefix: most readings of another
#: conversation differ right there.
_PROBE = 64
#: The key the tail is parsed under; a body naming it is read in full.
_SENTINEL = "\x00compaction-prefix"
_TAIL_OPEN = b"{" + orjson.dumps(_SENTINEL) + b":["
_WHITESPACE = b" \t\r\n"


@dataclass(frozen=True)
class Reading:
    """One request's bytes and what was read from them."""

    raw: bytes
    #: Offset one past the closing brace of the array's last message.
    end: int
    field: str  #: the array's key (``messages``)
    #: The fields written before the array, in order, as parsed.
    leading: tuple[tuple[str, Any], ...]
    messages: list[Message]  #: the array, as parsed
    conversation: Conversation | None
    size: int  #: estimated bytes held

    @property
    def prefix(self) -> memoryview:
        return memoryview(self.raw)[: self.end]


@dataclass(frozen=True)
class Continued:
    """A body read as a remembered reading plus its tail."""

    body: dict[str, Any]  #: the whole body, as a full parse gives it
    known: int  #: how many of its messages the reading already had
    #: The tail as a body of its own, ``{"messages": [new…], trailing fields…}``:
    #: what the caller checks as it checks any body (repeated keys, types), for
    #: the reading's bytes were checked with the request they came with.
    tail: bytes
    reading: Reading

    @property
    def new(self) -> list[Message]:
        messages: list[Message] = self.body[self.reading.field]
        return messages[self.known :]

    @property
    def trailing(self) -> dict[str, Any]:
        """The fields written after the array."""
        keys = list(self.body)
        after = keys.index(self.reading.field) + 1
        return {key: self.body[key] for key in keys[after:]}


def _parse_tail(tail: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(_TAIL_OPEN + tail)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def reading_of(
    raw: bytes,
    body: Mapping[str, Any],
    conversation: Conversation | None = None,
    *,
    field: str = "messages",
) -> Reading | None:
    """What the next request of this conversation can be read against; ``None``
    when the body's array cannot be delimited (empty, absent, or not found)."""
    messages = body.get(field)
    if not isinstance(messages, list) or not messages or _SENTINEL in body:
        return None
    keys = list(body)
    at = keys.index(field)
    trailing = keys[at + 1 :]
    for close in _closings(raw, orjson.dumps(trailing[0]) if trailing else None):
        parsed = _parse_tail(raw[close:])
        if (
            parsed is None
            or list(parsed) != [_SENTINEL, *trailing]
            or parsed[_SENTINEL]
            or any(parsed[key] != body[key] for key in trailing)
        ):
            continue
        end = _before_whitespace(raw, close)
        if raw[end - 1 : end] != b"}":
            return None
        leading = tuple((key, body[key]) for key in keys[:at])
        size = int(len(raw) * (1 + PARSED_BYTES_PER_BYTE)) + 64 * len(messages)
        return Reading(raw, end, field, leading, messages, conversation, size)
    return None


def _closings(raw: bytes, first: bytes | None) -> Iterator[int]:
    """Where the array may close, from the end: a ``]`` followed by ``, "first"``
    (the first field after the array, as orjson writes its key), or by the
    body's final ``}`` when no field follows. At most
    :data:`MAX_BOUNDARY_TRIES` of them; a key written otherwise (escaped) finds
    none, and the body is read in full each time."""
    if first is None:
        # By offsets: a slice of the body would copy all of it.
        end = _before_whitespace(raw, len(raw))
        if raw[end - 1 : end] == b"}":
            close = _before_whitespace(raw, end - 1)
            if raw[close - 1 : close] == b"]":
                yield close - 1
        return
    stop = len(raw)
    tries = 0
    while tries < MAX_BOUNDARY_TRIES:
        at = raw.rfind(first, 0, stop)
        if at < 0:
            return
        stop = at
        before = raw[max(at - 64, 0) : at].rstrip(_WHITESPACE)
        if not before.endswith(b","):
            continue
        before = before[:-1].rstrip(_WHITESPACE)
        if not before.endswith(b"]"):
            continue
        tries += 1
        yield max(at - 64, 0) + len(before) - 1


def _before_whitespace(raw: bytes, stop: int) -> int:
    """The offset after the last byte before ``stop`` that is not whitespace."""
    while stop > 0 and raw[stop - 1] in _WHITESPACE:
        stop -= 1
    return stop


def continue_body(raw: bytes, reading: Reading) -> Continued | None:
    """``raw`` read as ``reading``'s bytes plus a tail, or ``None`` when it is not
    their continuation (then read it in full).

    The new messages and trailing fields are parsed; the rest is the reading's
    own objects, shared (they are never mutated). What a full parse would
    refuse in the tail — a key repeated, a message without a role — is for the
    caller to judge on :attr:`Continued.tail`; only a trailing key that a
    leading one or the array already used is refused here (``None``).
    """
    end = reading.end
    if len(raw) <= end or not raw.startswith(reading.prefix):
        return None
    return _continued(raw, reading)


def _continued(raw: bytes, reading: Reading) -> Continued | None:
    """:func:`continue_body` of bytes known to start with the reading's."""
    rest = raw[reading.end :].lstrip(_WHITESPACE)
    if rest.startswith(b","):
        tail = rest[1:]
    elif rest.startswith(b"]"):
        tail = rest
    else:
        return None
    parsed = _parse_tail(tail)
    if parsed is None or next(iter(parsed), None) != _SENTINEL:
        return None
    new = parsed.pop(_SENTINEL)
    if not isinstance(new, list):
        return None
    leading = reading.leading
    taken = {key for key, _ in leading}
    taken.add(reading.field)
    if any(key in taken for key in parsed):
        return None
    body: dict[str, Any] = dict(leading)
    body[reading.field] = [*reading.messages, *new]
    body.update(parsed)
    opening = b"{" + orjson.dumps(reading.field) + b":["
    return Continued(body, len(reading.messages), opening + tail, reading)


@dataclass(frozen=True)
class CacheFigures:
    """How much the cache holds and how it served, for metrics and the bench."""

    readings: int
    bytes: int  #: estimated memory held
    limit: int
    hits: int  #: requests read as a continuation
    misses: int  #: requests large enough to look for one, read in full


class ReadingCache:
    """Readings by owner and conversation, least recently used evicted first,
    within ``max_bytes`` of estimated memory (0 turns it off)."""

    def __init__(self, max_bytes: int = DEFAULT_READING_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], Reading] = OrderedDict()
        self._per_owner: dict[str, OrderedDict[str, None]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def wants(self, raw: bytes) -> bool:
        """Whether a body this large is worth looking up and remembering."""
        return self.max_bytes > 0 and len(raw) >= MIN_READING_BYTES

    def find(self, owner: str, raw: bytes, max_tail: int | None = None) -> Continued | None:
        """``raw`` as the continuation of the longest of ``owner``'s readings it
        continues, or ``None``; or ``None`` if what is new exceeds ``max_tail``
        bytes (parsing it is then no quicker than a full reading)."""
        if not self.wants(raw):
            return None
        with self._lock:
            conversations = self._per_owner.get(owner)
            candidates = [self._entries[(owner, c)] for c in conversations or ()]
        best: Reading | None = None
        for reading in candidates:
            end = reading.end
            if (
                len(raw) > end
                and (best is None or end > best.end)
                and raw[max(end - _PROBE, 0) : end] == reading.raw[max(end - _PROBE, 0) : end]
                and raw.startswith(reading.prefix)
            ):
                best = reading
        found = None
        if best is not None and (max_tail is None or len(raw) - best.end <= max_tail):
            found = _continued(raw, best)  # its bytes compared above
        with self._lock:
            if found is None:
                self.misses += 1
            else:
                self.hits += 1
        return found

    def remember(
        self,
        owner: str,
        conversation: str,
        raw: bytes,
        body: Mapping[str, Any],
        read: Conversation | None = None,
    ) -> Reading | None:
        """Keep the reading of ``raw`` (parsed as ``body``, read as ``read``) as
        ``owner``'s latest of ``conversation``, replacing the earlier one and
        evicting the least recently used beyond the bounds."""
        if not self.wants(raw):
            return None
        reading = reading_of(raw, body, read)
        if reading is not None:
            self.keep(owner, conversation, reading)
        return reading

    def keep(self, owner: str, conversation: str, reading: Reading) -> None:
        """:meth:`remember` of a reading already made."""
        if reading.size > self.max_bytes:
            return
        key = (owner, conversation)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            self._entries[key] = reading
            self._bytes += reading.size
            mine = self._per_owner.setdefault(owner, OrderedDict())
            mine[conversation] = None
            mine.move_to_end(conversation)
            while len(mine) > READINGS_PER_OWNER:
                self._drop((owner, next(iter(mine))))
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[str, str]) -> None:
        reading = self._entries.pop(key)
        self._bytes -= reading.size
        owner, conversation = key
        mine = self._per_owner[owner]
        del mine[conversation]
        if not mine:
            del self._per_owner[owner]

    def figures(self) -> CacheFigures:
        with self._lock:
            return CacheFigures(
                len(self._entries), self._bytes, self.max_bytes, self.hits, self.misses
            )
