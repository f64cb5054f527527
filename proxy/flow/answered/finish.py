"""A compacted request's bookkeeping, once the client has its answer.

:func:`finish` writes what one request did, with no content and no secret:
its metrics, its bill (:mod:`proxy.flow.answered.bill`), its one log line and
its figures for the dashboard (:mod:`proxy.flow.answered.record`). The relay
calls it once the client has the answer (:class:`proxy.flow.relay.After`), so
the client never waits for it; an answer the proxy gives itself (an error
relayed whole, an empty stream, ``/compact``) calls it before answering.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from compaction import message_text
from proxy.edge.errors import ProxyError
from proxy.flow.answered.bill import Spent, account
from proxy.flow.answered.record import request_record, rereads_of
from proxy.flow.read import Call
from proxy.flow.services import Services
from proxy.flow.usage import UsageTap
from proxy.session.conversation import Resolved
from proxy.state.logs import REQUESTS

logger = logging.getLogger(REQUESTS)
#: Summaries asked of a model and not used: beside the request's one line.
summaries_log = logging.getLogger("compaction_proxy.summaries")


class Answering(Protocol):
    """What :func:`finish` reads of the request being answered (the handler's
    :class:`~proxy.flow.exchange.Exchange`, which sits above this folder and so
    is not imported here)."""

    @property
    def services(self) -> Services: ...
    @property
    def started(self) -> float: ...
    @property
    def spent(self) -> Spent: ...


def finish(
    exchange: Answering,
    call: Call,
    resolved: Resolved,
    status: int,
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
    ms = ((time.perf_counter() if ended is None else ended) - exchange.started) * 1000
    services = exchange.services
    metrics, conversations = services.observed.metrics, services.conversations
    result = resolved.result
    metrics.record_request(
        call.config.model,
        result,
        result.tokens_before,
        llm_mode=call.config.profile.summarizer == "llm",
    )
    rereads = rereads_of(call, resolved)
    if rereads.tools:  # most requests have none: nothing to count
        metrics.record_rereads(call.config.model, rereads.by_tool())
    usage = tap.usage if tap is not None else None
    bill = account(conversations, metrics, call, resolved, exchange.spent, usage, answered=answered)
    fields: dict[str, object] = {
        "api": call.dialect.name,
        "model": call.config.model or "-",
        "stage": result.stage,
        "reason": resolved.reason,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "upstream_status" if upstream else "status": status,
        "ms": round(ms, 1),
    }
    if error:
        fields["error"] = error
    if rereads.tools:
        fields["rereads"] = len(rereads.tools)
    if result.summarizer_calls and result.summarizer_used == "extractive":
        fields["summary_refused"] = True
        _log_summary_refused(services, call, resolved)
    fields.update(bill.fields())
    if services.settings.server.log_content and call.messages:
        fields["content"] = message_text(call.messages[-1])[:2000]
    logger.info("chat", extra={"fields": fields})
    recorder = services.observed.recorder
    if recorder is not None:  # queued for the dashboard; never waits
        labelled = (call.owner, resolved.session) in recorder.labelled
        record = request_record(
            call,
            resolved,
            status,
            ms,
            exchange.spent,
            bill,
            error=error,
            rereads=rereads,
            labelled=labelled,
        )
        recorder.record(record)


def _log_summary_refused(services: Services, call: Call, resolved: Resolved) -> None:
    """The model was asked and its summary not used (refused by the checks, or
    the call failed): said here, where an operator reads; the reason quotes
    the conversation, so only with --log-content."""
    result = resolved.result
    found = {"model": call.config.model or "-", "session": resolved.session}
    if services.settings.server.log_content:
        found["why"] = "; ".join(n for n in result.notes if "llm summar" in n)[:1000]
    summaries_log.warning("model summary not used; the extractive one was", extra={"fields": found})
