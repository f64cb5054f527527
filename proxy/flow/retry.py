"""An upstream that refused the request for its size, and the one retry, smaller.

An overflow is an error the upstream states (in any provider's words,
:func:`proxy.upstream.overflow.detect_overflow`), or a stream that ended
before its first event above every size the upstream has answered
(:func:`compaction.empty_stream_lesson`): some servers refuse an over-long
streamed prompt with an empty 200. That one narrows the working limit of the
upstream and model, which the retry, and every later request, is held to.

:func:`overflow` reads the upstream's answer for one; :func:`prepare_retry`
keeps what it taught and gives the retry's budget by the engine's rule
(:func:`compaction.retry_budget`); the handler compacts again and sends once
more (:func:`proxy.flow.handler.forward`), and :func:`empty_again` tells a
retry whose stream ended empty too, which :func:`empty_stream_error` answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

from starlette.responses import Response

from compaction import (
    Budget,
    EmptyStreamLesson,
    OverflowReport,
    credible_report,
    retry_budget,
)
from compaction import requested_output_tokens as requested_output
from config import ModelConfig
from proxy.flow.answered.finish import finish
from proxy.flow.answered.record import empty_stream
from proxy.flow.exchange import Exchange
from proxy.flow.read import Call
from proxy.flow.send import read_whole, relay_bytes
from proxy.session.conversation import Resolved
from proxy.state.stores import EMPTY_STREAM_STATUS
from proxy.upstream.overflow import detect_overflow
from proxy.upstream.transport import UpstreamResponse


@dataclasses.dataclass(frozen=True)
class EmptyOverflow:
    """An empty stream taken for an overflow: it stated nothing, so nothing is
    learned as a window; the retry aims below the working limit it narrowed."""


@dataclasses.dataclass(frozen=True)
class Retry:
    """What the retry changes of the request: the model's configuration (with
    the window the error taught, or held to the working limit an empty stream
    narrowed; the request's own when it taught neither) and the budget."""

    config: ModelConfig
    budget: Budget


async def overflow(
    exchange: Exchange, call: Call, resolved: Resolved, upstream: UpstreamResponse, sent: bytes
) -> OverflowReport | EmptyOverflow | Response | None:
    """What the upstream's answer says of an overflow: a report to retry on,
    ``None`` for an answer to relay, or the response to give the client now."""
    if upstream.status >= 400:
        error = await read_whole(upstream)
        stated = detect_overflow(upstream.status, error, sent)
        if stated is None:
            finish(exchange, call, resolved, upstream.status)
            return relay_bytes(upstream, error, exchange.headers(resolved))
        return OverflowReport(window=stated.limit, count=stated.count)
    if upstream.status != 200 or not call.streamed:
        return None  # most answers: nothing more to ask of them here
    lesson = await _ended_empty(exchange, call, resolved, upstream)
    if lesson is None:
        return None
    if lesson.overflow:
        upstream.release()
        return EmptyOverflow()
    return empty_stream_error(exchange, call, resolved, upstream)


async def _ended_empty(
    exchange: Exchange, call: Call, resolved: Resolved, upstream: UpstreamResponse
) -> EmptyStreamLesson | None:
    """For a 200 stream (the caller's to tell) that ended before its first
    event: counted as an upstream error, and what it teaches of the upstream's
    model kept and returned; ``None`` for one that began, which the upstream
    took (:func:`_stream_began`)."""
    if await _stream_began(exchange, call, resolved, upstream):
        return None
    empty_stream(exchange.services.observed.metrics, exchange.spent)
    models = exchange.services.conversations.models
    return models.empty_stream(call.config, _upstream_size(exchange, call, resolved))


def _upstream_size(exchange: Exchange, call: Call, resolved: Resolved) -> int:
    """What was sent, as the upstream counts it (our estimate × the ratio)."""
    ratio = exchange.services.conversations.models.ratio(call.config, call.owner)
    return math.ceil(resolved.result.tokens_after * ratio)


async def _stream_began(
    exchange: Exchange, call: Call, resolved: Resolved, upstream: UpstreamResponse
) -> bool:
    """Whether a streamed answer sends anything before it ends; one that does
    shows the upstream took a prompt of that size (streams of some servers
    carry no ``usage`` to say so). The client's leaving is watched
    meanwhile: a long prefill is cancelled with it."""
    try:
        with exchange.watch.waiting() if exchange.watch else contextlib.nullcontext():
            began = await upstream.wait_body()
    except BaseException:
        upstream.abort()
        raise
    if began:
        exchange.services.conversations.models.stream_answered(
            call.config, _upstream_size(exchange, call, resolved)
        )
    return began


async def empty_again(
    exchange: Exchange, call: Call, resolved: Resolved, upstream: UpstreamResponse
) -> bool:
    """Whether the retry's stream, too, ended before its first event. There is
    no second retry: the client gets the error event; what the empty stream
    teaches is kept for the requests after it."""
    if upstream.status != 200 or not call.streamed:
        return False
    return await _ended_empty(exchange, call, resolved, upstream) is not None


def empty_stream_error(
    exchange: Exchange, call: Call, resolved: Resolved, upstream: UpstreamResponse
) -> Response:
    """The answer to an upstream stream that ended empty: a stream that carries
    one error event, never a clean empty answer."""
    upstream.release()
    # An error, not the 200 its headers said: counted and logged as one.
    finish(exchange, call, resolved, EMPTY_STREAM_STATUS, error="upstream_empty")
    message = "The upstream ended the stream before sending anything."
    return Response(
        call.dialect.error_event(message, "upstream_empty"),
        media_type="text/event-stream",
        headers=exchange.headers(resolved),
    )


async def prepare_retry(
    exchange: Exchange, call: Call, resolved: Resolved, report: OverflowReport | EmptyOverflow
) -> Retry:
    """The retry's budget by the library's rule; what the error taught is kept
    (the configuration, with the window it learned, is the retry's)."""
    conversations = exchange.services.conversations
    models = conversations.models
    config = call.config
    if isinstance(report, EmptyOverflow):
        # Held to the working limit, as the stated window of an error would be.
        config = models.within_working_limit(config)
        report = OverflowReport(window=config.profile.context_window)
        taken = False
    else:
        taken = bool(report.window) and await models.learn_window(
            config, report.window or 0, call.owner
        )
        if taken:
            config = conversations.model_config(config.model, call.owner)
        report = credible_report(report, window_taken=taken)
    retry = retry_budget(
        config.profile,
        requested_output(call.body),
        models.ratio(config, call.owner),
        resolved.result.tokens_after,
        report,
    )
    if report.count:
        models.learn_ratio(config, retry.ratio, call.owner)
    return Retry(config, retry.budget)
