"""The upstream's ``usage`` of an answer, read off its bytes as they pass.

OpenAI-style answers carry a ``usage`` object: in a JSON answer, and in the
last event of a stream (Chat Completions only when the client asked for
``stream_options.include_usage``; Responses in ``response.completed``).
Anthropic's streams split it: the prompt and cache counts in
``message_start``, the output in ``message_delta`` (counts that grow: the
last one is the answer's). Each ``usage`` object the answer holds is cut out
whole and parsed once the answer ends; later ones overwrite what earlier ones
said, key by key, and :func:`proxy.upstream.usage.read_usage` reads the result
(:class:`~proxy.upstream.usage.Usage`: prompt, cache read, cache written,
output). The prompt the answer's own step read is also reported to
``report``, which compares it with the proxy's estimate to calibrate its
budgets (:func:`compaction.calibrate`).

Where an answer has no ``usage``, the llama.cpp server's ``timings`` (in its
JSON answers and in the last event of its streams) count the prompt too: its
``prompt_n`` is only the part it evaluated, ``cache_n`` the part it reused
from its cache, so the prompt is their sum — counted only when both are
there: ``prompt_n`` alone (servers older than ``cache_n``) would give a
resent conversation's new turn for its whole prompt. ``predicted_n`` is the
output. ``usage`` is preferred where both are present. (llama-cpp-python's
streams carry neither: its non-streamed answers, and the summaries the proxy
asks, calibrate it.)

The bytes are only looked at, never changed or held: a tap sees each chunk
once, searching it (with the end of the previous one, for a key split across
chunks) for the keys; only a ``usage`` object's own bytes are kept, up to
:data:`MAX_USAGE_BYTES`. An object whole in its chunk (a JSON answer's, most
streams' last event) is parsed from its ``{`` to the closing brace that ends
it; only one cut across chunks, or one whose strings hold braces, is
followed byte by byte. A model's text cannot fake one: inside a JSON string
the quotes around a key would be escaped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

import orjson

from proxy.upstream.usage import Usage, read_usage

#: The start of a ``usage`` object (``"usage": null`` is no start).
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
#: What moves the scan of an object: braces, and strings (which may hold them).
_STRUCTURE = re.compile(rb'[{}"\\]')
#: llama.cpp's ``timings``: the evaluated and the reused parts of the prompt, the output.
_TIMINGS = re.compile(rb'"(prompt_n|cache_n|predicted_n)"\s*:\s*(\d{1,9})\b')
_TIMINGS_KEYS = (b"prompt_n", b"cache_n")
#: Bytes of one chunk kept to find a key that the next chunk completes.
_CARRY: Final = 48
#: A ``usage`` object larger than this is no usage the proxy knows: not read.
MAX_USAGE_BYTES: Final = 64 * 1024
#: Closing braces tried as a ``usage`` object's end before its bytes are
#: followed one by one (OpenAI's and Anthropic's hold two or three objects).
_WHOLE_TRIES: Final = 6


#: The bytes the scan looks at, as ints (what indexing ``bytes`` gives).
_QUOTE, _BACKSLASH, _OPEN, _CLOSE = b'"\\{}'


class UsageTap:
    """Watches an answer's chunks; after :meth:`close`, :attr:`usage` is what
    the answer reported (``None``: nothing)."""

    __slots__ = (
        "_apart",
        "_bare",
        "_carry",
        "_depth",
        "_escaped",
        "_found",
        "_in_string",
        "_object",
        "_report",
        "_timings",
        "usage",
    )

    def __init__(
        self,
        report: Callable[[int], None] | None = None,
        *,
        cached: bool = False,
        bare: bool = False,
    ) -> None:
        #: Told the prompt the answer's own step read (calibration), at :meth:`close`.
        self._report = report
        #: With ``cached`` (Anthropic), the cache counts are apart from ``input_tokens``.
        self._apart = cached
        #: With ``bare``, the answer is itself the counts (Anthropic's ``count_tokens``).
        self._bare = bare
        self._carry = b""
        #: The ``usage`` objects' keys so far, the later ones' over the earlier.
        self._found: dict[str, Any] = {}
        #: The object being cut out (``None``: none open), and where its scan stands.
        self._object: bytearray | None = None
        self._depth = 0
        self._in_string = False
        self._escaped = False
        #: The last ``prompt_n``, ``cache_n`` and ``predicted_n`` seen, by key.
        self._timings: dict[bytes, int] = {}
        self.usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        if self._bare:
            start = chunk.find(b"{")
            if start < 0:
                return
            self._bare = False
            self._open()
            chunk = chunk[start + 1 :]
        if not chunk:
            return
        if self._object is not None:
            end = self._scan(chunk, 0)
            if end is None:
                return  # the whole chunk was inside the object
            # Nothing before the object's end is left to find.
            data, seen = chunk[end:], 0
        else:
            data = self._carry + chunk
            seen = len(self._carry)  # a key that ends in here was found before
        position = 0
        while b'"usage"' in data:
            match = _USAGE.search(data, position)
            if match is None:
                break
            position = match.end()
            if position <= seen:
                continue
            end = self._read_whole(data, position)
            if end is None:
                self._open()
                end = self._scan(data, position)
                if end is None:
                    break
            position = end
        if b'_n"' in data:
            for timing in _TIMINGS.finditer(data):
                self._timings[timing.group(1)] = int(timing.group(2))
        self._carry = data[-_CARRY:] if self._object is None else b""

    def _read_whole(self, data: bytes, start: int) -> int | None:
        """Where the object whose ``{`` ends before ``start`` ends, when it is
        whole in ``data`` and one of its first closing braces ends it: parsed
        as it is, without following its bytes one by one (a flat ``usage`` is
        read in one parse). ``None``: left to :meth:`_scan`.

        A slice that parses is the object itself: from its ``{``, a shorter
        one ends inside it and a longer one holds bytes after it, and neither
        is JSON. Only slices with as many ``{`` as ``}`` are tried (the
        others cannot close it, unless a string holds a brace, which the
        scan then reads)."""
        begin = start - 1
        end = data.find(b"}", start)
        for _ in range(_WHOLE_TRIES):
            if end < 0 or end + 1 - begin > MAX_USAGE_BYTES:
                return None
            candidate = data[begin : end + 1]
            if candidate.count(b"{") == candidate.count(b"}"):
                try:
                    parsed = orjson.loads(candidate)
                except orjson.JSONDecodeError:
                    return None
                if isinstance(parsed, dict):  # later keys over earlier ones
                    self._found.update(parsed)
                return end + 1
            end = data.find(b"}", end + 1)
        return None

    def _open(self) -> None:
        """An object starts: its ``{`` was just read."""
        self._object, self._depth = bytearray(b"{"), 1
        self._in_string = self._escaped = False

    def _scan(self, data: bytes, start: int) -> int | None:
        """Follow the open object through ``data`` from ``start``: where it
        ends (the object then read and closed), or ``None`` if it goes on."""
        found = self._object
        assert found is not None
        skip = start + 1 if self._escaped else start  # a byte escaped at the chunk's end
        self._escaped = False
        for mark in _STRUCTURE.finditer(data, start):
            at = mark.start()
            if at < skip:
                continue
            char = data[at]
            if self._in_string:
                if char == _BACKSLASH:
                    skip = at + 2
                    self._escaped = skip > len(data)
                elif char == _QUOTE:
                    self._in_string = False
            elif char == _QUOTE:
                self._in_string = True
            elif char == _OPEN:
                self._depth += 1
            elif char == _CLOSE:
                self._depth -= 1
                if self._depth == 0:
                    found += data[start : at + 1]
                    self._object = None
                    if len(found) <= MAX_USAGE_BYTES:
                        try:
                            parsed = orjson.loads(found)
                        except orjson.JSONDecodeError:
                            parsed = None  # an unparsable object says nothing
                        if isinstance(parsed, dict):  # later keys over earlier ones
                            self._found.update(parsed)
                    return at + 1
        found += data[start:]
        if len(found) > MAX_USAGE_BYTES:
            self._object = None  # no usage the proxy knows; its bytes are not held
        return None

    def close(self) -> None:
        """The answer ended whole: what it reported becomes :attr:`usage`, and
        the prompt is reported, once."""
        found, self._found = self._found, {}
        timings, self._timings = self._timings, {}
        self._object = None
        reported = read_usage(found, cache_apart=self._apart)
        usage, prompt = reported.usage, reported.prompt
        if usage is None and all(key in timings for key in _TIMINGS_KEYS):
            cached, evaluated = timings[b"cache_n"], timings[b"prompt_n"]
            usage = Usage(evaluated + cached, cached, evaluated, timings.get(b"predicted_n", 0))
            prompt = usage.prompt
        self.usage = usage
        if prompt is not None and self._report is not None:
            self._report(prompt)
