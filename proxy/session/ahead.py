"""Compactions prepared ahead of need, in the background.

With the llm summarizer, the turn that crosses the trigger would wait for a
model's summary. Instead, a forward past ``precompute_share`` of the trigger,
or as many turns before it as a summary takes at the session's pace (the
summarizer's time measured per upstream, :mod:`proxy.upstream.pace`;
:attr:`compaction.Decision.prepare`), or a compaction that leaves the
conversation near its trigger, starts :func:`prepare_ahead` as a task of
:class:`proxy.session.background.Background`:

1. single flight: one task per span in this process, and the store's lock of
   the span across replicas; under it the store is asked again
   (:meth:`~proxy.session.compacting.Job.recheck`): the decision of the request
   that started the job stands when the answer is unchanged, and the job stops
   if the span was prepared or compacted meanwhile (``superseded``);
2. :func:`compaction.ahead` plans the compaction with the growth still
   expected, and :func:`proxy.session.compacting.run_plan` runs it; when pruning will
   do at the trigger the model is never asked, and nothing is stored or
   recorded (``not_needed``);
3. the result is stored as a *precomputed* checkpoint, with the usual events
   (``background: true``) — written only once the model is asked.

The request that crosses the trigger applies it (:func:`compaction.decide`),
waiting for a preparation still running for its span rather than asking the
model twice (:func:`proxy.session.conversation.compact_if_needed`).

A preparation's summaries go through the upstream pool of the background
(:attr:`proxy.upstream.service.Upstream.summaries_transport`), never the one
the requests use: however many are under way, and however slowly the model
answers them, a request never waits for a connection they hold. A compaction
on the request path asks through the request's pool, as the request itself.
How many run at once is capped by :class:`~proxy.session.background.Background`.

A server that serves one request at a time (llama.cpp's default) would make
the user's next request queue behind a preparation's summary. For such an
upstream (:meth:`proxy.upstream.traffic.Traffic.single_slot`) a summary is
asked only while no user request to it is in flight, and a user request that
arrives meanwhile cancels it (:class:`~proxy.upstream.traffic.Traffic`):
the preparation ends ``superseded`` ("gave way"), and the compaction is made
at the trigger or prepared again later. ``background.single_slot = "off"``
prepares nothing for such an upstream instead.

A preparation whose summarizer answered never ends ``compaction.failed``:
its compaction is stored, or, when the result is no compaction to store (the
summary was refused and pruning was all that was left, or the condensed
span is nothing a later request can reuse), it ends ``compaction.superseded``
saying why, and its span is not prepared again in this process
(:meth:`~proxy.session.background.Background.spend`): asked again, the model
would give the same nothing, once per request until the trigger.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from compaction import (
    Checkpoint,
    CompactionResult,
    Conversation,
    Decision,
    Message,
    Summarizer,
    ahead,
)
from proxy.session.compacting import (
    Emitter,
    Job,
    Ruling,
    checkpoint_of,
    event_notes,
    look_up,
    run_plan,
)
from proxy.state.models import calibration_key
from proxy.state.stores import RequestRecord
from proxy.upstream.summarizer import Paid, UpstreamSummarizer
from proxy.upstream.traffic import GaveWay

if TYPE_CHECKING:
    from proxy.session.service import Conversations

logger = logging.getLogger("compaction_proxy.background")


def span_key(conversation: Conversation, base: Checkpoint | None) -> str | None:
    """Names the span a compaction prepared ahead would cover: what follows the
    checkpoint in use (or the head), in this session (the chain starts after
    the head, which holds the task). The chain is seeded with the caller's
    scope, so no two callers share a key."""
    if base is not None:
        return f"precompute:{conversation.session}:{base.end_hash}"
    if not conversation.chain:
        return None
    return f"precompute:{conversation.session}:{conversation.chain[0]}"


def prepares_ahead(job: Job, decision: Decision) -> bool:
    """Whether compactions of ``job``'s conversation are prepared in the background."""
    return (
        decision.reason == "threshold"
        and job.summarizer is not None
        and job.config.profile.prepares_ahead
    )


