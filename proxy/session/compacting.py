"""One compaction as the proxy runs it: the job, its events, its checkpoint.

Shared by the request path (:mod:`proxy.session.conversation`) and the compactions
prepared ahead of need (:mod:`proxy.session.ahead`):

* :class:`Job` — what stays the same while one conversation is compacted, and
  :meth:`Job.decide`, the store asked for the chain's checkpoints and the
  library's decision;
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    decide,
    execute,
    new_checkpoint,
    text_size,
)
from config import ModelConfig
from proxy.state.stores import Event, EventType

if TYPE_CHECKING:
    from proxy.state.runtime import ProxyState

logger = logging.getLogger("compaction_proxy.checkpoints")


@dataclass(frozen=True)
class Job:
    """What stays the same for one conversation while it is being compacted."""

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


def checkpoint_of(
    job: Job,
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


class Emitter:
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
