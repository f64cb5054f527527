"""One request being answered: the :class:`Exchange` the handler keeps beside its Call.

A :class:`~proxy.flow.read.Call` is plain data, what the client asked. What
serves it is here: the services, the client's watch (a client that leaves
cancels what the request is waiting for upstream), when the request began,
and :class:`~proxy.flow.answered.bill.Spent`, what its work beside the answer
spent. Its methods are the acts the handler's steps (:mod:`proxy.flow.handler`)
are made of: the conversation compacted (:meth:`Exchange.compact_for`), the
request to send (``outgoing``), sent (``send``), the answer's usage read
(``usage_tap``), a cut stream asked again (``cut``), the response's headers;
and :class:`FollowUps`, the way a recalling answer's next rounds are sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time

import orjson

from compaction import (
    Budget,
    CannotFitError,
    InvalidMessagesError,
    Reason,
)
from proxy.edge.body import deep_nesting_refused
from proxy.edge.disconnect import ClientWatch
from proxy.edge.errors import (
    BadRequest,
    ContextLengthExceeded,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from proxy.flow import recall
from proxy.flow.answered.bill import Spent, spent_headers
from proxy.flow.answered.record import cut_stream
from proxy.flow.read import Call
from proxy.flow.relay import Cut
from proxy.flow.send import send
from proxy.flow.services import Services
from proxy.flow.summaries import summarizer_for
from proxy.flow.usage import UsageTap
from proxy.session.conversation import Resolved, compact_if_needed
from proxy.session.untouched import as_sent
from proxy.upstream.transport import UpstreamResponse


@dataclasses.dataclass
class Exchange:
    """One request being answered, as the handler holds it beside its
    :class:`Call` (which stays the plain description of what was asked): the
    services that serve it, the client's watch (a client that leaves cancels
    what the request is waiting for upstream), what its work beside the answer
    spent, and when it began."""

    services: Services
    started: float
    watch: ClientWatch | None = None
    spent: Spent = dataclasses.field(default_factory=Spent)

    def cut(self, call: Call, body: bytes) -> Cut:
        """A stream that closes before its API's end: an upstream error, counted
        as one, and ``body`` sent once more while the client has seen none of it."""
        count = functools.partial(cut_stream, self.services.observed.metrics, self.spent)
        return Cut(count, functools.partial(self.send, call, body))

    def outgoing(self, call: Call, resolved: Resolved) -> tuple[bytes, recall.Plan | None]:
        """The request to send, and how it recalls, when it goes with the recall tool."""
        if call.unchanged(resolved):
            return call.raw, None  # nothing changed: the client's own bytes
        body = call.outgoing(resolved)
        if not call.config.profile.recall:
            return orjson.dumps(body), None
        plan = recall.plan(self.services.conversations, call, resolved, body)
        return orjson.dumps(body if plan is None else plan.body), plan

    def usage_tap(
        self, call: Call, resolved: Resolved, recalling: recall.Plan | None = None
    ) -> UsageTap:
        """Learns the upstream's ratio from the ``usage`` of the answer (its first
        round's, with the recall tool and the exchanges put back counted in)."""
        estimate = resolved.result.tokens_after
        if recalling is not None:
            estimate += recalling.extra_tokens
        observe = functools.partial(
            self.services.conversations.models.observe, call.config, estimate, owner=call.owner
        )
        return UsageTap(observe, cached=call.dialect.cached_usage_apart)

    async def compact_for(
        self,
        call: Call,
        *,
        reason: Reason,
        budget: Budget | None = None,
        instructions: str | None = None,
        store: bool = True,
    ) -> Resolved:
        """The request's conversation as it is to be sent: as it came when it is far
        under its trigger (:func:`proxy.session.untouched.as_sent`, most requests:
        no summarizer is built for them), else decided once and compacted if
        needed (:func:`proxy.session.conversation.compact_if_needed`), the
        engine's refusals turned into the client's errors."""
        conversations = self.services.conversations
        held_back = recall.tool_tokens(conversations, call)
        if reason == "threshold" and budget is None and store:
            with deep_nesting_refused():  # messages nested deeper than orjson writes
                as_it_came = await as_sent(conversations, call, held_back=held_back)
            if as_it_came is not None:
                return as_it_came
        llm = call.config.profile.summarizer == "llm"
        summarizer = summarizer_for(self.services, call) if llm else None
        try:
            with deep_nesting_refused():
                return await compact_if_needed(
                    conversations,
                    call,
                    summarizer,
                    reason=reason,
                    instructions=instructions,
                    budget=budget,
                    held_back=held_back,
                    prices=call.prices(),
                    store=store,
                )
        except CannotFitError as exc:
            if exc.part == "output":  # the output asked for leaves the input no room at all
                raise _output_takes_the_window(call, exc) from exc
            advice = (
                "Shorten the system prompt, the first messages or the tool schemas, or lower "
                "max_tokens."
                if exc.part == "head"
                else "Shorten the latest message, or lower max_tokens."
            )
            raise ContextLengthExceeded(
                f"This request cannot be made to fit the model's context window: {exc}. {advice}",
                param="messages",
            ) from exc
        except InvalidMessagesError as exc:
            raise BadRequest(f"Invalid {exc.where}: {exc.problem}.", param=exc.where) from exc
        finally:
            # Read before anything else runs: a compaction this request started in
            # the background uses the same summarizer, and is recorded on its own.
            if summarizer is not None:
                spent = self.spent
                spent.summarizer_tokens += summarizer.tokens
                spent.summarizer_calls += summarizer.calls
                spent.summarizer += summarizer.spent
                spent.summarizer_cost += summarizer.cost

    async def send(self, call: Call, body: bytes) -> UpstreamResponse:
        """POST the chat request upstream, timing it for the metrics."""
        services = self.services
        metrics = services.observed.metrics
        started = time.perf_counter()
        # Counted in flight until its answer is over: on a one-slot server no
        # background summary runs beside it (proxy.session.ahead).
        sent = await services.conversations.sending(call.config)
        try:
            with self.watch.waiting() if self.watch else contextlib.nullcontext():
                response = await send(
                    services.upstream.transport,
                    "POST",
                    call.base_url + call.dialect.path,
                    call.headers,
                    body,
                    upstream=call.base_url,
                )
        except BaseException as exc:
            sent.end()
            if isinstance(exc, (UpstreamTimeout, UpstreamUnreachable)):
                kind = "timeout" if isinstance(exc, UpstreamTimeout) else "unreachable"
                metrics.record_upstream("chat", 0.0, None, kind)
            raise
        response = sent.answered(response)
        metrics.record_upstream("chat", time.perf_counter() - started, response.status)
        if response.status >= 400:
            self.spent.upstream_errors += 1
        return response

    def headers(self, resolved: Resolved) -> dict[str, str]:
        """The response's ``x-compaction-*`` headers: what happened, what the
        summarizer calls cost (all that is known of the money when they are sent)."""
        headers = resolved.headers()
        if self.spent.summarizer_calls:  # most requests asked the summarizer nothing
            headers.update(spent_headers(self.spent))
        return headers


