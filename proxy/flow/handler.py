"""The compacted endpoints: ``POST /v1/chat/completions``, ``/v1/messages``, ``/v1/responses``.

read → compact → forward → (overflow? compact again, retry once) → relay.
Each step is a named function; the handler reads as the pipeline it is.

An overflow is an error the upstream states, or a stream that ended before
its first event above every size the upstream has answered
(:func:`compaction.empty_stream_lesson`): some servers refuse an over-long
streamed prompt with an empty 200. That one narrows the working limit of the
upstream and model, which the retry, and every later request, is held to.

Chat Completions is the engine's own format. The other two APIs come in
through their :class:`~proxy.dialects.base.Dialect`: the request is mapped to
the engine's messages on the way in (``Call.mapped``, in ``proxy.flow.read``) and
rebuilt from the engine's output on the way out (``Call.encode``); everything else — the
checkpoints, the retry rule, calibration, events, metrics — is shared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import time

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from compaction import (
    Budget,
    CannotFitError,
    InvalidMessagesError,
    OverflowReport,
    Reason,
    credible_report,
    message_text,
    retry_budget,
)
from compaction import requested_output_tokens as requested_output
from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.edge.body import deep_nesting_refused
from proxy.edge.disconnect import ClientWatch
from proxy.edge.errors import (
    BadRequest,
    ContextLengthExceeded,
    ProxyError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from proxy.flow import manual, recall
from proxy.flow.bill import account, spent_headers, untouched_bill
from proxy.flow.read import Call, read_call
from proxy.flow.record import cut_stream, empty_stream, request_record, rereads_of
from proxy.flow.relay import Cut, Relay
from proxy.flow.send import read_whole, relay_bytes, send, shown_url
from proxy.flow.services import Services
from proxy.flow.usage import UsageTap
from proxy.session.conversation import Resolved, compact_if_needed
from proxy.session.untouched import as_sent
from proxy.state.logs import REQUESTS
from proxy.state.stores import EMPTY_STREAM_STATUS
from proxy.upstream.overflow import detect_overflow
from proxy.upstream.transport import UpstreamResponse

logger = logging.getLogger(REQUESTS)
#: Summaries asked of a model and not used: beside the request's one line.
summaries_log = logging.getLogger("compaction_proxy.summaries")

# --- the handler -----------------------------------------------------------


async def handle_chat(
    request: Request,
    services: Services,
    *,
    watch: ClientWatch | None = None,
    dialect: Dialect = CHAT,
) -> Response:
    started = time.perf_counter()
    call: Call | None = None
    try:
        call = await read_call(request, services, dialect, watch=watch)
        if call.untouchable is not None:
            return await _forward_untouched(call, started)
        command = manual.find_command(call.messages) if manual.may_hold_command(call.raw) else None
        if command is not None:
            return await _manual(call, command, started)
        return await _forward(call, started)
    except ProxyError as exc:
        _log_refusal(services, call, exc.status, started)
        raise


async def _forward_untouched(call: Call, started: float) -> Response:
    """A request of another API that the proxy must not rewrite (it builds on
    state the proxy cannot see): forwarded byte for byte, relayed as it comes."""
    upstream = await _send(call, call.raw)
    tap = UsageTap(cached=call.dialect.cached_usage_apart)
    fields: dict[str, object] = {
        "api": call.dialect.name,
        "model": call.config.model or "-",
        "stage": "untouched",
        "reason": call.untouchable,
        "upstream_status": upstream.status,
        "ms": round((time.perf_counter() - started) * 1000, 1),
    }
    status = upstream.status

    def log(failed: ProxyError | None) -> None:
        # Once the client has the answer, as a compacted request is (see _forward).
        if failed is not None:
            fields.update(upstream_status=failed.status, error=failed.code or failed.type)
        elif status == 200:
            bill = untouched_bill(call, tap.usage)
            dollars = bill.own_dollars
            money = (dollars, dollars) if dollars is not None else None
            call.services.observed.metrics.record_usage(
                call.config.model, tap.usage, bill.own, bill.own, money
            )
            fields.update(bill.fields())
        logger.info("chat", extra={"fields": fields})

    return Relay(upstream, {}, tap, dialect=call.dialect, after=log, cut=_cut(call, call.raw))


async def _forward(call: Call, started: float) -> Response:
    """Forward, and retry once, smaller, after an upstream overflow."""
    resolved = await _compact_for(call, reason="threshold")
    sent, recalling = _outgoing(call, resolved)
    upstream = await _send(call, sent)
    report = await _overflow(call, resolved, upstream, started, sent)
    if isinstance(report, Response):
        return report
    if report is not None:
        services = call.services
        services.observed.metrics.overflow_retries.labels(
            services.observed.metrics.model(call.config.model)
        ).inc()
        retrying = await _retry_budget(call, resolved, report)
        call = retrying.call
        resolved = await _compact_for(call, reason="overflow", budget=retrying.budget)
        retry, recalling = _outgoing(call, resolved)
        if retry == sent:  # cannot happen by the retry rule; never resend what failed
            raise ContextLengthExceeded(
                "This request cannot be made smaller than what the upstream refused.",
                param="messages",
            )
        upstream = await _send(call, retry)
        if await _empty_again(call, resolved, upstream):
            return _empty_stream_error(call, resolved, upstream, started)
        sent = retry
    try:
        tap = _usage_tap(call, resolved, recalling)
        # Its log line, metrics and figures are written once the client has
        # the answer, with its usage (see Relay): the client need not wait for
        # them. Their time is this one, to the upstream's head, as before the relay.
        finish = functools.partial(
            _finish, call, resolved, upstream.status, started, ended=time.perf_counter(), tap=tap
        )
        if recalling is not None and upstream.status == 200:
            # Its calls answered by the proxy, the upstream asked again, the
            # client given the last answer through the one relay.
            again = functools.partial(_send, call)
            headers = _headers(call, resolved)
            cut = _cut(call, sent)
            return recall.relay(
                call, resolved, upstream, recalling, tap, headers, finish, again, cut
            )
        return Relay(
            upstream,
            _headers(call, resolved),
            tap,
            dialect=call.dialect,
            after=finish,
            cut=_cut(call, sent),
        )
    except BaseException:
        upstream.abort()  # its connection and pool slot are not left behind
        raise


def _cut(call: Call, body: bytes) -> Cut:
    """A stream that closes before its API's end: an upstream error, counted
    as one, and ``body`` sent once more while the client has seen none of it."""

    async def again() -> UpstreamResponse:
        return await _send(call, body)

    return Cut(functools.partial(cut_stream, call), again)


def _outgoing(call: Call, resolved: Resolved) -> tuple[bytes, recall.Plan | None]:
    """The request to send, and how it recalls, when it goes with the recall tool."""
    if call.unchanged(resolved) or not call.config.profile.recall:
        return call.encode(resolved), None
    body = call.outgoing(resolved)
    plan = recall.plan(call, resolved, body)
    return orjson.dumps(body if plan is None else plan.body), plan


@dataclasses.dataclass(frozen=True)
class _EmptyOverflow:
    """An empty stream taken for an overflow: it stated nothing, so nothing is
    learned as a window; the retry aims below the working limit it narrowed."""


async def _overflow(
    call: Call,
    resolved: Resolved,
    upstream: UpstreamResponse,
    started: float,
    sent: bytes,
) -> OverflowReport | _EmptyOverflow | Response | None:
    """What the upstream's answer says of an overflow: a report to retry on,
    ``None`` for an answer to relay, or the response to give the client now."""
    if upstream.status >= 400:
        error = await read_whole(upstream)
        overflow = detect_overflow(upstream.status, error, sent)
        if overflow is None:
            _finish(call, resolved, upstream.status, started)
            return relay_bytes(upstream, error, _headers(call, resolved))
        return OverflowReport(window=overflow.limit, count=overflow.count)
    if upstream.status != 200 or not call.streamed or await _stream_began(call, resolved, upstream):
        return None
    empty_stream(call)
    if call.services.conversations.models.empty_stream(
        call.config, _upstream_size(call, resolved)
    ).overflow:
        upstream.release()
        return _EmptyOverflow()
    return _empty_stream_error(call, resolved, upstream, started)


def _upstream_size(call: Call, resolved: Resolved) -> int:
    """What was sent, as the upstream counts it (our estimate × the ratio)."""
    return math.ceil(
        resolved.result.tokens_after
        * call.services.conversations.models.ratio(call.config, call.owner)
    )


async def _stream_began(call: Call, resolved: Resolved, upstream: UpstreamResponse) -> bool:
    """Whether a streamed answer sends anything before it ends; one that does
    shows the upstream took a prompt of that size (streams of some servers
    carry no ``usage`` to say so)."""
    began = await _first_bytes(call, upstream)
    if began:
        call.services.conversations.models.stream_answered(
            call.config, _upstream_size(call, resolved)
        )
    return began


async def _empty_again(call: Call, resolved: Resolved, upstream: UpstreamResponse) -> bool:
    """Whether the retry's stream, too, ended before its first event. There is
    no second retry: the client gets the error event; what the empty stream
    teaches is kept for the requests after it."""
    if upstream.status != 200 or not call.streamed or await _stream_began(call, resolved, upstream):
        return False
    empty_stream(call)
    call.services.conversations.models.empty_stream(call.config, _upstream_size(call, resolved))
    return True


async def _first_bytes(call: Call, upstream: UpstreamResponse) -> bool:
    """Whether a streamed answer sends anything before it ends. The client's
    leaving is watched meanwhile: a long prefill is cancelled with it."""
    try:
        with call.watch.waiting() if call.watch else contextlib.nullcontext():
            return await upstream.wait_body()
    except BaseException:
        upstream.abort()
        raise


def _empty_stream_error(
    call: Call, resolved: Resolved, upstream: UpstreamResponse, started: float
) -> Response:
    """The answer to an upstream stream that ended empty: a stream that carries
    one error event, never a clean empty answer."""
    upstream.release()
    # An error, not the 200 its headers said: counted and logged as one.
    _finish(call, resolved, EMPTY_STREAM_STATUS, started, error="upstream_empty")
    message = "The upstream ended the stream before sending anything."
    return Response(
        call.dialect.error_event(message, "upstream_empty"),
        media_type="text/event-stream",
        headers=_headers(call, resolved),
    )


@dataclasses.dataclass(frozen=True)
class _Retry:
    call: Call  #: with the window the error taught, if it taught one
    budget: Budget


async def _retry_budget(
    call: Call, resolved: Resolved, report: OverflowReport | _EmptyOverflow
) -> _Retry:
    """The retry's budget by the library's rule; what the error taught is kept
    (the call, with the window it learned, is the retry's)."""
    services, model = call.services, call.config.model
    if isinstance(report, _EmptyOverflow):
        # Held to the working limit, as the stated window of an error would be.
        call = dataclasses.replace(
            call, config=services.conversations.models.within_working_limit(call.config)
        )
        config = call.config
        window = OverflowReport(window=config.profile.context_window)
        blind = retry_budget(
            config.profile,
            requested_output(call.body),
            services.conversations.models.ratio(config, call.owner),
            resolved.result.tokens_after,
            window,
        )
        return _Retry(call, blind.budget)
    taken = bool(report.window) and await services.conversations.models.learn_window(
        call.config, report.window or 0, call.owner
    )
    if taken:
        call = dataclasses.replace(
            call, config=services.conversations.model_config(model, call.owner)
        )
    report = credible_report(report, window_taken=taken)
    config = call.config
    retry = retry_budget(
        config.profile,
        requested_output(call.body),
        services.conversations.models.ratio(config, call.owner),
        resolved.result.tokens_after,
        report,
    )
    if report.count:
        services.conversations.models.learn_ratio(config, retry.ratio, call.owner)
    return _Retry(call, retry.budget)


def _usage_tap(call: Call, resolved: Resolved, recalling: recall.Plan | None = None) -> UsageTap:
    """Learns the upstream's ratio from the ``usage`` of the answer (its first
    round's, with the recall tool and the exchanges put back counted in)."""
    services, config, estimate = call.services, call.config, resolved.result.tokens_after
    if recalling is not None:
        estimate += recalling.extra_tokens

    def observed(upstream_tokens: int) -> None:
        services.conversations.models.observe(config, estimate, upstream_tokens, call.owner)

    return UsageTap(observed, cached=call.dialect.cached_usage_apart)


async def _compact_for(
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
    held_back = recall.tool_tokens(call)
    if reason == "threshold" and budget is None and store:
        with deep_nesting_refused():  # messages nested deeper than orjson writes
            as_it_came = await as_sent(call.services.conversations, call, held_back=held_back)
        if as_it_came is not None:
            return as_it_came
    summarizer = call.summarizer() if call.config.profile.summarizer == "llm" else None
    try:
        with deep_nesting_refused():
            return await compact_if_needed(
                call.services.conversations,
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
            call.tally.summarizer_tokens += summarizer.tokens
            call.tally.summarizer_calls += summarizer.calls
            call.tally.summarizer += summarizer.spent
            call.tally.summarizer_cost += summarizer.cost


async def _manual(call: Call, command: manual.Command, started: float) -> Response:
    # Without the command (and the system messages a client sent after it).
    call = dataclasses.replace(call, messages=call.messages[: command.index])
    instructions = command.instructions or None
    resolved = await _compact_for(call, reason="manual", instructions=instructions)
    text = manual.reply_text(manual.outcome_of(resolved))
    _finish(call, resolved, 200, started, upstream=False)
    model = call.config.model or "compaction-proxy"
    headers = _headers(call, resolved)
    if call.streamed:
        events = call.dialect.manual_events(model, text, call.original or call.body)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    return Response(
        orjson.dumps(call.dialect.manual_reply(model, text)),
        media_type="application/json",
        headers=headers,
    )


async def handle_preview(request: Request, services: Services) -> Response:
    """``POST /v1/compaction/preview``: what would be sent, and the report."""
    call = await read_call(request, services)
    resolved = await _compact_for(call, reason="threshold", store=False)
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


async def _send(call: Call, body: bytes) -> UpstreamResponse:
    """POST the chat request upstream, timing it for the metrics."""
    metrics = call.services.observed.metrics
    started = time.perf_counter()
    # Counted in flight until its answer is over: on a one-slot server no
    # background summary runs beside it (proxy.session.ahead).
    sent = await call.services.conversations.sending(call.config)
    try:
        with call.watch.waiting() if call.watch else contextlib.nullcontext():
            response = await send(
                call.services.upstream.transport,
                "POST",
                call.base_url + call.dialect.path,
                call.headers,
                body,
                upstream=call.base_url,
            )
    except UpstreamTimeout:
        sent.end()
        metrics.record_upstream("chat", 0.0, None, "timeout")
        raise
    except UpstreamUnreachable:
        sent.end()
        metrics.record_upstream("chat", 0.0, None, "unreachable")
        raise
    except BaseException:
        sent.end()
        raise
    response = sent.answered(response)
    metrics.record_upstream("chat", time.perf_counter() - started, response.status)
    if response.status >= 400:
        call.tally.upstream_errors += 1
    return response


def _finish(
    call: Call,
    resolved: Resolved,
    status: int,
    started: float,
    failed: ProxyError | None = None,
    *,
    upstream: bool = True,
    error: str = "",
    ended: float | None = None,
    tap: UsageTap | None = None,
) -> None:
    """Metrics and the one log line of a chat request (no content, no secrets).

    ``status`` is the upstream's, or — with ``upstream=False`` (``/compact``,
    answered by the proxy) — the proxy's own. ``ended`` is when the answer's
    head was in (``time.perf_counter()``; by default, now). ``tap`` read the
    answer's usage, which its bill prices. ``failed`` is the error the client
    got in the answer's place (a recall round that could not be had, a body
    that broke): logged and recorded as the status and error the client saw;
    the upstream's answer is billed all the same.
    """
    answered = upstream and status == 200
    if failed is not None:
        status, error = failed.status, failed.code or failed.type
    ms = ((time.perf_counter() if ended is None else ended) - started) * 1000
    metrics = call.services.observed.metrics
    metrics.record_request(
        call.config.model,
        resolved.result,
        resolved.result.tokens_before,
        llm_mode=call.config.profile.summarizer == "llm",
    )
    rereads = rereads_of(call, resolved)
    if rereads.tools:  # most requests have none: nothing to count
        metrics.record_rereads(call.config.model, rereads.by_tool())
    usage = tap.usage if tap is not None else None
    bill = account(call, resolved, usage, answered=answered)
    stage = resolved.result.stage
    fields: dict[str, object] = {
        "model": call.config.model or "-",
        "stage": stage,
        "reason": resolved.reason,
        "tokens_before": resolved.result.tokens_before,
        "tokens_after": resolved.result.tokens_after,
        "upstream_status" if upstream else "status": status,
        "ms": round(ms, 1),
    }
    if error:
        fields["error"] = error
    if rereads.tools:
        fields["rereads"] = len(rereads.tools)
    result = resolved.result
    if result.summarizer_calls and result.summarizer_used == "extractive":
        # The model was asked and its summary not used (refused by the
        # checks, or the call failed): said here, where an operator reads; the
        # reason quotes the conversation, so only with --log-content.
        fields["summary_refused"] = True
        found = {"model": fields["model"], "session": resolved.session}
        if call.services.settings.server.log_content:
            found["why"] = "; ".join(n for n in result.notes if "llm summar" in n)[:1000]
        summaries_log.warning(
            "model summary not used; the extractive one was", extra={"fields": found}
        )
    fields = {"api": call.dialect.name, **fields, **bill.fields()}
    if call.services.settings.server.log_content and call.messages:
        fields["content"] = message_text(call.messages[-1])[:2000]
    logger.info("chat", extra={"fields": fields})
    recorder = call.services.observed.recorder
    if recorder is not None:  # queued for the dashboard; never waits
        labelled = (call.owner, resolved.session) in recorder.labelled
        record = request_record(
            call, resolved, status, ms, error=error, rereads=rereads, bill=bill, labelled=labelled
        )
        recorder.record(record)


def _headers(call: Call, resolved: Resolved) -> dict[str, str]:
    """The response's ``x-compaction-*`` headers: what happened, what the
    summarizer calls cost (all that is known of the money when they are sent)."""
    headers = resolved.headers()
    if call.tally.summarizer_calls:  # most requests asked the summarizer nothing
        headers.update(spent_headers(call))
    return headers


def _log_refusal(services: Services, call: Call | None, status: int, started: float) -> None:
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
