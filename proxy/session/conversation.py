"""One request's conversation against the store: look up, decide, lock,
execute, store, record — :func:`compact_if_needed`.

The policy is the library's (:mod:`compaction.decide`); this module does
the I/O around it, and decides once:

1. the conversation is read once (:func:`compaction.read_conversation`);
2. the store is asked for the checkpoints on its chain and, where they can
   matter (:func:`compaction.steering_can_matter`: not for a small request
   with no checkpoint, most of what a proxy sees), for the session's
   settings (:func:`proxy.session.steering.steering_for`) — both at once
   when the request's size already says they matter; on those answers the
   library decides, once: forward (over the newest checkpoint, if any) or
   compact, with the settings applied;
3. forwarding takes no lock and writes nothing;
4. compacting takes the conversation's single-flight lock and asks the store
   again (another request may have just compacted it): an unchanged answer
   keeps the decision; a changed one is a new input, decided on once more
   (:meth:`~proxy.session.compacting.Job.recheck`). The plan runs with
   ``compaction.queued → compaction.started → context.compacted`` (or
   ``compaction.failed``) events;
5. the result is stored as a checkpoint with the messages it replaced.

Ahead of need (the llm summarizer): a forward past ``precompute_share`` of
the trigger starts :func:`proxy.session.ahead.prepare_ahead` in the background,
handing it the decision and the answer it was made on: it stores the
compaction the conversation will need as a *precomputed* checkpoint, which the
request crossing the trigger applies instead of waiting for a model. That
request waits only for a preparation still running for its span, never asks
the model twice. :mod:`proxy.session.compacting` runs a compaction for both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Coroutine, Mapping
from typing import Any

from compaction import (
    Budget,
    Checkpoint,
    CompactionResult,
    Conversation,
    Decision,
    Message,
    Prices,
    Reason,
    Steering,
    Summarizer,
    forwarded,
    read_conversation,
    read_conversation_async,
    steering_can_matter,
)
from config import ModelConfig
from proxy.session import steering
from proxy.session.ahead import prepare_ahead, prepares_ahead, span_key
from proxy.session.compacting import (
    Emitter,
    Job,
    Ruling,
    checkpoint_of,
    event_notes,
    look_up,
    run_plan,
)
from proxy.session.naming import session_name
from proxy.session.request import (
    BareRequest as BareRequest,  # imported from here by the request path
)
from proxy.session.request import ConversationRequest, request_budget, usable_reading
from proxy.session.request import Resolved as Resolved
from proxy.session.service import Conversations

logger = logging.getLogger("compaction_proxy.checkpoints")


def scope_of(config: ModelConfig, credential: str | None, api: str = "chat") -> bytes:
    """Whose conversation, for which model: what seeds its checkpoint chain.

    A digest of the credential the request goes upstream with (never the
    credential itself), the model and the API, so that one caller's
    checkpoints, locks and summaries never reach another caller, nor another
    model of the same caller.
    """
    parts = (credential or "", config.model, api)
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).digest()


def recall_salt(scope: bytes) -> str:
    """The key of the refs a conversation's compaction writes
    (:mod:`compaction.recall`): its scope, so that the same content has
    another ref for another caller, and no caller can make one of another's."""
    return scope.hex()


def identify(
    conversations: Conversations,
    config: ModelConfig,
    body: Mapping[str, Any],
    messages: list[Message],
    scope: bytes = b"",
) -> Conversation:
    """:func:`compaction.read_conversation` with this model's counter: tokenizes
    what the cache has not seen, so the caller may run it in a worker thread
    and hand the result to :func:`compact_if_needed`."""
    counter = conversations.counter(config)
    return read_conversation(
        body,
        messages,
        counter,
        config.profile.head_count,
        scope=scope,
        recall_salt=recall_salt(scope),
    )


async def compact_if_needed(
    conversations: Conversations,
    request: ConversationRequest,
    summarizer: Summarizer | None,
    *,
    reason: Reason = "threshold",
    instructions: str | None = None,
    budget: Budget | None = None,
    held_back: int = 0,
    prices: Prices | None = None,
    store: bool = True,
) -> Resolved:
    """Decide, once, and compact if needed, remembering the result.

    ``instructions`` are the request's own (``/compact <focus>``); ``budget``
    replaces the calibrated one (the overflow retry's); ``held_back`` tokens
    of it are kept for what goes upstream beside the messages once compacted
    (:meth:`compaction.Budget.holding_back`); ``prices`` are the upstream's, for
    the compaction plan. ``store=False`` (the preview)
    changes nothing: no lock, no events, no checkpoint. Raises what
    :func:`compaction.execute` raises.
    """
    config = request.config
    conversation = await _conversation(conversations, request)
    if budget is None:
        budget = request_budget(conversations, request, held_back)
    else:
        budget = budget.holding_back(held_back)
    stored, steering_of = await _stored_and_steering(
        conversations, request, conversation, budget, reason, preview=not store
    )
    job = Job(
        conversations=conversations,
        conversation=conversation,
        config=config,
        budget=budget,
        reason=reason,
        summarizer=summarizer,
        steering=steering_of,
        instructions=instructions,
        owner=request.owner,
        prices=prices,
    )
    ruling = Ruling(stored, job.decide(stored))
    decision = ruling.decision
    if not store:  # the preview: run everything, remember nothing
        result = await run_plan(job, decision)
        untouched = _untouched(conversation, result)
        return Resolved(untouched, result, decision.checkpoint, conversation.session)
    if decision.action == "forward":
        if decision.prepare and summarizer is not None:
            span = span_key(conversation, decision.checkpoint)
            if span is not None:
                conversations.background.start(
                    span, prepare_ahead(job, span, ruling), owner=job.owner
                )
        return _forward(conversation, decision)
    return await _compact_locked(job, ruling)


