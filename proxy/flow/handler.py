"""The compacted endpoints: ``POST /v1/chat/completions``, ``/v1/messages``, ``/v1/responses``.

Start here. :func:`handle_chat` reads the request into a plain
:class:`~proxy.flow.read.Call` and answers it one of three ways: a request of
another API that the proxy must not rewrite, forwarded as it came
(:func:`forward_untouched`); a ``/compact`` the user typed, answered by the
proxy (:func:`answer_command`); or, for most requests, :func:`forward`:

    compact_for → outgoing → send → (overflow? compact again, retry once) → Relay → finish

The acts each step uses are methods of the request being answered,
:class:`~proxy.flow.exchange.Exchange` (the services, the client's watch,
what the request spent, when it began); the handler reads as the pipeline it is.

What an overflow is (an error the upstream states, or a stream that ended
empty) and what the retry keeps of it is :mod:`proxy.flow.retry`.

Chat Completions is the engine's own format. The other two APIs come in
through their :class:`~proxy.dialects.base.Dialect`: the request is mapped to
the engine's messages on the way in (``Call.mapped``, in ``proxy.flow.read``) and
rebuilt from the engine's output on the way out (``Call.outgoing``); everything else — the
checkpoints, the retry rule, calibration, events, metrics — is shared.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.edge.body import deep_nesting_refused
from proxy.edge.disconnect import ClientWatch
from proxy.edge.errors import (
    ContextLengthExceeded,
    ProxyError,
)
from proxy.flow import manual, recall
from proxy.flow.answered.bill import untouched_bill
from proxy.flow.answered.finish import finish
from proxy.flow.exchange import Exchange, FollowUps
from proxy.flow.read import Call, read_call
from proxy.flow.relay import Relay
from proxy.flow.retry import empty_again, empty_stream_error, overflow, prepare_retry
from proxy.flow.send import shown_url
from proxy.flow.services import Services
from proxy.flow.usage import UsageTap
from proxy.state.logs import REQUESTS

logger = logging.getLogger(REQUESTS)


async def handle_chat(
    request: Request,
    services: Services,
    *,
    watch: ClientWatch | None = None,
    dialect: Dialect = CHAT,
) -> Response:
    exchange = Exchange(services, time.perf_counter(), watch)
    call: Call | None = None
    try:
        call = await read_call(request, services, dialect)
        if call.untouchable is not None:
            return await forward_untouched(exchange, call)
        if call.command is not None:
            return await answer_command(exchange, call, call.command)
        return await forward(exchange, call)
    except ProxyError as exc:
        _log_refusal(call, exc.status, exchange.started)
        raise


async def handle_preview(request: Request, services: Services) -> Response:
    """``POST /v1/compaction/preview``: what would be sent, and the report."""
    call = await read_call(request, services)
    resolved = await Exchange(services, time.perf_counter()).compact_for(
        call, reason="threshold", store=False
    )
    result = resolved.result
    report = {
        "model": call.config.model,
        "stage": result.stage,
        "reason": result.reason,
        "tokens_before": resolved.tokens_before,
        "tokens_after": result.tokens_after,
        "context_window": call.config.profile.context_window,
        "window_source": call.config.window_source,
        "input_limit": result.input_limit,
        "trigger": result.trigger,
        "messages_before": len(call.body["messages"]),
        "messages_after": result.messages_after,
        "summarizer": result.summarizer_used,
        "summarizer_calls": result.summarizer_calls,
        "checkpoint": resolved.checkpoint.id if resolved.checkpoint else None,
        "notes": list(result.notes),
    }
    # The messages sit a level deeper here than in the request: a body
    # nested to the parser's limit cannot be written back.
    with deep_nesting_refused():
        answer = orjson.dumps({"messages": resolved.messages, "report": report})
    return Response(answer, media_type="application/json", headers=resolved.headers())


async def forward_untouched(exchange: Exchange, call: Call) -> Response:
    """A request of another API that the proxy must not rewrite (it builds on
    state the proxy cannot see): forwarded byte for byte, relayed as it comes."""
    upstream = await exchange.send(call, call.raw)
    tap = UsageTap(cached=call.dialect.cached_usage_apart)
    fields: dict[str, object] = {
        "api": call.dialect.name,
        "model": call.config.model or "-",
        "stage": "untouched",
        "reason": call.untouchable,
        "upstream_status": upstream.status,
        "ms": round((time.perf_counter() - exchange.started) * 1000, 1),
    }
    status = upstream.status
    metrics = exchange.services.observed.metrics

    def log(failed: ProxyError | None) -> None:
        # Once the client has the answer, as a compacted request is (see forward).
        if failed is not None:
            fields.update(upstream_status=failed.status, error=failed.code or failed.type)
        elif status == 200:
            bill = untouched_bill(call, tap.usage)
            dollars = bill.own_dollars
            money = (dollars, dollars) if dollars is not None else None
            metrics.record_usage(call.config.model, tap.usage, bill.own, bill.own, money)
            fields.update(bill.fields())
        logger.info("chat", extra={"fields": fields})

    cut = exchange.cut(call, call.raw)
    return Relay(upstream, {}, tap, dialect=call.dialect, after=log, cut=cut)


async def forward(exchange: Exchange, call: Call) -> Response:
    """Forward, and retry once, smaller, after an upstream overflow."""
    resolved = await exchange.compact_for(call, reason="threshold")
    sent, recalling = exchange.outgoing(call, resolved)
    upstream = await exchange.send(call, sent)
    report = await overflow(exchange, call, resolved, upstream, sent)
    if isinstance(report, Response):
        return report
    if report is not None:
        metrics = exchange.services.observed.metrics
        metrics.overflow_retries.labels(metrics.model(call.config.model)).inc()
        retrying = await prepare_retry(exchange, call, resolved, report)
        # The retry is this request under what the upstream taught of its model:
        # a Call of its own, the one field changed, rather than the config
        # carried beside it, because every step from here reads the request's
        # config (the compaction's conversation and plan through the session's
        # ConversationRequest, the recall plan, the traffic slot, the usage
        # learned, the bill, the figures), and each must read the learned one.
        call = dataclasses.replace(call, config=retrying.config)
        resolved = await exchange.compact_for(call, reason="overflow", budget=retrying.budget)
        retry, recalling = exchange.outgoing(call, resolved)
        if retry == sent:  # cannot happen by the retry rule; never resend what failed
            raise ContextLengthExceeded(
                "This request cannot be made smaller than what the upstream refused.",
                param="messages",
            )
        upstream = await exchange.send(call, retry)
        if await empty_again(exchange, call, resolved, upstream):
            return empty_stream_error(exchange, call, resolved, upstream)
        sent = retry
    try:
        tap = exchange.usage_tap(call, resolved, recalling)
        # Its log line, metrics and figures are written once the client has
        # the answer, with its usage (see Relay): the client need not wait for
        # them. Their time is this one, to the upstream's head, as before the relay.
        after = functools.partial(
            finish, exchange, call, resolved, upstream.status, ended=time.perf_counter(), tap=tap
        )
        headers = exchange.headers(resolved)
        if recalling is not None and upstream.status == 200:
            # Its calls answered by the proxy, the upstream asked again, the
            # client given the last answer through the one relay.
            services = exchange.services
            return recall.relay(
                services.conversations,
                services.observed.metrics,
                call,
                resolved,
                upstream,
                recalling,
                tap,
                headers,
                after,
                FollowUps(exchange, call),
                exchange.cut(call, sent),
            )
        cut = exchange.cut(call, sent)
        return Relay(upstream, headers, tap, dialect=call.dialect, after=after, cut=cut)
    except BaseException:
        upstream.abort()  # its connection and pool slot are not left behind
        raise


async def answer_command(exchange: Exchange, call: Call, command: manual.Command) -> Response:
    """A ``/compact`` the user typed: the history before it compacted and stored,
    answered by the proxy in the request's API (the model is not called)."""
    # Without the command (and the system messages a client sent after it).
    # A Call of its own, not the history carried beside this one: the session
    # reads the conversation it compacts, stores and keys through the request
    # (ConversationRequest: its messages with its config, scope and owner),
    # and the conversation compacted here is the history before the command.
    call = dataclasses.replace(call, messages=call.messages[: command.index])
    instructions = command.instructions or None
    resolved = await exchange.compact_for(call, reason="manual", instructions=instructions)
    text = manual.reply_text(manual.outcome_of(resolved))
    finish(exchange, call, resolved, 200, upstream=False)
    model = call.config.model or "compaction-proxy"
    headers = exchange.headers(resolved)
    if call.streamed:
        events = call.dialect.manual_events(model, text, call.original or call.body)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    return Response(
        orjson.dumps(call.dialect.manual_reply(model, text)),
        media_type="application/json",
        headers=headers,
    )


def _log_refusal(call: Call | None, status: int, started: float) -> None:
    """The log line of a chat request the proxy answered with its own error
    (a bad body, a request that cannot fit, an unreachable or silent upstream)."""
    fields: dict[str, object] = {
        "model": (call.config.model or "-") if call is not None else "-",
        "status": status,
        "ms": round((time.perf_counter() - started) * 1000, 1),
    }
    if call is not None and status in (502, 504):
        # Which upstream failed, when there are several (chat and Anthropic).
        fields["upstream"] = shown_url(call.base_url)
    logger.info("chat refused", extra={"fields": fields})
