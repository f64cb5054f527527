"""The ``llm`` summarizer: asks the upstream for a summary, in the request's own API.

Used by the CLI (``compact --summarizer llm``) and by the server, which hands
it the client's own credentials. The request follows DESIGN.md §6: no tools,
``temperature: 0``, the summary budget as ``max_tokens``, not streamed. Every
failure becomes :class:`~compaction.errors.SummarizationError`, so the
pipeline falls back to the extractive summary — among them a reply cut off at
the output limit (half a summary reads as a whole one, and the span it
replaces would be lost) and a call that outlives its ``deadline``: the
transport's timeouts bound each wait for a byte, so an upstream trickling one
byte a second would otherwise hold the request (and its connection) forever.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from compaction import Message, SummarizationError
from proxy.dialects.base import Dialect, clean
from proxy.dialects.chat import CHAT
from proxy.upstream.transport import Transport, TransportError

#: A summary reply above this is not a summary; reading stops there.
MAX_REPLY_BYTES = 4 << 20
#: Why a reply that stopped at the output limit is not used.
SUMMARY_CUT_OFF = "summary cut off at the output limit"
#: Seconds a whole summary call may take unless told otherwise (the server
#: passes ``upstream.summarizer_timeout_seconds``).
DEFAULT_DEADLINE = 120.0


class UpstreamSummarizer:
    """A :class:`compaction.types.Summarizer` asking ``POST {base_url}{dialect.path}``.

    The summary is asked in the API of the request it serves (``dialect``:
    Chat Completions by default; Anthropic Messages, OpenAI Responses), with
    that request's own key — so a Claude-only or Responses-only key works.
    """

    def __init__(
        self,
        transport: Transport,
        base_url: str,
        model: str,
        headers: Mapping[str, str] | None = None,
        *,
        dialect: Dialect = CHAT,
        on_call: Callable[[], object] | None = None,
        deadline: float = DEFAULT_DEADLINE,
        on_usage: Callable[[list[Message], int], Awaitable[object]] | None = None,
    ) -> None:
        self._transport = transport
        self._url = base_url.rstrip("/") + dialect.path
        self._model = model
        self._headers = {**(headers or {}), "content-type": "application/json"}
        self._dialect = dialect
        #: Seconds for the whole call: connecting, every read, the one retry.
        self._deadline = deadline
        #: Told of every request sent, before it is sent (the proxy's metric).
        self._on_call = on_call
        #: Told of the messages sent and the prompt tokens the reply's ``usage``
        #: counted for them: a sample of how the upstream counts (the proxy's
        #: calibration), from answers that always carry ``usage``.
        self._on_usage = on_usage
        self.calls = 0
        #: Tokens the upstream's ``usage`` reported for the summaries so far
        #: (prompt and reply), for the dashboard's figures.
        self.tokens = 0

    def via(self, transport: Transport) -> UpstreamSummarizer:
        """The same summarizer sending through ``transport`` (the background's own
        pool), with counters of its own."""
        other = copy.copy(self)
        other._transport = transport
        other.calls = other.tokens = 0
        return other

    async def __call__(self, messages: list[Message], max_tokens: int) -> str:
        timer = asyncio.timeout(self._deadline)
        try:
            async with timer:
                return await self._ask(messages, max_tokens)
        except TimeoutError as exc:
            if not timer.expired():
                raise
            raise SummarizationError(
                f"summarizer timed out: no whole reply within {self._deadline:g} s"
            ) from exc

    async def _ask(self, messages: list[Message], max_tokens: int) -> str:
        sent = [clean(m) for m in messages]
        body = self._dialect.summary_request(self._model, sent, max_tokens)
        status, reply = await self._post(body)
        retry = self._dialect.summary_retry(body, status, reply) if status != 200 else None
        if retry is not None:  # once: a second refusal is the answer
            status, reply = await self._post(retry)
        if status != 200:
            text = reply[:300].decode("utf-8", "replace")
            raise SummarizationError(f"summarizer upstream answered {status}: {text}")
        try:
            payload = orjson.loads(reply)
        except orjson.JSONDecodeError as exc:
            raise SummarizationError("summarizer reply is not JSON") from exc
        self.tokens += reported_tokens(payload)
        prompt = reported_prompt_tokens(payload)
        if self._on_usage is not None and retry is None and prompt:
            await self._on_usage(sent, prompt)
        if self._dialect.summary_cut_off(payload):
            raise SummarizationError(SUMMARY_CUT_OFF)
        return self._dialect.summary_text(payload)

    async def _post(self, body: dict[str, Any]) -> tuple[int, bytes]:
        self.calls += 1
        if self._on_call is not None:
            self._on_call()
        try:
            response = await self._transport.request(
                "POST", self._url, self._headers, orjson.dumps(body)
            )
            try:
                return response.status, await response.read(MAX_REPLY_BYTES)
            except BaseException:  # the deadline, or shutdown: the connection is not reused
                response.abort()
                raise
        except TransportError as exc:
            raise SummarizationError(f"summarizer request failed: {type(exc).__name__}") from exc


#: Anthropic's prompt tokens read from or written to its cache, which its
#: ``input_tokens`` leaves out.
_ANTHROPIC_CACHED = ("cache_read_input_tokens", "cache_creation_input_tokens")


def reported_prompt_tokens(payload: Any) -> int:
    """The prompt tokens a reply's ``usage`` reports (``prompt_tokens``, or
    ``input_tokens`` with Anthropic's cached parts); 0 when it reports none."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return 0
    names = ("prompt_tokens", "input_tokens", *_ANTHROPIC_CACHED)
    counts = (usage.get(name) for name in names)
    return sum(n for n in counts if isinstance(n, int) and not isinstance(n, bool) and n > 0)


def reported_tokens(payload: Any) -> int:
    """The tokens a reply's ``usage`` reports, prompt and reply: ``prompt_tokens`` and
    ``completion_tokens`` (Chat Completions), ``input_tokens`` and ``output_tokens``
    (Messages, Responses); 0 when it reports none."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return 0
    names = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
    counts = (usage.get(name) for name in names)
    return sum(n for n in counts if isinstance(n, int) and not isinstance(n, bool) and n > 0)