async def prepare_ahead(job: Job, span: str, ruling: Ruling | None = None) -> None:
    """Prepare the compaction ``job``'s conversation will need at its trigger,
    and store it as a precomputed checkpoint (see the module docstring).

    ``ruling`` is the decision of the request that starts the job (a forward
    with :attr:`~compaction.Decision.prepare`) and the store's answer it was
    made on; ``None`` after a compaction, whose own checkpoint makes the store's
    answer a new one to decide on.

    Events are written only once the model is asked: when pruning will do at
    the trigger, nothing is prepared and nothing recorded.
    """
    conversations = job.conversations
    traffic = conversations.upstream.traffic
    outcome = "cancelled"
    try:
        if conversations.settings.background.single_slot == "off" and conversations.single_slot(
            job.config
        ):
            outcome = "single_slot"
            if traffic.tell_once(calibration_key(job.config)):
                logger.warning(
                    "compactions are not prepared ahead for %s: it serves one request "
                    "at a time (background.single_slot = off)",
                    job.config.model or "the default model",
                )
            return
        if conversations.background.spent(span):
            outcome = "spent"  # the trigger's compaction makes it, as without preparing
            return
        async with conversations.store.lock(span, conversations.settings.store.lock_ttl_seconds):
            if ruling is None:
                stored = await look_up(conversations.store, job.conversation)
                ruling = Ruling(stored, job.decide(stored))
            else:  # prepared or compacted meanwhile?
                ruling = await job.recheck(ruling)
            decision = ruling.decision
            if decision.action != "forward" or not decision.prepare:
                outcome = "superseded"
                return
            outcome = await _ahead(job, ahead(job.conversation, decision))
            if outcome == "superseded":
                conversations.background.spend(span)
    finally:
        conversations.observed.metrics.background.labels(outcome).inc()


async def _ahead(job: Job, plan: Decision) -> str:
    """Run ``plan`` (:func:`compaction.ahead`) and store its result; the outcome's name."""
    conversations, conversation = job.conversations, job.conversation
    emit = Emitter(conversations, conversation.session, job.config.model, plan.reason, job.owner)
    summarizer = _off_the_request_path(conversations, job.summarizer)
    announcing = _Announcing(summarizer, emit, job) if summarizer is not None else None
    spent, asked, paid = _tokens(summarizer), _calls(summarizer), _paid(summarizer)
    try:
        result = await run_plan(dataclasses.replace(job, summarizer=announcing), plan)
    except asyncio.CancelledError:
        if announcing is not None and announcing.called:
            await emit("compaction.failed", error="cancelled at shutdown", background=True)
        raise
    except Exception as exc:
        if announcing is not None and announcing.gave_way is not None:
            await emit("compaction.superseded", error=announcing.gave_way, background=True)
            return "gave_way"
        if announcing is not None and announcing.called:
            await emit(
                "compaction.failed",
                error=f"{type(exc).__name__}: {exc}"[:1000],
                background=True,
            )
        return "failed"
    if announcing is None or not announcing.called:
        return "not_needed"
    if announcing.gave_way is not None:
        # Cancelled for a user request: whatever the compaction made of it
        # (an extractive fallback) is not what the trigger would make.
        await emit("compaction.superseded", error=announcing.gave_way, background=True)
        return "gave_way"
    _record(
        job, plan, result, summarizer, _calls(summarizer) - asked, _tokens(summarizer) - spent, paid
    )
    # A summary the model failed to write fell back to extractive, as it would
    # have at the trigger: kept too, so the model is not asked twice.
    made = None
    if result.stage == "condensed":
        made = checkpoint_of(job, plan, result, precomputed=True)
    if made is None:
        # The model answered, and nothing failed: its result is just no
        # compaction a later request could apply (the summary refused, so only
        # pruned; or the summarized span inside an earlier summary). The
        # trigger's compaction decides anew.
        why = (
            f"its summary was not used (the compaction ended {result.stage})"
            if result.stage != "condensed"
            else "the compaction ended condensed, but over nothing a later request can apply"
        )
        await emit(
            "compaction.superseded",
            stage=result.stage,
            error=f"not kept: {why}; not prepared again for this span",
            notes=event_notes(result),
            background=True,
        )
        return "superseded"
    head = conversation.head
    originals = conversation.messages[head : head + made.covered]
    await conversations.store.put(made, originals, owner=job.owner)
    await emit(
        "context.compacted",
        stage=result.stage,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        replaced_hashes=tuple(conversation.chain[: made.covered]),
        checkpoint_id=made.id,
        notes=event_notes(result),
        background=True,
    )
    return "prepared"


