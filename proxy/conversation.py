"""One request's conversation: stored checkpoint, compaction, events, new checkpoint.

The route handlers call :func:`prepare`; it answers what to forward. It is
the one place that ties the pure library (pipeline, checkpoints) to the
store:

1. every message is keyed, counted, grouped and chained once
   (:func:`identify`; from the token cache when the history was seen before);
2. the newest stored checkpoint of the conversation is applied;
3. under the trigger, that is all (no lock, no event, no summarizer);
4. otherwise one request per conversation state compacts (single flight:
   concurrent requests wait for it and then reuse its checkpoint), with
   ``compaction.queued → compaction.started → context.compacted`` events,
   or ``compaction.failed``;
5. the result is stored as a checkpoint with the messages it replaced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from compaction import CompactionResult, Profile, Reason, Summarizer, compact
from compaction.checkpoints import (
    Checkpoint,
    apply_checkpoint,
    chain_hashes,
    find_checkpoint,
    make_checkpoint,
    session_key,
)
from compaction.messages import Group, PairingProblem, group_and_validate, head_end
from compaction.profile import compute_budget, requested_output_tokens
from compaction.tokens import TokenCounter, count_messages_off_loop, message_keys, text_size
from compaction.types import Message
from config import ModelConfig
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
    tokens_before: int
    checkpoint: Checkpoint | None  #: made or used

    @property
    def stage(self) -> str:
        return self.result.stage

    def headers(self) -> dict[str, str]:
        headers = {
            "x-compaction-stage": self.result.stage,
            "x-compaction-reason": self.result.reason if self.result.stage != "none" else "none",
            "x-compaction-tokens-before": str(self.tokens_before),
            "x-compaction-tokens-after": str(self.result.tokens_after),
        }
        if self.checkpoint is not None:
            headers["x-compaction-id"] = self.checkpoint.id
        return headers


@dataclass(frozen=True)
class Conversation:
    """The client's messages and what identifies them, worked out once per request.

    Every message's key, token count and chain link come from the token
    counter's cache when the client resends a history seen before.
    """

    messages: list[Message]
    keys: list[bytes]  #: :func:`~compaction.tokens.message_key` of each message
    counts: list[int]  #: tokens of each message
    groups: tuple[Group, ...]
    problems: tuple[PairingProblem, ...]  #: how tool calls and results fail to pair up
    head: int
    head_count: int  #: the profile's ``head_count`` that ``head`` was found with
    chain: list[str]
    counter: TokenCounter = field(repr=False, compare=False)  #: what counted them

    @functools.cached_property
    def session(self) -> str:
        """What groups this conversation's events; needed only when it compacts."""
        return session_key(self.messages)


def identify(state: ProxyState, config: ModelConfig, messages: list[Message]) -> Conversation:
    """Key, count, group and chain ``messages`` for :func:`prepare`.

    Tokenizes what the token cache has not seen, so a large new request takes
    a while: the caller may run this in a worker thread and hand the result to
    :func:`prepare`.
    """
    return _identify(state.counter(config), messages, config.profile.head_count)


def _identify(
    counter: TokenCounter,
    messages: list[Message],
    head_count: int,
    keys: list[bytes] | None = None,
    counts: list[int] | None = None,
) -> Conversation:
    keys = message_keys(messages) if keys is None else keys
    counts = counter.count_messages(messages, keys) if counts is None else counts
    grouping = group_and_validate(messages)
    head = head_end(messages, grouping.groups, head_count)
    return Conversation(
        messages=messages,
        keys=keys,
        counts=counts,
        groups=grouping.groups,
        problems=grouping.problems,
        head=head,
        head_count=head_count,
        chain=chain_hashes(messages, head, memo=counter, keys=keys),
        counter=counter,
    )


@dataclass(frozen=True)
class _View:
    """The conversation with its newest stored checkpoint applied (if any)."""

    messages: list[Message]
    used: Checkpoint | None
    counts: list[int]  #: tokens of each of ``messages``
    problems: tuple[PairingProblem, ...]  #: of ``messages``


