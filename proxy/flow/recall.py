"""Recall: the model reads back what compaction removed, and the client never sees it.

A brief of a pruned tool output, and a summary's ledger entry of one, end
with ``[ref: …]`` (:mod:`compaction.recall`). When a request that declares
tools goes upstream over such a compaction, the proxy adds one tool of its
own, ``compaction_recall``, at the end of ``tools`` (:func:`plan`). When the
answer calls it, the proxy answers the call from the request itself — the
client sent the original with its history — appends the exchange to what it
sent, and asks again; the client gets the last answer only:

* a whole answer (:func:`whole`) is read, answered and asked again until an
  answer makes no recall, then given with the rounds' usage summed;
* a stream (:class:`RecallRelay`) is relayed event by event as it comes; the
  dialect's :class:`~proxy.dialects.recall.RecallStream` holds back only the
  events of a recall call, and the next round's events continue the same
  client stream.

Bounds, per model (:class:`compaction.Profile`): ``recall_rounds`` answered
rounds (the last follow-up no longer offers the recall tool, so the client
gets an answer or a call to one of its own tools, never one to a tool it
never declared), ``recall_slice_chars``
per answer, ``recall_max_tokens`` added to a request over all its rounds (the
model's turns and the tool's answers) — and never more than the room the
request has left under its input limit. An unknown
ref, or one of another caller (refs are keyed by the caller), is answered
"not found" alike.

The exchange is remembered (:mod:`proxy.state.recalls`) and put back on the
conversation's next request at the place it had, so the model does not ask
again and the bytes sent extend those sent before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from compaction import (
    Message,
    RecallRequest,
    TokenCounter,
    find_original,
    message_text,
    parse_request,
    recalled_text,
)
from proxy.dialects.recall import RecallCall, RecallStream, RecallSurface, Usage
from proxy.edge.errors import ProxyError
from proxy.flow.read import Call
from proxy.flow.record import cut_stream
from proxy.flow.send import dropped_event, log_broken, log_cut, read_whole, relay_bytes, shown_url
from proxy.flow.services import Services
from proxy.flow.stream_end import StreamEnd
from proxy.flow.usage import UsageTap
from proxy.session.conversation import Resolved, recall_salt
from proxy.state.logs import REQUESTS
from proxy.state.stores import Event
from proxy.upstream.transport import BodyLost, UpstreamResponse

logger = logging.getLogger(__name__)
#: The one line per request that recalled, beside the request's own.
requests_log = logging.getLogger(REQUESTS)

#: The marker every ref is written with (:data:`compaction.recall.REF_PATTERN`).
_REF_MARK = "[ref: "
#: Recalled text too short to be worth a round is not sent: the model is told
#: the budget is spent instead.
_MIN_ROOM = 64

#: Sends one follow-up request upstream (the handler's ``_send``, timed and counted).
Sender = Callable[[bytes], Awaitable[UpstreamResponse]]


class RecallLimit(ProxyError):
    """The upstream went on calling ``compaction_recall`` in the last round,
    which no longer offered it, or its calling turn left no room for another
    round: there is no answer to give.

    Its message, like :class:`RecallFailed`'s, never names the tool or a ref:
    the client never declared either."""

    status = 502
    type = "upstream_error"
    code = "recall_limit"


class RecallFailed(ProxyError):
    """The upstream refused a follow-up round (its body, which may quote the
    hidden tool's exchange, is logged by status only and never relayed)."""

    status = 502
    type = "upstream_error"
    code = "recall_failed"

    def __init__(self, status: int) -> None:
        super().__init__(f"The upstream refused a follow-up request ({status}).")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A request that goes upstream with the recall tool."""

    surface: RecallSurface
    body: dict[str, Any]  #: the first round's request
    messages: list[Message]  #: the client's conversation as the engine read it
    salt: str
    owner: str
    #: Tokens the tool and the exchanges put back add to the compaction's count.
    extra_tokens: int
    #: Tokens the rounds may add to this request, all together (the model's
    #: turns and the tool's answers): ``recall_max_tokens``, within the room
    #: left under the input limit.
    room: int
    rounds: int  #: recall rounds the model may have
    slice_chars: int
    restored: int  #: remembered exchanges put back


def plan(
    call: Call,
    resolved: Resolved,
    body: dict[str, Any],
) -> Plan | None:
    """The request to send with the recall tool, or ``None`` to send ``body`` as
    it is: recall off for the model, nothing in the request was shortened with
    a ref, no tools declared, the last turn not the user's, or no room left
    under the input limit for the tool itself."""
    profile = call.config.profile
    if not profile.recall or resolved.untouched:
        return None
    surface: RecallSurface = call.dialect.recall
    tooled = surface.with_tool(body)
    if tooled is None or not _has_refs(resolved.messages):
        return None
    items = tooled.get(surface.items_key)
    if not isinstance(items, list) or not items or _assistant_last(items):
        return None
    services = call.services
    restored = services.conversations.recalls.restore(call.owner, items)
    counter = services.conversations.counter(call.config)
    # The tool's tokens were held back from the budget (tool_tokens): the
    # room under the limit is theirs, so the tool always fits.
    extra = _counted_tool(counter, orjson.dumps(tooled["tools"][-1]))
    left = resolved.result.input_limit - resolved.result.tokens_after + extra
    put_back = sum(counter.count_text(orjson.dumps(item).decode()) for item in restored.added)
    if put_back > left - extra:
        # The exchanges put back do not fit: sent without them (the model may
        # recall again), which is what the compaction counted.
        restored = dataclasses.replace(restored, items=items, exchanges=())
        put_back = 0
    extra += put_back
    room = left - extra
    if room < 0:
        return None
    if restored.exchanges:
        tooled = {**tooled, surface.items_key: restored.items}
    return Plan(
        surface=surface,
        body=tooled,
        messages=call.messages,
        salt=recall_salt(call.scope),
        owner=call.owner,
        extra_tokens=extra,
        room=min(room, profile.recall_max_tokens),
        rounds=profile.recall_rounds,
        slice_chars=profile.recall_slice_chars,
        restored=len(restored.exchanges),
    )


def tool_tokens(call: Call) -> int:
    """The recall tool's tokens, where it may join this request once compacted
    (recall on, tools declared): held back from the request's budget from the
    start, so that the tools block never changes between two compactions.
    Added only while it fits (:func:`plan`), the tool would leave again as the
    conversation grew towards the trigger, and each leaving and coming back
    would rewrite the provider's whole prompt cache."""
    if not call.config.profile.recall:
        return 0
    body = call.original if call.original is not None else call.body
    tooled = call.dialect.recall.with_tool(body)
    if tooled is None:
        return 0
    return _counted_tool(
        call.services.conversations.counter(call.config), orjson.dumps(tooled["tools"][-1])
    )


@functools.lru_cache(maxsize=16)
def _counted_tool(counter: TokenCounter, tool: bytes) -> int:
    """A recall tool's tokens: the same few bytes per API and counter, counted once."""
    return counter.count_text(tool.decode())


def _has_refs(messages: Sequence[Message]) -> bool:
    """Whether any message the request sends carries a ref (a brief, a ledger)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            if _REF_MARK in content:
                return True
        elif _REF_MARK in message_text(message):
            return True
    return False


def _assistant_last(items: list[Any]) -> bool:
    """Whether the conversation ends on the model's turn (a prefill): a recall
    exchange appended after it would put two model turns in a row."""
    last = items[-1]
    return isinstance(last, dict) and last.get("role") == "assistant"


# --- answering the calls ----------------------------------------------------


@dataclasses.dataclass
class Rounds:
    """The recall rounds of one request: what was answered, and what is left."""

    plan: Plan
    counter: TokenCounter
    #: The request sent in the current round, and the exchanges appended so far.
    body: dict[str, Any]
    exchanges: list[Any] = dataclasses.field(default_factory=list)
    answered: int = 0  #: rounds answered
    outcomes: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Tokens the rounds added to the request: the model's turns and the
    #: tool's answers (held to ``plan.room``).
    used: int = 0
    earlier: Usage = dataclasses.field(default_factory=Usage)

    @property
    def exhausted(self) -> bool:
        return self.answered >= self.plan.rounds

    def count(self, outcome: str, n: int = 1) -> None:
        if n:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n

    def answer(self, calls: Sequence[RecallCall]) -> list[tuple[RecallCall, str]]:
        """What the tool says to each call."""
        return [(call, self._one(call)) for call in calls]

    def _one(self, call: RecallCall) -> str:
        request = parse_request(call.arguments)
        if isinstance(request, str):
            self.count("invalid")
            return request
        left = self.plan.room - self.used
        if left < _MIN_ROOM:
            self.count("budget")
            return (
                "The recall budget of this turn is spent; go on with what you have, "
                "or recall a smaller line range next turn."
            )
        original = find_original(self.plan.messages, self.plan.salt, request.ref)
        text = self._within(original, request, left)
        self.count("answered" if original is not None else "not_found")
        self.used += self.counter.count_text(text)
        return text

    def _within(self, original: str | None, request: RecallRequest, left: int) -> str:
        """The answer to ``request``, cut to the tokens ``left``."""
        chars = self.plan.slice_chars
        text = recalled_text(original, request, chars)
        tokens = self.counter.count_text(text)
        while tokens > left and chars > 200:
            chars = max(200, int(chars * left / tokens * 0.9))
            text = recalled_text(original, request, chars)
            tokens = self.counter.count_text(text)
        return text

    def follow(self, answer: dict[str, Any], calls: Sequence[RecallCall]) -> bytes:
        """The next round's request: the exchange appended, and — on the last
        round the model may have — no more tool calls allowed.

        The model's turn is appended with the answers, so it is counted
        against the room first; the answers get what is left.
        """
        surface = self.plan.surface
        _, bare = surface.followup(self.body, answer, [(call, "") for call in calls])
        self.used += sum(self.counter.count_text(orjson.dumps(item).decode()) for item in bare)
        if self.used > self.plan.room:
            raise RecallLimit(
                "The model's turn leaves no room under the request's limits for another round."
            )
        results = self.answer(calls)
        self.answered += 1
        self.earlier = self.earlier + surface.usage(answer)
        body, added = surface.followup(self.body, answer, results)
        self.exchanges.extend(added)
        self.body = body
        if self.exhausted:
            body = surface.without_tool(body)
        return orjson.dumps(body)

    def remember(self, services: Services) -> None:
        """Keep the exchanges for the conversation's next turn."""
        if not self.exchanges:
            return
        items = self.plan.body[self.plan.surface.items_key]
        services.conversations.recalls.remember(self.plan.owner, items, self.exchanges)

    async def report(self, call: Call, resolved: Resolved) -> None:
        """The metric and the event of what was recalled (nothing when nothing was)."""
        if not self.outcomes:
            return
        services = call.services
        for outcome, n in self.outcomes.items():
            services.observed.metrics.recalls.labels(call.dialect.name, outcome).inc(n)
        checkpoint = resolved.checkpoint
        event = Event(
            # Its own id: a recall is no step of the compaction that made the refs.
            compaction_id=uuid.uuid4().hex,
            type="context.recalled",
            session=resolved.session,
            model=call.config.model,
            reason="recall",
            instance=services.conversations.instance,
            checkpoint_id=checkpoint.id if checkpoint is not None else None,
            owner=call.owner,
            notes=tuple(f"{outcome}: {n}" for outcome, n in sorted(self.outcomes.items())),
        )
        fields: dict[str, object] = {"api": call.dialect.name, "model": call.config.model or "-"}
        fields.update({"rounds": self.answered, **self.outcomes})
        requests_log.info("recall", extra={"fields": fields})
        await services.conversations.store.add_event(event)


def rounds_of(call: Call, plan: Plan) -> Rounds:
    return Rounds(
        plan=plan, counter=call.services.conversations.counter(call.config), body=plan.body
    )


# --- a whole answer -----------------------------------------------------------


async def whole(
    call: Call,
    rounds: Rounds,
    upstream: UpstreamResponse,
    send: Sender,
    headers: dict[str, str],
    tap: UsageTap,
) -> Response:
    """The client's answer to a non-streamed request sent with the recall tool."""
    surface = rounds.plan.surface
    first = True
    while True:
        raw = await read_whole(upstream)
        if first:
            tap.feed(raw)
            tap.close()
        if upstream.status != 200:
            if first:
                return relay_bytes(upstream, raw, headers)
            raise _refused(upstream)
        answer = _json(raw)
        calls = surface.calls(answer) if answer is not None else []
        if answer is None or not calls:
            rounds.remember(call.services)
            if answer is None or not rounds.answered:
                return relay_bytes(upstream, raw, headers)
            final = orjson.dumps(surface.final(answer, rounds.earlier))
            response = relay_bytes(upstream, final, headers)
            return response
        if rounds.exhausted:
            rounds.count("limit", len(calls))
            raise RecallLimit(_PAST_LIMIT)
        upstream = await send(rounds.follow(answer, calls))
        first = False


#: What the client is told when the model recalled past the last round.
_PAST_LIMIT = "The upstream called a tool the last request no longer offered."


def _refused(upstream: UpstreamResponse) -> RecallFailed:
    """The error for a follow-up round the upstream refused, logged by status."""
    fields = {"status": upstream.status, "upstream": shown_url(upstream.url)}
    logger.warning("upstream refused a recall round", extra={"fields": fields})
    return RecallFailed(upstream.status)


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


# --- a stream -------------------------------------------------------------------


class RecallRelay(Response):
    """A streamed answer over recall rounds, relayed as one client stream.

    The first round's head (status, headers) is the client's. Each round's
    chunks go through the dialect's reader; when a round ends on a recall,
    the calls are answered and the next round asked, its events continuing the
    stream. A round that fails — the upstream unreachable, an error status, a
    body that breaks — ends the client's stream with the API's error event.
    """

    def __init__(
        self,
        call: Call,
        rounds: Rounds,
        upstream: UpstreamResponse,
        send: Sender,
        headers: list[tuple[bytes, bytes]],
        tap: UsageTap,
        resolved: Resolved,
    ) -> None:
        self.call = call
        self.resolved = resolved
        self.rounds = rounds
        self.upstream = upstream
        self._send_upstream = send
        self.status_code = upstream.status
        self.raw_headers = headers
        self.background = None
        self.tap = tap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(self._watch(receive, gone))
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            stream = self.rounds.plan.surface.stream()
            finished = await self._rounds(stream, send, gone)
            if finished:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            self.upstream.abort()  # nothing when its body was read to the end
            await self.rounds.report(self.call, self.resolved)

    async def _watch(self, receive: Receive, gone: asyncio.Event) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
                self.upstream.abort()
                return

    async def _rounds(self, stream: RecallStream, send: Send, gone: asyncio.Event) -> bool:
        """Relay every round; whether the stream ended cleanly."""
        rounds, surface = self.rounds, self.rounds.plan.surface
        first = True
        while True:
            ended = await self._relay_round(stream, send, tap=first)
            if ended != "ended":
                return ended == "cut"  # a cut round's error event ends the stream
            first = False
            rounds.count("dropped", stream.dropped)
            if not stream.recalled:
                rounds.remember(self.call.services)
                return True
            if gone.is_set():
                return False
            answer = stream.answer()
            calls = surface.calls(answer)
            if rounds.exhausted or not calls:
                rounds.count("limit", len(calls))
                await self._error(send, _PAST_LIMIT, RecallLimit.code)
                return True
            try:
                body = rounds.follow(answer, calls)
                self.upstream = await self._send_upstream(body)
            except ProxyError as exc:
                await self._error(send, exc.message, exc.code or "recall_failed")
                return True
            if self.upstream.status != 200:
                refused = _refused(self.upstream)
                await self._error(send, refused.message, refused.code or "recall_failed")
                return True
            stream.next_round()

    async def _relay_round(
        self, stream: RecallStream, send: Send, *, tap: bool
    ) -> Literal["ended", "broken", "cut"]:
        """Relay the current round; how its stream ended: as its API ends one,
        broken off (the response is left unfinished), or closed before its
        end (the client's stream ends with the error event)."""
        upstream = self.upstream
        watch = StreamEnd.of(self.call.dialect.name)
        while True:
            try:
                chunk = await upstream.next_chunk()
            except BodyLost as exc:
                log_broken(exc, upstream.url)
                event = dropped_event(self.call.dialect, lost=True)
                await send({"type": "http.response.body", "body": event, "more_body": True})
                return "broken"
            if chunk is None:
                if tap:
                    self.tap.close()
                rest = stream.end()
                if rest:
                    await send({"type": "http.response.body", "body": rest, "more_body": True})
                if watch is not None and not watch.ended:
                    await self._cut(send)
                    return "cut"
                return "ended"
            if watch is not None:
                watch.feed(chunk)
            if tap:
                self.tap.feed(chunk)
            out = stream.feed(chunk)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})

    async def _cut(self, send: Send) -> None:
        """A round whose stream closed before its API's end: counted and logged
        as the upstream error it is, and the client's stream ended with the
        error event (what was relayed of it cannot be taken back, and a
        round cut short cannot be answered)."""
        cut_stream(self.call)
        log_cut(self.upstream.url, self.call.dialect.name)
        event = dropped_event(self.call.dialect, lost=False)
        await send({"type": "http.response.body", "body": event, "more_body": True})

    async def _error(self, send: Send, message: str, code: str = "recall_failed") -> None:
        """The stream ends with the API's error event: ``recall_limit`` when the
        model went on recalling past the last round (what a whole answer's 502
        says too), ``recall_failed`` when a round could not be asked."""
        event = self.call.dialect.error_event(message, code)
        await send({"type": "http.response.body", "body": event, "more_body": True})


__all__ = [
    "Plan",
    "RecallFailed",
    "RecallLimit",
    "RecallRelay",
    "Rounds",
    "plan",
    "rounds_of",
    "whole",
]