async def _compact_locked(job: Job, ruling: Ruling) -> Resolved:
    """Compact under the conversation's lock, once a wait for a preparation of
    the same span is over, unless what the store answers by then says forward."""
    conversations, conversation, decision = job.conversations, job.conversation, ruling.decision
    ttl = conversations.settings.store.lock_ttl_seconds
    span = span_key(conversation, decision.checkpoint)
    ready = decision.checkpoint is not None and decision.checkpoint.precomputed
    if span is not None and not ready and prepares_ahead(job, decision):
        # A compaction being prepared for this span (here or by another
        # replica, which holds the span's lock) is waited for, not redone.
        await conversations.background.wait(span)
        async with conversations.store.lock(span, ttl):
            pass
    key = f"compact:{conversation.chain[-1] if conversation.chain else conversation.session}"
    async with conversations.store.lock(key, ttl):
        ruling = await job.recheck(ruling)  # another request may have just compacted it
        decision = ruling.decision
        if decision.action == "forward":
            return _forward(conversation, decision)
        resolved = await _run(job, decision)
    span = span_key(conversation, resolved.checkpoint)
    if resolved.checkpoint is not None and span is not None and prepares_ahead(job, decision):
        # Left near the trigger, the conversation may need its next compaction
        # soon: the job asks the store and prepares it if so.
        conversations.background.start(span, prepare_ahead(job, span), owner=job.owner)
    return resolved


async def _stored_and_steering(
    conversations: Conversations,
    request: ConversationRequest,
    conversation: Conversation,
    budget: Budget,
    reason: Reason,
    *,
    preview: bool,
) -> tuple[Mapping[str, Checkpoint], Steering]:
    """The store's checkpoints for the chain, and the session's settings where
    they can change the decision (the defaults where they cannot, unread)."""
    session, owner, profile = conversation.session, request.owner, request.config.profile

    def settings() -> Coroutine[Any, Any, Steering]:
        return steering.steering_for(conversations, session, owner, preview=preview)

    if steering.compact_now_pending(conversations, session, owner) or steering_can_matter(
        conversation, profile, budget, reason=reason
    ):
        # Asked together: the settings' read costs the request no extra wait.
        found, steered = await asyncio.gather(
            look_up(conversations.store, conversation), settings()
        )
        return found, steered
    stored = await look_up(conversations.store, conversation)
    if steering_can_matter(conversation, profile, budget, reason=reason, stored=stored):
        return stored, await settings()
    return stored, Steering()


async def _conversation(conversations: Conversations, request: ConversationRequest) -> Conversation:
    """``request.identified`` when it was read for this model and scope, else read
    now; named for its session (:func:`proxy.session.naming.session_name`)."""
    profile, counter = request.config.profile, conversations.counter(request.config)
    conversation = usable_reading(conversations, request)
    if conversation is None:
        conversation = await read_conversation_async(
            request.body,
            request.messages,
            counter,
            profile.head_count,
            scope=request.scope,
            recall_salt=recall_salt(request.scope),
        )
    if conversation.named:
        return conversation
    named = session_name(request.client_session, conversation.session)
    return dataclasses.replace(conversation, named=named)


def _forward(conversation: Conversation, decision: Decision) -> Resolved:
    """A request forwarded as it is, or over its stored compaction: no lock, no write."""
    result = forwarded(conversation, decision)
    return Resolved(decision.untouched, result, decision.checkpoint, conversation.session)


def _untouched(conversation: Conversation, result: CompactionResult) -> bool:
    return result.messages is conversation.messages


async def _run(job: Job, decision: Decision) -> Resolved:
    """Compact with events, and store the result as a checkpoint."""
    conversations, conversation = job.conversations, job.conversation
    emit = Emitter(
        conversations, conversation.session, job.config.model, decision.reason, job.owner
    )
    await emit("compaction.queued")
    await emit("compaction.started")
    try:
        result = await run_plan(job, decision)
    except Exception as exc:
        await emit("compaction.failed", error=f"{type(exc).__name__}: {exc}"[:1000])
        raise
    made = None
    if result.changed:
        made = checkpoint_of(job, decision, result)
        if made is not None:
            head = conversation.head
            originals = conversation.messages[head : head + made.covered]
            await conversations.store.put(made, originals, owner=job.owner)
    await emit(
        "context.compacted",
        stage=result.stage,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        replaced_hashes=tuple(conversation.chain[: made.covered]) if made else (),
        checkpoint_id=made.id if made else None,
        notes=event_notes(result),
    )
    return Resolved(
        untouched=_untouched(conversation, result),
        result=result,
        checkpoint=made or decision.checkpoint,
        session=conversation.session,
        made=made,
        base=decision.checkpoint,
    )