async def _view(state: ProxyState, counter: TokenCounter, conversation: Conversation) -> _View:
    chain = conversation.chain
    unchanged = _View(conversation.messages, None, conversation.counts, conversation.problems)
    used = find_checkpoint(chain, await state.store.lookup(chain)) if chain else None
    if used is None:
        return unchanged
    applied = apply_checkpoint(conversation.messages, conversation.head, used, conversation.groups)
    if applied is None:
        logger.warning("replay error: checkpoint %s would split a message group", used.id)
        return unchanged
    head, cut = conversation.head, conversation.head + used.covered
    counts = [
        *conversation.counts[:head],
        *counter.count_messages(used.replacement),
        *conversation.counts[cut:],
    ]
    problems = group_and_validate(applied.messages).problems
    return _View(applied.messages, used, counts, problems)


def _within_trigger(job: _Job, view: _View, profile: Profile) -> Prepared | None:
    """The answer for a request that needs no compaction, without running the pipeline.

    The hot path: most requests are under the trigger and well formed, and
    their token counts come from the cache. ``None`` when the pipeline must
    run (over the trigger, a manual or overflow compaction, broken pairing).
    """
    if job.reason != "threshold":
        return None
    overhead = job.counter.request_overhead(job.body)
    tokens = sum(view.counts) + overhead
    budget = compute_budget(profile, requested_output_tokens(job.body))
    if tokens > budget.trigger or view.problems:
        return None
    tokens_before = tokens
    if view.used is not None:
        tokens_before = sum(job.conversation.counts) + overhead
    result = CompactionResult(
        messages=view.messages,
        stage="none",
        reason=job.reason,
        tokens_before=tokens_before,
        tokens_after=tokens,
        input_limit=budget.input_limit,
        trigger=budget.trigger,
        messages_before=len(job.conversation.messages),
    )
    return Prepared(
        messages=view.messages,
        untouched=view.used is None,
        result=result,
        tokens_before=tokens_before,
        checkpoint=view.used,
    )


def _guarded(
    state: ProxyState, profile: Profile, view: _View, conversation: Conversation
) -> Profile:
    """The progress guard: after a compaction that barely shrank the request,
    summarize again only once enough new material arrived to make progress.

    Right after that compaction the messages after its span were the verbatim
    tail; summarizing again is worth a call only when they have outgrown the
    tail by ``progress_min_ratio`` of the input limit. Until then pruning and
    truncation keep the request within the limit at no cost.
    """
    used = view.used
    if used is None or used.progress_ok or profile.summarizer == "off":
        return profile
    budget = compute_budget(profile)
    newer = conversation.counts[conversation.head + used.covered :]
    needed = budget.tail_budget + state.settings.store.progress_min_ratio * budget.input_limit
    if sum(newer) > needed:
        return profile
    return dataclasses.replace(profile, summarizer="off")


async def prepare(
    state: ProxyState,
    body: Mapping[str, Any],
    messages: list[Message],
    config: ModelConfig,
    summarizer: Summarizer | None,
    *,
    reason: Reason = "threshold",
    instructions: str | None = None,
    profile: Profile | None = None,
    store: bool = True,
    identified: Conversation | None = None,
) -> Prepared:
    """Apply the stored checkpoint, compact if needed, remember the result.

    ``messages`` is the client's conversation (``/compact`` exchanges already
    removed); ``body`` supplies every other field for counting;
    ``identified`` is :func:`identify` of ``messages`` if the caller has it.
    ``store=False`` (the preview) changes nothing: no lock, no events, no
    checkpoint. Raises what :func:`compaction.compact` raises.
    """
    profile = profile or config.profile
    counter = state.counter(config)
    conversation = identified
    if (
        conversation is None
        or conversation.messages is not messages
        or conversation.head_count != profile.head_count
        or conversation.counter is not counter
    ):
        keys = message_keys(messages)
        counts = await count_messages_off_loop(counter, messages, keys)  # much new text: a thread
        conversation = _identify(counter, messages, profile.head_count, keys, counts)
    job = _Job(
        state=state,
        body=body,
        conversation=conversation,
        config=config,
        summarizer=summarizer,
        reason=reason,
        instructions=instructions,
    )
    view = await _view(state, counter, conversation)
    if not store:  # the preview: run everything, remember nothing
        return await _run(job, view, profile, store=False)
    quick = _within_trigger(job, view, profile)
    if quick is not None:
        return quick
    key = f"compact:{conversation.chain[-1] if conversation.chain else conversation.session}"
    async with state.store.lock(key, state.settings.store.lock_ttl_seconds):
        view = await _view(state, counter, conversation)  # another request may have just compacted
        quick = _within_trigger(job, view, profile)
        if quick is not None:
            return quick
        guarded = _guarded(state, profile, view, conversation)
        return await _run(job, view, guarded, store=True)