#: Where a client asks for its output's length, by API (chat's two, then
#: Anthropic's and chat's older name, then Responses'): the refusal names the
#: one it set.
_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def _output_takes_the_window(call: Call, exc: CannotFitError) -> ContextLengthExceeded:
    """The engine's refusal of a request whose output limit leaves its input no
    room in the window (``exc``, part ``"output"``), in the field the client
    set, rather than as a head above a negative input limit."""
    asked = call.original if call.original is not None else call.body
    field = next((name for name in _OUTPUT_FIELDS if name in asked), "max_tokens")
    return ContextLengthExceeded(
        f"This request cannot be made to fit the model's context window: it asks "
        f"for up to {exc.tokens:,} output tokens ({field}) of a {exc.window:,}-token window, "
        f"which leaves no room for its input. Lower {field}.",
        param=field,
    )


@dataclasses.dataclass(frozen=True)
class FollowUps:
    """A recalling request's next rounds (:class:`proxy.recall.NextRounds`),
    sent the way the request itself was: by its exchange, for its Call."""

    exchange: Exchange
    call: Call

    async def ask(self, body: bytes) -> UpstreamResponse:
        answer = await self.exchange.send(self.call, body)
        if answer.status != 200:
            answer.abort()
            raise recall.refusal(answer)
        return answer
