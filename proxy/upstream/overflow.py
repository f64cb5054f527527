"""Recognizing an upstream's "the prompt is too long" error.

Every provider words it differently. One table holds the wordings; each entry
may capture the context window the error states (``limit``), which the proxy
then uses as the budget for the retry and remembers for the model.

Only client-error statuses and the 500s some local servers use are looked at;
429 (rate limits, including "request too large … tokens per minute") never
counts as an overflow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

_NUMBER = r"(?P<limit>\d[\d,]*)"


@dataclass(frozen=True)
class OverflowPattern:
    provider: str
    regex: re.Pattern[str]


@dataclass(frozen=True)
class Overflow:
    """A recognized context-length error; ``limit`` is the window it states, if
    any, and ``count`` the upstream's own count of the prompt, if it states one."""

    provider: str
    limit: int | None
    count: int | None = None


def _p(provider: str, pattern: str) -> OverflowPattern:
    return OverflowPattern(provider, re.compile(pattern, re.IGNORECASE))


#: Most specific first; the first match wins.
PATTERNS: tuple[OverflowPattern, ...] = (
    # OpenAI, Azure OpenAI, vLLM (older), DeepSeek, Groq, OpenRouter, Together…
    _p("openai-compatible", rf"maximum context length is {_NUMBER} tokens"),
    # vLLM (newer)
    _p("vllm", rf"longer than the maximum model length of {_NUMBER}"),
    # llama.cpp server, newer and older wordings
    _p("llama.cpp", rf"exceeds the available context size \({_NUMBER} tokens\)"),
    _p("llama.cpp", r"exceeds the available context size"),
    _p("llama.cpp", r"context size has been exceeded"),
    # LM Studio
    _p("lm-studio", rf"context length of only {_NUMBER} tokens"),
    _p("lm-studio", rf"n_keep: \d+\s*>=\s*n_ctx: {_NUMBER}"),
    _p("lm-studio", r"tokens to keep from the initial prompt is greater than the context length"),
    # Mistral
    _p("mistral", rf"too large for model with {_NUMBER} maximum context length"),
    # Anthropic-compatible gateways
    _p("anthropic", rf"prompt is too long: \d[\d,]* tokens > {_NUMBER} maximum"),
    _p("anthropic", r"prompt is too long"),
    # Gemini-compatible gateways
    _p("gemini", rf"exceeds the maximum number of tokens allowed \({_NUMBER}\)"),
    # Hugging Face TGI
    _p("tgi", rf"`inputs` tokens \+ `max_new_tokens` must be <= {_NUMBER}"),
    # Ollama
    _p("ollama", r"(input|prompt) (length )?exceeds (the )?(maximum )?context length"),
    _p("ollama", r"prompt too long; exceeded (max )?context length"),
    # OpenAI (newer wording), Groq and generic gateways
    _p("openai", r"input exceeds the context window"),
    _p("generic", r"context[_ ]length[_ ]exceeded|context window (is )?exceeded"),
    _p("generic", r"maximum context length"),
)

#: Where an error states the upstream's own count of the prompt that failed.
#: vLLM's "you requested N tokens (M in the messages, K in the completion)"
#: counts the reply too: its messages figure is taken.
COUNT_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"\((?P<count>\d[\d,]*) in the messages",
        r"your messages resulted in (?P<count>\d[\d,]*) tokens",
        r"prompt is too long: (?P<count>\d[\d,]*) tokens",
        r"(?:input|prompt) (?:length|of) (?P<count>\d[\d,]*) tokens",
        r"requested (?P<count>\d[\d,]*) tokens",
    )
)

#: Error codes / types that mean an overflow whatever the message says.
#: Anthropic's 413 ``request_too_large`` is about bytes, not tokens, but a
#: smaller conversation is the cure all the same.
OVERFLOW_CODES = frozenset(
    {"context_length_exceeded", "exceed_context_size_error", "request_too_large"}
)
_STATUSES = frozenset({400, 413, 422, 500})


@dataclass(frozen=True)
class _Fields:
    message: str = ""
    codes: frozenset[str] = frozenset()
    n_ctx: int | None = None  #: llama.cpp states its window as a field
    n_prompt: int | None = None  #: … and its count of the prompt


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _fields(body: Any) -> _Fields:
    """The message text, codes/types and stated figures of an error body of any common shape."""
    if not isinstance(body, dict):
        return _Fields()
    error = body.get("error", body)
    if isinstance(error, str):
        return _Fields(error)
    if not isinstance(error, dict):
        return _Fields()
    parts = [str(error.get(key)) for key in ("message", "detail") if error.get(key)]
    if isinstance(body.get("detail"), str):
        parts.append(body["detail"])
    codes = frozenset(str(error[k]) for k in ("code", "type") if isinstance(error.get(k), str))
    return _Fields(
        " ".join(parts),
        codes,
        _positive(error.get("n_ctx")),
        _positive(error.get("n_prompt_tokens")),
    )


def _stated_count(message: str, echoed: bytes) -> int | None:
    for pattern in COUNT_PATTERNS:
        match = pattern.search(message)
        if match and not _quoted(match, echoed):
            return int(match.group("count").replace(",", ""))
    return None


def _quoted(match: re.Match[str], echoed: bytes) -> bool:
    """Whether the matched words stand in the (lower-cased) request that was sent."""
    return bool(echoed) and match.group(0).lower().encode() in echoed


def detect_overflow(status: int, body: bytes, sent: bytes = b"") -> Overflow | None:
    """The overflow this error response reports, or ``None`` if it is another error.

    ``sent`` is the request the error answers: wording found in it is the
    client's own text echoed back (validation errors quote their input), not
    the upstream's verdict, and is not taken for an overflow.
    """
    if status not in _STATUSES:
        return None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    fields = _fields(parsed)
    message = fields.message or body[:4000].decode("utf-8", "replace")
    count = fields.n_prompt or _stated_count(message, sent.lower())
    echoed = sent.lower()
    for pattern in PATTERNS:
        match = pattern.regex.search(message)
        if match and _quoted(match, echoed):
            # The request's own words, quoted back: no figure in them is the
            # upstream's. Only an error code can still say it overflowed.
            if fields.codes & OVERFLOW_CODES:
                return Overflow(pattern.provider, None, None)
            return None
        if match:
            limit = match.groupdict().get("limit")
            stated = int(limit.replace(",", "")) if limit else fields.n_ctx
            return Overflow(pattern.provider, stated, count)
    if fields.codes & OVERFLOW_CODES:
        return Overflow("openai-compatible", fields.n_ctx, count)
    return None
