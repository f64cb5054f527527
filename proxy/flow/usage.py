"""The upstream's own count of a prompt, read off its answer as it passes.

OpenAI-style answers carry ``usage.prompt_tokens`` (Anthropic and Responses
``input_tokens``): in a JSON answer, and in the last event of a stream whose
client asked for ``stream_options.include_usage``. The proxy compares that
count with its estimate to calibrate its budgets
(:func:`compaction.calibrate`).

Where an answer has no ``usage``, the llama.cpp server's ``timings`` (in its
JSON answers and in the last event of its streams) count the prompt too: its
``prompt_n`` is only the part it evaluated, ``cache_n`` the part it reused
from its cache, so the prompt is their sum — counted only when both are
there: ``prompt_n`` alone (servers older than ``cache_n``) would give a
resent conversation's new turn for its whole prompt. ``usage`` is preferred
where both are present. (llama-cpp-python's streams carry neither: its non-streamed
answers, and the summaries the proxy asks, calibrate it.)

The bytes are only looked at, never changed or held: a tap sees each chunk
once, searching it (with the end of the previous one, for a key split across
chunks) for the key. A model's text cannot fake it: inside a JSON string the
quotes around the key would be escaped.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_PROMPT_TOKENS = re.compile(rb'"(?:prompt_tokens|input_tokens)"\s*:\s*(\d{1,9})\b')
#: Anthropic's prompt tokens served from or written to its cache, which its
#: ``input_tokens`` leaves out: the prompt is the sum.
_CACHED_TOKENS = re.compile(
    rb'"(cache_read_input_tokens|cache_creation_input_tokens)"\s*:\s*(\d{1,9})\b'
)
#: llama.cpp's ``timings``: the evaluated and the reused parts of the prompt.
_TIMINGS = re.compile(rb'"(prompt_n|cache_n)"\s*:\s*(\d{1,9})\b')
_TIMINGS_KEYS = (b"prompt_n", b"cache_n")
#: Bytes of one chunk kept to find a key that the next chunk completes.
_CARRY = 48


class UsageTap:
    """Watches an answer's chunks; :meth:`close` reports the last count found."""

    __slots__ = ("_cached", "_carry", "_found", "_report", "_timings")

    def __init__(self, report: Callable[[int], None], *, cached: bool = False) -> None:
        self._report = report
        self._carry = b""
        self._found: int | None = None
        #: With ``cached`` (Anthropic), the cache counts by key, added to the total.
        self._cached: dict[bytes, int] | None = {} if cached else None
        #: The last ``prompt_n`` and ``cache_n`` seen, by key.
        self._timings: dict[bytes, int] = {}

    def feed(self, chunk: bytes) -> None:
        data = self._carry + chunk
        if b"_tokens" in data:
            for match in _PROMPT_TOKENS.finditer(data):
                self._found = int(match.group(1))
            if self._cached is not None:
                for match in _CACHED_TOKENS.finditer(data):
                    self._cached[match.group(1)] = int(match.group(2))
        if b'_n"' in data:
            for match in _TIMINGS.finditer(data):
                self._timings[match.group(1)] = int(match.group(2))
        self._carry = data[-_CARRY:]

    def close(self) -> None:
        """The answer ended whole: report what was found, once."""
        found, self._found = self._found, None
        timings, self._timings = self._timings, {}
        if found is not None:
            self._report(found + sum((self._cached or {}).values()))
        elif len(timings) == len(_TIMINGS_KEYS):
            self._report(sum(timings.values()))