@dataclass(frozen=True)
class _Job:
    """What stays the same for one request while it is being prepared."""

    state: ProxyState
    body: Mapping[str, Any]
    conversation: Conversation
    config: ModelConfig
    summarizer: Summarizer | None
    reason: Reason
    instructions: str | None

    @property
    def counter(self) -> TokenCounter:
        """The counter the conversation was counted with (one cache per encoding)."""
        return self.conversation.counter


async def _run(job: _Job, view: _View, profile: Profile, *, store: bool) -> Prepared:
    """Compact ``view``; with ``store``, record the events and the checkpoint."""
    state, body, conversation, config = job.state, job.body, job.conversation, job.config
    counter = job.counter
    emit = _Emitter(state, conversation.session, config.model, job.reason) if store else None
    if emit:
        await emit("compaction.queued")
        await emit("compaction.started")
    try:
        result = await _compact(job, view, profile)
    except Exception as exc:
        if emit:
            await emit("compaction.failed", error=f"{type(exc).__name__}: {exc}"[:1000])
        raise
    tokens_before = result.tokens_before
    if view.used is not None:
        tokens_before = sum(conversation.counts) + counter.request_overhead(body)
        result = dataclasses.replace(result, tokens_before=tokens_before)

    made = None
    if store and result.changed and result.stage != "none":
        made = _checkpoint(state, conversation, result, job.reason, tokens_before, config.model)
        if made is not None:
            replaced = conversation.messages[conversation.head : conversation.head + made.covered]
            await state.store.put(made, replaced)
    if emit:
        await emit(
            "context.compacted",
            stage=result.stage,
            tokens_before=tokens_before,
            tokens_after=result.tokens_after,
            replaced_hashes=tuple(conversation.chain[: made.covered]) if made else (),
            checkpoint_id=made.id if made else None,
        )
    return Prepared(
        messages=result.messages,
        untouched=result.messages is conversation.messages and view.used is None,
        result=result,
        tokens_before=tokens_before,
        checkpoint=made or view.used,
    )


#: A conversation with more text than this (about 40k tokens) is compacted in
#: a worker thread: pruning and condensing a few hundred thousand tokens is
#: hundreds of milliseconds of CPU, during which the event loop would serve
#: no one — with the thread, the GIL hands it back every few milliseconds.
COMPACT_OFF_LOOP_CHARS = 160_000


async def _compact(job: _Job, view: _View, profile: Profile) -> CompactionResult:
    request = {**job.body, "messages": view.messages}
    summarizer = job.summarizer
    off_loop = text_size(view.messages) > COMPACT_OFF_LOOP_CHARS
    if off_loop and summarizer is not None:
        # The worker runs its own event loop; the summarizer's HTTP client
        # belongs to this one, so its calls are sent back here to run.
        summarizer = _OnLoop(summarizer, asyncio.get_running_loop())
    conversation = job.conversation
    work = compact(
        request,
        profile,
        summarizer,
        reason=job.reason,
        instructions=job.instructions,
        counter=job.counter,
        # Keyed already, unless a checkpoint rewrote the messages.
        keys=conversation.keys if view.messages is conversation.messages else None,
    )
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


def _checkpoint(
    state: ProxyState,
    conversation: Conversation,
    result: CompactionResult,
    reason: Reason,
    tokens_before: int,
    model: str,
) -> Checkpoint | None:
    shrink = 1 - result.tokens_after / max(tokens_before, 1)
    return make_checkpoint(
        conversation.messages,
        conversation.head,
        result.messages,
        chain=conversation.chain,
        session=conversation.session,
        stage=result.stage,
        reason=reason,
        tokens_before=tokens_before,
        tokens_after=result.tokens_after,
        model=model,
        progress_ok=shrink >= state.settings.store.progress_min_ratio,
    )


class _Emitter:
    """Appends the lifecycle events of one compaction."""

    def __init__(self, state: ProxyState, session: str, model: str, reason: str) -> None:
        self._state = state
        self._base = {
            "compaction_id": uuid.uuid4().hex,
            "session": session,
            "model": model,
            "reason": reason,
            "instance": state.instance,
        }

    async def __call__(self, kind: EventType, **fields: Any) -> None:
        event = Event(type=kind, **self._base, **fields)
        await self._state.store.add_event(event)
