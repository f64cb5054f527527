"""One request's conversation: checkpoint lookup, compaction, new checkpoint.

The route handlers call :func:`prepare`; it answers what to forward. It is
the only place that ties the pure library (pipeline, checkpoints) to the
store.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
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
from compaction.messages import group_messages, head_end
from compaction.types import Message
from config import ModelConfig
from proxy.state import ProxyState

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
) -> Prepared:
    """Apply the stored checkpoint, run the pipeline, remember a new checkpoint.

    ``messages`` is the client's conversation (``/compact`` exchanges already
    removed); ``body`` supplies every other field for counting. Raises what
    :func:`compaction.compact` raises.
    """
    profile = profile or config.profile
    counter = state.counter(config)
    groups = group_messages(messages)
    head = head_end(messages, groups, profile.head_count)
    chain = chain_hashes(messages, head)
    used = find_checkpoint(chain, await state.store.lookup(chain)) if chain else None
    working = messages
    if used is not None:
        applied = apply_checkpoint(messages, head, used, groups)
        if applied is None:
            logger.warning(
                "replay error: checkpoint %s would split a message group; recomputing", used.id
            )
            used = None
        else:
            working = applied.messages

    request = {**body, "messages": working}
    result = await compact(
        request,
        profile,
        summarizer,
        reason=reason,
        instructions=instructions,
        counter=counter,
    )
    tokens_before = result.tokens_before
    if used is not None:
        tokens_before = counter.count_request({**body, "messages": messages})
        result = dataclasses.replace(result, tokens_before=tokens_before)

    made = None
    if result.changed and result.stage != "none":
        made = make_checkpoint(
            messages,
            head,
            result.messages,
            chain=chain,
            session=session_key(messages),
            stage=result.stage,
            reason=reason,
            tokens_before=tokens_before,
            tokens_after=result.tokens_after,
            model=config.model,
        )
        if made is not None and store:
            await state.store.put(made)
    return Prepared(
        messages=result.messages,
        untouched=result.messages is messages and used is None,
        result=result,
        tokens_before=tokens_before,
        checkpoint=made or used,
    )
