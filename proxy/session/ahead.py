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
model twice (:func:`proxy.session.conversation.resolve`).

A preparation's summaries go through the upstream pool of the background
(:attr:`proxy.state.runtime.ProxyState.background_transport`), never the one
the requests use: however many are under way, and however slowly the model
answers them, a request never waits for a connection they hold. A compaction
on the request path asks through the request's pool, as the request itself.
How many run at once is capped by :class:`~proxy.session.background.Background`.

A server that serves one request at a time (llama.cpp's default) would make
the user's next request queue behind a preparation's summary. For such an
upstream (:meth:`proxy.session.background.Traffic.single_slot`) a summary is
asked only while no user request to it is in flight, and a user request that
arrives meanwhile cancels it (:class:`~proxy.session.background.Traffic`):
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
import weakref
from typing import TYPE_CHECKING, Any

from compaction import Checkpoint, Conversation, Decision, Message, Summarizer, ahead
from config import ModelConfig
from proxy.session.background import GaveWay, Sending
from proxy.session.compacting import (
    Basis,
    Emitter,
    Job,
    checkpoint_of,
    event_notes,
    look_up,
    run_plan,
)
from proxy.state.models import calibration_key
from proxy.state.stores import RequestRecord
from proxy.upstream.summarizer import Paid, UpstreamSummarizer
from proxy.upstream.transport import UpstreamResponse

if TYPE_CHECKING:
    from proxy.state.runtime import ProxyState

logger = logging.getLogger("compaction_proxy.background")


def single_slot(state: ProxyState, config: ModelConfig) -> bool:
    """Whether ``config``'s upstream serves one request at a time, as it states
    (``total_slots``) or as seen (:meth:`~proxy.session.background.Traffic.single_slot`)."""
    return state.traffic.single_slot(calibration_key(config), state.models.slots(config))


async def sending(state: ProxyState, config: ModelConfig) -> Sending:
    """A user's request is about to be sent upstream: counted in flight until
    its answer is over (:func:`counted`), and on a one-slot upstream the
    background summaries to it cancelled first."""
    return await state.traffic.begin(calibration_key(config), single=single_slot(state, config))


def counted(response: UpstreamResponse, sent: Sending) -> UpstreamResponse:
    """``response``, whose end (read to its end, released or aborted — every
    answer is, a stream's once relayed) ends ``sent``: a stream keeps a
    one-slot server busy until its last byte, not just until its headers."""
    return _Counted(response, sent)


class _Counted(UpstreamResponse):
    """An upstream answer that ends a :class:`Sending` when it is over."""

    __slots__ = ("__weakref__", "_inner", "_sent")

    # The base class is not initialised: every read goes to the inner answer.
    def __init__(self, inner: UpstreamResponse, sent: Sending) -> None:
        self._inner = inner
        self._sent = sent
        self.status = inner.status
        self.url = inner.url
        self.raw_headers = inner.raw_headers
        self.length = inner.length
        # An answer dropped unreleased (a bug) must not hold the count forever.
        weakref.finalize(self, sent.end)

    def header(self, name: str) -> str | None:
        return self._inner.header(name)

    async def next_chunk(self) -> bytes | None:
        try:
            chunk = await self._inner.next_chunk()
        except BaseException:
            self._sent.end()
            raise
        if chunk is None:
            self._sent.end()
        return chunk

    async def read(self, limit: int = 1 << 20) -> bytes:
        try:
            return await self._inner.read(limit)
        finally:
            self._sent.end()

    async def wait_body(self) -> bool:
        try:
            return await self._inner.wait_body()
        except BaseException:
            self._sent.end()
            raise

    def release(self) -> None:
        self._inner.release()
        self._sent.end()

    def abort(self) -> None:
        self._inner.abort()
        self._sent.end()


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


async def prepare_ahead(job: Job, span: str, basis: Basis | None = None) -> None:
    """Prepare the compaction ``job``'s conversation will need at its trigger,
    and store it as a precomputed checkpoint (see the module docstring).

    ``basis`` is the decision of the request that starts the job (a forward
    with :attr:`~compaction.Decision.prepare`) and the store's answer it was
    made on; ``None`` after a compaction, whose own checkpoint makes the store's
    answer a new one to decide on.

    Events are written only once the model is asked: when pruning will do at
    the trigger, nothing is prepared and nothing recorded.
    """
    state = job.state
    outcome = "cancelled"
    try:
        if state.settings.background.single_slot == "off" and single_slot(state, job.config):
            outcome = "single_slot"
            if state.traffic.tell_once(calibration_key(job.config)):
                logger.warning(
                    "compactions are not prepared ahead for %s: it serves one request "
                    "at a time (background.single_slot = off)",
                    job.config.model or "the default model",
                )
            return
        if state.background.spent(span):
            outcome = "spent"  # the trigger's compaction makes it, as without preparing
            return
        async with state.store.lock(span, state.settings.store.lock_ttl_seconds):
            if basis is None:
                stored = await look_up(state, job.conversation)
                basis = Basis(stored, job.decide(stored))
            else:  # prepared or compacted meanwhile?
                basis = await job.recheck(basis)
            decision = basis.decision
            if decision.action != "forward" or not decision.prepare:
                outcome = "superseded"
                return
            outcome = await _ahead(job, ahead(job.conversation, decision))
            if outcome == "superseded":
                state.background.spend(span)
    finally:
        state.metrics.background.labels(outcome).inc()


async def _ahead(job: Job, plan: Decision) -> str:
    """Run ``plan`` (:func:`compaction.ahead`) and store its result; the outcome's name."""
    state, conversation = job.state, job.conversation
    emit = Emitter(state, conversation.session, job.config.model, plan.reason, job.owner)
    summarizer = _off_the_request_path(state, job.summarizer)
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
    state.metrics.record_summary(result)
    if state.recorder is not None:  # what the model was asked, for the dashboard
        state.recorder.record(
            RequestRecord(
                session=conversation.session,
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
                summarizer_calls=_calls(summarizer) - asked,
                summarizer_tokens=_tokens(summarizer) - spent,
                background=True,
                **_paid_since(summarizer, paid),
            )
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
    await state.store.put(made, conversation.messages[head : head + made.covered], owner=job.owner)
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


def _off_the_request_path(state: ProxyState, summarizer: Summarizer | None) -> Summarizer | None:
    """The request's summarizer, asking through the background's own pool."""
    pool = state.background_transport
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
    asks through the upstream's :class:`~proxy.session.background.Traffic`:
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
        state, config = self._job.state, self._job.config
        try:
            return await state.traffic.summary(
                calibration_key(config),
                self._summarizer(messages, max_tokens),
                single=single_slot(state, config),
                patience=state.settings.upstream.summarizer_timeout_seconds,
            )
        except GaveWay as exc:
            self.gave_way = str(exc)
            raise
