"""One compaction as the proxy runs it: the job, its events, its checkpoint.

Shared by the request path (:mod:`proxy.session.conversation`) and the compactions
prepared ahead of need (:mod:`proxy.session.ahead`):

* :class:`Job` — what stays the same while one conversation is compacted,
  and :meth:`Job.decide`, the library's decision on the store's answer
  (:func:`look_up`, asked once before it);
* :meth:`Job.recheck` — under the conversation's lock, the store asked again:
  the decision stands when its answer is unchanged, and is made anew on the
  new answer (another request compacted meanwhile) otherwise;
* :func:`run_plan` — :func:`compaction.execute`, in a worker thread for a
  large conversation (the summarizer's calls sent back to this loop);
* :func:`checkpoint_of` — the checkpoint to store for a result;
* :class:`Emitter` — the lifecycle events of one compaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compaction import (
    Budget,
    Checkpoint,
    CompactionResult,
    Conversation,
    Decision,
    Message,
    Pace,
    Prices,
    Reason,
    Steering,
    Summarizer,
    decide,
    execute,
    made_progress,
    new_checkpoint,
    text_size,
)
from config import ModelConfig
from proxy.state.stores import CheckpointLookup, Event, EventType

if TYPE_CHECKING:
    from proxy.session.service import Conversations

logger = logging.getLogger("compaction_proxy.checkpoints")


async def look_up(store: CheckpointLookup, conversation: Conversation) -> dict[str, Checkpoint]:
    """The store's answer for ``conversation``: the checkpoints on its chain."""
    chain = conversation.chain
    return await store.lookup(chain) if chain else {}


@dataclass(frozen=True)
class Job:
    """What stays the same for one conversation while it is being compacted:
    the inputs of its decision but the store's answer."""

    conversations: Conversations
    conversation: Conversation
    config: ModelConfig
    budget: Budget
    reason: Reason  #: as asked (a pending "compact now" makes the decision's manual)
    summarizer: Summarizer | None
    steering: Steering
    instructions: str | None  #: the request's own (``/compact``'s)
    owner: str
    #: The upstream's prices, for the compaction plan (the profile's preset if unset).
    prices: Prices | None = None

    @property
    def pace(self) -> Pace:
        """The session's pace as this process saw it: its turn size is read from
        the conversation by the plan, its idle time from the previous request,
        and — for a summarizer that asks the model — how long a summary takes
        there (the 90th percentile of the calls measured)."""
        idle = self.conversations.prompts.idle(self.owner, self.conversation.session)
        if self.config.profile.summarizer != "llm":
            return Pace(0, idle)
        return Pace(0, idle, self.conversations.summary_pace(self.config).duration(0.9))

    def decide(self, stored: Mapping[str, Checkpoint]) -> Decision:
        """The library's decision on ``stored``, the store's answer for the chain."""
        decision = decide(
            self.conversation,
            self.config.profile,
            self.budget,
            reason=self.reason,
            stored=stored,
            progress_min_ratio=self.conversations.settings.store.progress_min_ratio,
            steering=self.steering,
            instructions=self.instructions,
            pace=self.pace,
            prices=self.prices,
        )
        for note in decision.notes:
            logger.warning("%s", note)
        return decision

    async def recheck(self, ruling: Ruling) -> Ruling:
        """``ruling`` if the store still answers as it did, else the decision on
        its new answer: what another request (or replica) stored meanwhile is a
        new input, decided on once more. Called under the lock that makes the
        answer stay put until this job has acted on it."""
        stored = await look_up(self.conversations.store, self.conversation)
        if stored == ruling.stored:
            return ruling
        return Ruling(stored, self.decide(stored))


@dataclass(frozen=True)
class Ruling:
    """The library's decision and the store's answer it was made on: it stands
    while the store answers the same (:meth:`Job.recheck`)."""

    stored: Mapping[str, Checkpoint]
    decision: Decision


def checkpoint_of(
    job: Job,
    decision: Decision,
    result: CompactionResult,
    *,
    precomputed: bool = False,
) -> Checkpoint | None:
    """The checkpoint to store for ``result``, the compaction ``decision`` planned."""
    return new_checkpoint(
        job.conversation,
        result,
        id=uuid.uuid4().hex,
        created_at=time.time(),
        progress_ok=made_progress(
            result.tokens_before, result.tokens_after, decision.progress_min_ratio
        ),
        model=job.config.model,
        window=job.budget.context_window,
        precomputed=precomputed,
        base=decision.checkpoint if precomputed else None,
    )


def event_notes(result: CompactionResult) -> tuple[str, ...]:
    """What a compaction reported on the way, as its event keeps it (bounded)."""
    return tuple(note[:500] for note in result.notes[:20])


#: A conversation with more text than this (about 40k tokens) is compacted in
#: a worker thread: pruning and condensing a few hundred thousand tokens is
#: hundreds of milliseconds of CPU, during which the event loop would serve
#: no one — with the thread, the GIL hands it back every few milliseconds.
COMPACT_OFF_LOOP_CHARS = 160_000


async def run_plan(job: Job, decision: Decision) -> CompactionResult:
    """Carry out ``decision`` for ``job`` (:func:`compaction.execute`)."""
    summarizer = job.summarizer
    off_loop = text_size(decision.messages) > COMPACT_OFF_LOOP_CHARS
    if off_loop and summarizer is not None:
        # The worker runs its own event loop; the summarizer's HTTP client
        # belongs to this one, so its calls are sent back here to run.
        summarizer = _OnLoop(summarizer, asyncio.get_running_loop())
    work = execute(job.conversation, decision, summarizer, instructions=decision.instructions)
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


class Emitter:
    """Appends the lifecycle events of one compaction."""

    def __init__(
        self, conversations: Conversations, session: str, model: str, reason: str, owner: str
    ) -> None:
        self._store = conversations.store
        self._base: dict[str, Any] = {
            "compaction_id": uuid.uuid4().hex,
            "session": session,
            "model": model,
            "reason": reason,
            "instance": conversations.instance,
            "owner": owner,
        }

    async def __call__(self, kind: EventType, **fields: Any) -> None:
        event = Event(type=kind, **self._base, **fields)
        await self._store.add_event(event)