def _record(
    job: Job,
    plan: Decision,
    result: CompactionResult,
    summarizer: Summarizer | None,
    calls: int,
    tokens: int,
    paid: Paid,
) -> None:
    """A preparation's summary in the metrics, and what the model was asked
    in the figures, for the dashboard."""
    observed = job.conversations.observed
    observed.metrics.record_summary(result)
    if observed.recorder is None:
        return
    observed.recorder.record(
        RequestRecord(
            session=job.conversation.session,
            owner=job.owner,
            model=job.config.model,
            stage=result.stage,
            reason=plan.reason,
            tokens_before=0,
            tokens_after=0,
            input_limit=0,
            trigger=0,
            status=0,
            ms=0.0,
            summarizer_calls=calls,
            summarizer_tokens=tokens,
            background=True,
            **_paid_since(summarizer, paid),
        )
    )


def _off_the_request_path(
    conversations: Conversations, summarizer: Summarizer | None
) -> Summarizer | None:
    """The request's summarizer, asking through the background's own pool."""
    pool = conversations.upstream.summaries_transport
    if pool is not None and isinstance(summarizer, UpstreamSummarizer):
        return summarizer.via(pool)
    return summarizer


def _tokens(summarizer: Summarizer | None) -> int:
    """What the proxy's summarizer (:class:`proxy.upstream.summarizer.UpstreamSummarizer`)
    has counted so far; the request that started this job is done with it."""
    return int(getattr(summarizer, "tokens", 0))


def _paid(summarizer: Summarizer | None) -> Paid:
    """What the proxy's summarizer has used and cost so far."""
    found = getattr(summarizer, "paid", None)
    return found if isinstance(found, Paid) else Paid()


def _paid_since(summarizer: Summarizer | None, before: Paid) -> dict[str, Any]:
    """The cost figures of a preparation: its calls' tokens and price."""
    paid = _paid(summarizer) - before
    return {
        "summarizer_prompt_tokens": paid.prompt,
        "summarizer_output_tokens": paid.output,
        "cost": paid.cost,
        "cost_dollars": paid.dollars,
    }


def _calls(summarizer: Summarizer | None) -> int:
    """The requests the proxy's summarizer has sent so far, as /metrics counts them."""
    return int(getattr(summarizer, "calls", 0))


class _Announcing:
    """A summarizer that records the compaction's start when first called, and
    asks through the upstream's :class:`~proxy.upstream.traffic.Traffic`:
    on a one-slot upstream, only while no user request is in flight."""

    def __init__(self, summarizer: Summarizer, emit: Emitter, job: Job) -> None:
        self._summarizer = summarizer
        self._emit = emit
        self._job = job
        self.called = False
        #: Why a call gave way to a user request (then the result is not kept).
        self.gave_way: str | None = None

    async def __call__(self, messages: list[Message], max_tokens: int) -> str:
        if self.gave_way is not None:
            raise GaveWay(self.gave_way)
        if not self.called:
            self.called = True
            await self._emit("compaction.queued", background=True)
            await self._emit("compaction.started", background=True)
        conversations, config = self._job.conversations, self._job.config
        try:
            return await conversations.upstream.traffic.summary(
                calibration_key(config),
                self._summarizer(messages, max_tokens),
                single=conversations.single_slot(config),
                patience=conversations.settings.upstream.summarizer_timeout_seconds,
            )
        except GaveWay as exc:
            self.gave_way = str(exc)
            raise
