"""The ``llm`` summarizer: asks the upstream for a summary, in the request's own API.

Used by the CLI (``compact --summarizer llm``) and by the server, which hands
it the client's own credentials. The request is as docs/compaction.md ("The
``llm`` summarizer") says: no tools, ``temperature: 0``, the summary budget
as ``max_tokens``, not streamed. Every failure becomes
:class:`~compaction.errors.SummarizationError`, so the pipeline falls back to
the extractive summary — among them a reply cut off at the output limit
(half a summary reads as a whole one, and the span it replaces would be
lost) and a call that outlives its deadline: the transport's timeouts
bound each wait for a byte, so an upstream trickling one byte a second would
otherwise hold the request (and its connection) forever. The deadline is the
configured one until the upstream's speed is measured (:mod:`proxy.upstream.pace`),
then as long as a prompt of that size needs there; a call abandoned at it is
cancelled, its connection closed, so the server stops generating what nobody
will read. On a one-slot server the calls take turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from compaction import Message, Prices, SummarizationError
from proxy.dialects.base import Dialect, clean
from proxy.dialects.chat import CHAT
from proxy.upstream.pace import Pace
from proxy.upstream.transport import Transport, TransportError
from proxy.upstream.usage import NO_USAGE, Usage, read_usage

#: Told of each answered summary call: what it used and what that cost (in
#: plain input tokens) — the proxy's metrics.
Spent = Callable[[Usage, float], object]
#: The tokens of a call whose answer reported no ``usage``: from the messages
#: sent and the reply's text.
Estimate = Callable[[list[Message], str], Awaitable[Usage]]

#: A summary reply above this is not a summary; reading stops there.
MAX_REPLY_BYTES = 4 << 20
#: Why a reply that stopped at the output limit is not used.
SUMMARY_CUT_OFF = "summary cut off at the output limit"
#: Seconds a whole summary call may take unless told otherwise (the server
#: passes ``upstream.summarizer_timeout_seconds``).
DEFAULT_DEADLINE = 120.0


@dataclass(frozen=True)
class Paid:
    """What a summarizer's calls used and cost so far (:attr:`UpstreamSummarizer.paid`)."""

    prompt: int = 0
    output: int = 0
    cost: float = 0.0  #: in plain input tokens
    dollars: float | None = None  #: ``None``: the input price is unknown

    def __sub__(self, before: Paid) -> Paid:
        """What was paid after ``before``."""
        dollars = self.dollars
        if dollars is not None and before.dollars is not None:
            dollars -= before.dollars
        return Paid(
            self.prompt - before.prompt,
            self.output - before.output,
            self.cost - before.cost,
            dollars,
        )


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
        prices: Prices | None = None,
        on_spent: Spent | None = None,
        estimate: Estimate | None = None,
        pace: Pace | None = None,
        one_at_a_time: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._transport = transport
        self._url = base_url.rstrip("/") + dialect.path
        self._model = model
        self._headers = {**(headers or {}), "content-type": "application/json"}
        self._dialect = dialect
        #: Seconds for the whole call: connecting, every read, the one retry —
        #: until ``pace`` has measured the upstream (:meth:`Pace.deadline`).
        self._deadline = deadline
        #: The upstream and model's measured speed, told of every call.
        self._pace = pace
        #: The server serves one request at a time: calls take turns.
        self._one_at_a_time = one_at_a_time and pace is not None
        #: What a call's seconds are read from (by default the pace's clock).
        self._clock = clock or (pace.clock if pace is not None else time.monotonic)
        #: Told of every request sent, before it is sent (the proxy's metric).
        self._on_call = on_call
        #: Told of the messages sent and the prompt tokens the reply's ``usage``
        #: counted for them: a sample of how the upstream counts (the proxy's
        #: calibration), from answers that always carry ``usage``.
        self._on_usage = on_usage
        #: What the calls cost: the upstream's prices, told of each call, and
        #: the count of a call whose answer says nothing (``None``: not counted).
        self._prices = prices
        self._on_spent = on_spent
        self._estimate = estimate
        self.calls = 0
        #: What the summaries so far used, as the upstream's ``usage`` reported
        #: it (or as estimated, for an answer without one), and its price in
        #: plain input tokens: the request's figures.
        self.spent = NO_USAGE
        self.cost = 0.0

    def via(self, transport: Transport) -> UpstreamSummarizer:
        """The same summarizer sending through ``transport`` (the background's own
        pool), with counters of its own."""
        other = copy.copy(self)
        other._transport = transport
        other.calls, other.spent, other.cost = 0, NO_USAGE, 0.0
        return other

    @property
    def tokens(self) -> int:
        """The summaries' tokens so far, prompt and reply."""
        return self.spent.tokens

    @property
    def paid(self) -> Paid:
        dollars = self._prices.dollars(self.cost) if self._prices is not None else None
        return Paid(self.spent.prompt, self.spent.output, self.cost, dollars)

    async def __call__(self, messages: list[Message], max_tokens: int) -> str:
        sent = [clean(m) for m in messages]
        body = self._dialect.summary_request(self._model, sent, max_tokens)
        data = orjson.dumps(body)
        size = len(data)
        pace = self._pace
        turn = pace.one_at_a_time if self._one_at_a_time and pace else contextlib.nullcontext()
        async with turn:
            deadline = pace.deadline(size, self._deadline) if pace else self._deadline
            timer = asyncio.timeout(deadline)
            try:
                async with timer:
                    return await self._ask(sent, body, data)
            except TimeoutError as exc:
                if not timer.expired():
                    raise
                if pace is not None:
                    pace.timed_out(size, deadline)
                raise SummarizationError(
                    f"summarizer timed out: no whole reply within {deadline:g} s"
                ) from exc

    async def _ask(self, sent: list[Message], body: dict[str, Any], data: bytes) -> str:
        status, reply = await self._post(data)
        retry = self._dialect.summary_retry(body, status, reply) if status != 200 else None
        if retry is not None:  # once: a second refusal is the answer
            status, reply = await self._post(orjson.dumps(retry))
        if status != 200:
            text = reply[:300].decode("utf-8", "replace")
            raise SummarizationError(f"summarizer upstream answered {status}: {text}")
        try:
            payload = orjson.loads(reply)
        except orjson.JSONDecodeError as exc:
            raise SummarizationError("summarizer reply is not JSON") from exc
        usage = payload.get("usage") if isinstance(payload, dict) else None
        reported = read_usage(usage, cache_apart=self._dialect.cached_usage_apart)
        used, prompt = reported.usage, reported.prompt
        if self._on_usage is not None and retry is None and prompt:
            await self._on_usage(sent, prompt)
        cut_off = self._dialect.summary_cut_off(payload)
        try:
            text = "" if cut_off else self._dialect.summary_text(payload)
        except SummarizationError:
            await self._count(used, sent, "")  # no summary, but paid for all the same
            raise
        await self._count(used, sent, text)
        if cut_off:
            raise SummarizationError(SUMMARY_CUT_OFF)
        return text

    async def _count(self, used: Usage | None, sent: list[Message], text: str) -> None:
        """What one answered call used (``None``: it said nothing: estimated),
        added up and told."""
        if used is None and self._estimate is not None:
            used = await self._estimate(sent, text)
        if used is None:
            return
        cost = used.cost(self._prices) if self._prices is not None else 0.0
        self.spent += used
        self.cost += cost
        if self._on_spent is not None:
            self._on_spent(used, cost)

    async def _post(self, data: bytes) -> tuple[int, bytes]:
        self.calls += 1
        if self._on_call is not None:
            self._on_call()
        started = self._clock()
        try:
            response = await self._transport.request("POST", self._url, self._headers, data)
            try:
                reply = await response.read(MAX_REPLY_BYTES)
            except BaseException:  # the deadline, or shutdown: the connection is not reused
                response.abort()
                raise
            if response.status == 200 and self._pace is not None:
                self._pace.answered(len(data), self._clock() - started)
            return response.status, reply
        except TransportError as exc:
            raise SummarizationError(f"summarizer request failed: {type(exc).__name__}") from exc
