"""The hand-off between a request and recall (:mod:`proxy.recall`).

What a :class:`~proxy.flow.read.Call` and its compaction tell recall — whose
request, the room left, the caller's memory and counter — is read here, so
that ``proxy/recall/`` takes what it uses and knows no request; and what a
recall did is reported here, with the request's own bookkeeping, once the
client has its answer. docs/recall.md is the user's account.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from proxy.edge.errors import ProxyError
from proxy.flow.read import Call
from proxy.flow.relay import Cut, Relay
from proxy.flow.send import shown_url
from proxy.flow.usage import UsageTap
from proxy.recall import NextRounds, Plan, RecallFailed, RecallLoop, Rounds, counted_tool
from proxy.recall import plan as recall_plan
from proxy.session.conversation import Resolved, recall_salt
from proxy.session.service import Conversations
from proxy.state.logs import REQUESTS
from proxy.state.metrics import Metrics
from proxy.state.stores import Event
from proxy.upstream.transport import UpstreamResponse

logger = logging.getLogger(__name__)
#: The one line per request that recalled, beside the request's own.
requests_log = logging.getLogger(REQUESTS)


def plan(
    conversations: Conversations, call: Call, resolved: Resolved, body: dict[str, Any]
) -> Plan | None:
    """The request to send with the recall tool (:func:`proxy.recall.plan`), or
    ``None`` to send ``body`` as it is: recall off for the model, or the
    conversation goes as the client sent it (nothing in it has a ref)."""
    profile = call.config.profile
    if not profile.recall or resolved.untouched:
        return None
    result = resolved.result
    return recall_plan(
        body,
        call.dialect.recall,
        profile=profile,
        originals=call.messages,
        sent=resolved.messages,
        left=result.input_limit - result.tokens_after,
        salt=recall_salt(call.scope),
        owner=call.owner,
        memory=conversations.recalls,
        counter=conversations.counter(call.config),
    )


def tool_tokens(conversations: Conversations, call: Call) -> int:
    """The recall tool's tokens, where it may join this request once compacted
    (recall on, tools declared): held back from the request's budget from the
    start, so that the tools block never changes between two compactions.
    Added only while it fits (:func:`proxy.recall.plan`), the tool would leave
    again as the conversation grew towards the trigger, and each leaving and
    coming back would rewrite the provider's whole prompt cache."""
    if not call.config.profile.recall:
        return 0
    body = call.original if call.original is not None else call.body
    tooled = call.dialect.recall.with_tool(body)
    if tooled is None:
        return 0
    return counted_tool(conversations.counter(call.config), orjson.dumps(tooled["tools"][-1]))


def relay(
    conversations: Conversations,
    metrics: Metrics,
    call: Call,
    resolved: Resolved,
    upstream: UpstreamResponse,
    plan: Plan,
    tap: UsageTap,
    headers: Mapping[str, str],
    finish: Callable[[ProxyError | None], None],
    next_rounds: NextRounds,
    cut: Cut,
) -> Relay:
    """The answer of a request sent with the recall tool, relayed as one over
    its rounds (:class:`proxy.recall.RecallLoop`); ``next_rounds`` asks the
    upstream a follow-up, ``finish`` is the request's bookkeeping — both it and the
    recall's report run once the client has the answer. ``cut`` is what a
    plain answer's stream would do when it closes before its end: a first
    round that said nothing yet is asked again unseen; a later one cannot be."""
    rounds = Rounds(plan=plan, counter=conversations.counter(call.config), body=plan.body)

    def after(failed: ProxyError | None) -> Awaitable[None] | None:
        finish(failed)
        return _report(conversations, metrics, call, resolved, rounds)

    loop = RecallLoop(rounds, next_rounds, tap, conversations.recalls, streamed=call.streamed)
    recall_headers = {**headers, "x-compaction-recall-tokens": str(plan.extra_tokens)}
    return Relay(upstream, recall_headers, None, call.dialect, after, cut, rounds=loop)


def refusal(upstream: UpstreamResponse) -> RecallFailed:
    """The error for a follow-up round the upstream refused, logged by status."""
    fields = {"status": upstream.status, "upstream": shown_url(upstream.url)}
    logger.warning("upstream refused a recall round", extra={"fields": fields})
    return RecallFailed(upstream.status)


def _report(
    conversations: Conversations, metrics: Metrics, call: Call, resolved: Resolved, rounds: Rounds
) -> Awaitable[None] | None:
    """The metric, the log line and the event of what was recalled (nothing
    when nothing was); the event's write is returned, for the relay to await
    once the client has the answer."""
    if not rounds.outcomes:
        return None
    for outcome, n in rounds.outcomes.items():
        metrics.recalls.labels(call.dialect.name, outcome).inc(n)
    fields: dict[str, object] = {"api": call.dialect.name, "model": call.config.model or "-"}
    fields.update({"rounds": rounds.answered, **rounds.outcomes})
    requests_log.info("recall", extra={"fields": fields})
    checkpoint = resolved.checkpoint
    event = Event(
        # Its own id: a recall is no step of the compaction that made the refs.
        compaction_id=uuid.uuid4().hex,
        type="context.recalled",
        session=resolved.session,
        model=call.config.model,
        reason="recall",
        instance=conversations.instance,
        checkpoint_id=checkpoint.id if checkpoint is not None else None,
        owner=call.owner,
        notes=tuple(f"{outcome}: {n}" for outcome, n in sorted(rounds.outcomes.items())),
    )
    return conversations.store.add_event(event)


__all__ = ["Plan", "plan", "refusal", "relay", "tool_tokens"]
