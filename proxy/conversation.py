"""One request's conversation against the store: look up, lock, execute,
store, record.

The policy is the library's (:mod:`compaction.decide`); this module does
the I/O around it:

1. the conversation is read once (:func:`compaction.read_conversation`);
2. the store is asked for the checkpoints on its chain, and the library
   decides: forward (over the newest checkpoint, if any) or compact;
3. forwarding takes no lock and writes nothing;
4. compacting takes the conversation's single-flight lock, asks the store
   again (another request may have just compacted it), and runs the plan
   with ``compaction.queued → compaction.started → context.compacted`` (or
   ``compaction.failed``) events;
5. the result is stored as a checkpoint with the messages it replaced.

Ahead of need (the llm summarizer): a forward past ``precompute_share`` of
the trigger starts :func:`_prepare_ahead` in the background
(:mod:`proxy.background`): it stores the compaction the conversation will
need as a *precomputed* checkpoint, which the request crossing the trigger
applies instead of waiting for a model. That request waits only for a
preparation still running for its span, never asks the model twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from compaction import (
    Budget,
    Checkpoint,
    CompactionResult,
    Conversation,
    Decision,
    Message,
    Profile,
    Reason,
    Summarizer,
    ahead,
    calibrated_budget,
    condenses,
    decide,
    execute,
    forwarded,
    new_checkpoint,
    read_conversation,
    read_conversation_async,
    requested_output_tokens,
    text_size,
)
from config import ModelConfig
from proxy import steering
from proxy.state import ProxyState
from proxy.stores import Event, EventType

logger = logging.getLogger("compaction_proxy.checkpoints")


@dataclass(frozen=True)
class Prepared:
    """What to forward for one request, and what happened on the way."""

    messages: list[Message]
    #: True when ``messages`` is exactly what the client sent.
    untouched: bool
    result: CompactionResult
    checkpoint: Checkpoint | None  #: made or used

    @property
    def stage(self) -> str:
        return self.result.stage

    @property
    def tokens_before(self) -> int:
        return self.result.tokens_before

    def headers(self) -> dict[str, str]:
        result = self.result
        headers = {
            "x-compaction-stage": result.stage,
            "x-compaction-reason": result.reason
            if result.stage not in ("none", "reused")
            else "none",
            "x-compaction-tokens-before": str(result.tokens_before),
            "x-compaction-tokens-after": str(result.tokens_after),
        }
        if self.checkpoint is not None:
            headers["x-compaction-id"] = self.checkpoint.id
        if result.precomputed is not None:
            headers["x-compaction-precomputed"] = result.precomputed
        return headers


def scope_of(config: ModelConfig, credential: str | None, api: str = "chat") -> bytes:
    """Whose conversation, for which model: what seeds its checkpoint chain.

    A digest of the credential the request goes upstream with (never the
    credential itself), the model and the API, so that one caller's
    checkpoints, locks and summaries never reach another caller, nor another
    model of the same caller.
    """
    parts = (credential or "", config.model, api)
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).digest()


def identify(
    state: ProxyState,
    config: ModelConfig,
    body: Mapping[str, Any],
    messages: list[Message],
    scope: bytes = b"",
) -> Conversation:
    """:func:`compaction.read_conversation` with this model's counter: tokenizes
    what the cache has not seen, so the caller may run it in a worker thread
    and hand the result to :func:`prepare`."""
    counter = state.counter(config)
    return read_conversation(body, messages, counter, config.profile.head_count, scope=scope)


async def prepare(
    state: ProxyState,
    body: Mapping[str, Any],
    messages: list[Message],
    config: ModelConfig,
    summarizer: Summarizer | None,
    *,
    reason: Reason = "threshold",
    instructions: str | None = None,
    budget: Budget | None = None,
    store: bool = True,
    identified: Conversation | None = None,
    scope: bytes = b"",
    owner: str = "",
) -> Prepared:
    """Decide, and compact if needed, remembering the result.

    ``messages`` is the client's conversation (``/compact`` exchanges already
    removed); ``body`` supplies every other field for counting;
    ``identified`` is :func:`identify` of ``messages`` if the caller has it;
    ``scope`` is :func:`scope_of` the request, and ``owner`` whose events and
    checkpoint it records (:func:`proxy.access.owner_of`).
    ``budget`` replaces the calibrated one (the overflow retry's).
    ``store=False`` (the preview) changes nothing: no lock, no events, no
    checkpoint. Raises what :func:`compaction.execute` raises.
    """
    profile = config.profile
    counter = state.counter(config)
    conversation = identified
    if (
        conversation is None
        or conversation.messages is not messages
        or conversation.head_count != profile.head_count
        or conversation.counter is not counter
        or conversation.scope != scope
    ):
        conversation = await read_conversation_async(
            body, messages, counter, profile.head_count, scope=scope
        )
    if budget is None:
        budget = calibrated_budget(profile, requested_output_tokens(body), state.ratio(config))
    job = _Job(
        state, conversation, config, profile, budget, reason, summarizer, instructions, owner
    )
    decision = await job.decide()
    job, decision = await steering.steer(job, decision, preview=not store)  # its settings
    if not store:  # the preview: run everything, remember nothing
        result = await _execute(job, decision)
        return Prepared(
            result.messages, _untouched(conversation, result), result, decision.checkpoint
        )
    if decision.action == "forward":
        span = _span_key(conversation, decision.checkpoint)
        if decision.prepare and summarizer is not None and span is not None:
            state.background.start(span, _prepare_ahead(job, span))
        return _forward(conversation, decision)
    ttl = state.settings.store.lock_ttl_seconds
    span = _span_key(conversation, decision.checkpoint)
    ready = decision.checkpoint is not None and decision.checkpoint.precomputed
    if span is not None and not ready and _prepares_ahead(job):
        # A compaction being prepared for this span (here or by another
        # replica, which holds the span's lock) is waited for, not redone.
        await state.background.wait(span)
        async with state.store.lock(span, ttl):
            pass
        decision = await job.decide()
    key = f"compact:{conversation.chain[-1] if conversation.chain else conversation.session}"
    async with state.store.lock(key, ttl):
        decision = await job.decide()  # another request may have just compacted it
        if decision.action == "forward":
            return _forward(conversation, decision)
        prepared = await _run(job, decision)
    span = _span_key(conversation, prepared.checkpoint)
    if prepared.checkpoint is not None and span is not None and _prepares_ahead(job):
        # Left near the trigger, the conversation may need its next compaction
        # soon: the job asks the store and prepares it if so.
        state.background.start(span, _prepare_ahead(job, span))
    return prepared


def _span_key(conversation: Conversation, base: Checkpoint | None) -> str | None:
    """Names the span a compaction prepared ahead would cover: what follows the
    checkpoint in use (or the head), in this session (the chain starts after
    the head, which holds the task). The chain is seeded with the caller's
    scope, so no two callers share a key."""
    if base is not None:
        return f"precompute:{conversation.session}:{base.end_hash}"
    if not conversation.chain:
        return None
    return f"precompute:{conversation.session}:{conversation.chain[0]}"


def _prepares_ahead(job: _Job) -> bool:
    """Whether compactions of ``job``'s conversation are prepared in the background."""
    profile = job.profile
    return (
        job.reason == "threshold"
        and job.summarizer is not None
        and profile.summarizer == "llm"
        and condenses(profile)
        and profile.precompute_share > 0
    )


async def _prepare_ahead(job: _Job, span: str) -> None:
    """Prepare the compaction ``job``'s conversation will need at its trigger,
    and store it as a precomputed checkpoint (see the module docstring).

    Events are written only once the model is asked: when pruning will do at
    the trigger, nothing is prepared and nothing recorded.
    """
    state = job.state
    outcome = "cancelled"
    try:
        async with state.store.lock(span, state.settings.store.lock_ttl_seconds):
            decision = await job.decide()  # prepared or compacted meanwhile?
            job, decision = await steering.steer(job, decision, ahead=True)
            if decision.action != "forward" or not decision.prepare:
                outcome = "superseded"
                return
            outcome = await _ahead(job, ahead(job.conversation, decision))
    finally:
        state.metrics.background.labels(outcome).inc()


async def _ahead(job: _Job, plan: Decision) -> str:
    """Run ``plan`` (:func:`compaction.ahead`) and store its result; the outcome's name."""
    state, conversation = job.state, job.conversation
    emit = _Emitter(state, conversation.session, job.config.model, job.reason, job.owner)
    announcing = _Announcing(job.summarizer, emit) if job.summarizer is not None else None
    try:
        result = await _execute(dataclasses.replace(job, summarizer=announcing), plan)
    except asyncio.CancelledError:
        if announcing is not None and announcing.called:
            await emit("compaction.failed", error="cancelled at shutdown", background=True)
        raise
    except Exception as exc:
        if announcing is not None and announcing.called:
            await emit(
                "compaction.failed",
                error=f"{type(exc).__name__}: {exc}"[:1000],
                background=True,
            )
        return "failed"
    if announcing is None or not announcing.called:
        return "not_needed"
    # A summary the model failed to write fell back to extractive, as it would
    # have at the trigger: kept too, so the model is not asked twice.
    made = None
    if result.stage == "condensed":
        made = _checkpoint_of(job, result, precomputed=True, base=plan.checkpoint)
    if made is None:
        await emit(
            "compaction.failed",
            error=f"nothing to prepare: the compaction ended {result.stage}",
            notes=tuple(note[:500] for note in result.notes[:20]),
            background=True,
        )
        return "failed"
    head = conversation.head
    await state.store.put(made, conversation.messages[head : head + made.covered], owner=job.owner)
    await emit(
        "context.compacted",
        stage=result.stage,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        replaced_hashes=tuple(conversation.chain[: made.covered]),
        checkpoint_id=made.id,
        notes=tuple(note[:500] for note in result.notes[:20]),
        background=True,
    )
    return "prepared"


class _Announcing:
    """A summarizer that records the compaction's start when first called."""

    def __init__(self, summarizer: Summarizer, emit: _Emitter) -> None:
        self._summarizer = summarizer
        self._emit = emit
        self.called = False

    async def __call__(self, messages: list[Message], max_tokens: int) -> str:
        if not self.called:
            self.called = True
            await self._emit("compaction.queued", background=True)
            await self._emit("compaction.started", background=True)
        return await self._summarizer(messages, max_tokens)


def _forward(conversation: Conversation, decision: Decision) -> Prepared:
    """A request forwarded as it is, or over its stored compaction: no lock, no write."""
    result = forwarded(conversation, decision)
    return Prepared(result.messages, decision.untouched, result, decision.checkpoint)


@dataclass(frozen=True)
class _Job:
    """What stays the same for one request while it is being prepared."""

    state: ProxyState
    conversation: Conversation
    config: ModelConfig
    profile: Profile
    budget: Budget
    reason: Reason
    summarizer: Summarizer | None
    instructions: str | None
    owner: str

    async def decide(self) -> Decision:
        chain = self.conversation.chain
        stored = await self.state.store.lookup(chain) if chain else {}
        decision = decide(
            self.conversation,
            self.profile,
            self.budget,
            reason=self.reason,
            stored=stored,
            progress_min_ratio=self.state.settings.store.progress_min_ratio,
        )
        for note in decision.notes:
            logger.warning("%s", note)
        return decision


def _checkpoint_of(
    job: _Job,
    result: CompactionResult,
    *,
    precomputed: bool = False,
    base: Checkpoint | None = None,
) -> Checkpoint | None:
    shrink = 1 - result.tokens_after / max(result.tokens_before, 1)
    return new_checkpoint(
        job.conversation,
        result,
        id=uuid.uuid4().hex,
        created_at=time.time(),
        progress_ok=shrink >= job.state.settings.store.progress_min_ratio,
        model=job.config.model,
        window=job.budget.context_window,
        precomputed=precomputed,
        base=base,
    )


def _untouched(conversation: Conversation, result: CompactionResult) -> bool:
    return result.messages is conversation.messages


async def _run(job: _Job, decision: Decision) -> Prepared:
    """Compact with events, and store the result as a checkpoint."""
    state, conversation = job.state, job.conversation
    emit = _Emitter(state, conversation.session, job.config.model, job.reason, job.owner)
    await emit("compaction.queued")
    await emit("compaction.started")
    try:
        result = await _execute(job, decision)
    except Exception as exc:
        await emit("compaction.failed", error=f"{type(exc).__name__}: {exc}"[:1000])
        raise
    made = None
    if result.changed:
        made = _checkpoint_of(job, result)
        if made is not None:
            head = conversation.head
            originals = conversation.messages[head : head + made.covered]
            await state.store.put(made, originals, owner=job.owner)
    await emit(
        "context.compacted",
        stage=result.stage,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        replaced_hashes=tuple(conversation.chain[: made.covered]) if made else (),
        checkpoint_id=made.id if made else None,
        notes=tuple(note[:500] for note in result.notes[:20]),
    )
    return Prepared(
        messages=result.messages,
        untouched=_untouched(conversation, result),
        result=result,
        checkpoint=made or decision.checkpoint,
    )


#: A conversation with more text than this (about 40k tokens) is compacted in
#: a worker thread: pruning and condensing a few hundred thousand tokens is
#: hundreds of milliseconds of CPU, during which the event loop would serve
#: no one — with the thread, the GIL hands it back every few milliseconds.
COMPACT_OFF_LOOP_CHARS = 160_000


async def _execute(job: _Job, decision: Decision) -> CompactionResult:
    summarizer = job.summarizer
    off_loop = text_size(decision.messages) > COMPACT_OFF_LOOP_CHARS
    if off_loop and summarizer is not None:
        # The worker runs its own event loop; the summarizer's HTTP client
        # belongs to this one, so its calls are sent back here to run.
        summarizer = _OnLoop(summarizer, asyncio.get_running_loop())
    work = execute(job.conversation, decision, summarizer, instructions=job.instructions)
    if off_loop:
        return await asyncio.to_thread(asyncio.run, work)
    return await work


class _OnLoop:
    """A summarizer called from another thread's event loop, run on ``loop``."""

    def __init__(self, summarizer: Summarizer, loop: asyncio.AbstractEventLoop) -> None:
        self._summarizer = summarizer
        self._loop = loop

    async def __call__(self, messages: list[Message], max_tokens: int) -> str:
        done = asyncio.run_coroutine_threadsafe(self._summarizer(messages, max_tokens), self._loop)
        return await asyncio.wrap_future(done)


class _Emitter:
    """Appends the lifecycle events of one compaction."""

    def __init__(
        self, state: ProxyState, session: str, model: str, reason: str, owner: str
    ) -> None:
        self._state = state
        self._base: dict[str, Any] = {
            "compaction_id": uuid.uuid4().hex,
            "session": session,
            "model": model,
            "reason": reason,
            "instance": state.instance,
            "owner": owner,
        }

    async def __call__(self, kind: EventType, **fields: Any) -> None:
        event = Event(type=kind, **self._base, **fields)
        await self._state.store.add_event(event)
