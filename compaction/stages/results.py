"""What a compaction did to one request, and the checkpoint it leaves.

:class:`CompactionResult` is what :func:`compaction.stages.execute.execute` returns
(and :func:`forwarded` for a request forwarded as it is); its :class:`Span`
is the part a later request can reuse, which :func:`new_checkpoint` turns
into a :class:`~compaction.conversation.checkpoints.Checkpoint` in the client's own terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compaction.chat.groups import Group, group_starts
from compaction.chat.own import is_own
from compaction.conversation.checkpoints import Checkpoint, replacement_digest
from compaction.conversation.reading import Conversation
from compaction.stages.decide import Decision
from compaction.types import Message, Reason, Stage


@dataclass(frozen=True)
class Span:
    """What a checkpoint of a result covers, in the compacted messages:
    ``[head, end)`` were replaced by ``replacement``; every message from
    ``end`` on is kept (verbatim, or cut again the same way on every request)."""

    head: int
    end: int
    replacement: tuple[Message, ...]
    #: The message at ``end``: how the span is found in the client's own
    #: messages when a checkpoint or a pairing repair shifted the indices.
    first_kept: Message


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction did to one request."""

    messages: list[Message]
    stage: Stage
    reason: Reason
    tokens_before: int
    tokens_after: int
    input_limit: int
    trigger: int
    messages_before: int
    notes: tuple[str, ...] = ()
    summary: Message | None = None
    summarizer_used: str | None = None
    summarizer_calls: int = 0
    #: False when ``messages`` is exactly the input (the caller may then
    #: forward the original bytes).
    changed: bool = False
    #: What a checkpoint of this result would replace; ``None`` when nothing
    #: reusable was replaced.
    span: Span | None = None
    #: The id of the compaction prepared in the background that this one
    #: applied (:attr:`~compaction.conversation.checkpoints.Checkpoint.precomputed`).
    precomputed: str | None = None

    @property
    def messages_after(self) -> int:
        return len(self.messages)


def forwarded(conversation: Conversation, decision: Decision) -> CompactionResult:
    """The result of a decision to forward: nothing compacted now."""
    return CompactionResult(
        messages=decision.messages,
        stage="reused" if decision.checkpoint is not None else "none",
        reason=decision.reason,
        tokens_before=decision.tokens_before,
        tokens_after=decision.tokens,
        input_limit=decision.budget.input_limit,
        trigger=decision.budget.trigger,
        messages_before=len(conversation.messages),
        notes=decision.notes,
        changed=decision.checkpoint is not None,
    )


def span_of(
    result: list[Message],
    messages: list[Message],
    groups: Sequence[Group],
    head: int,
    aligned: int,
) -> Span | None:
    """The reusable part of a result: what replaced ``[head, end)`` of ``messages``."""
    starts = group_starts(groups)
    kept = min(aligned, len(result) - head, len(messages) - head)
    while kept > 0 and len(messages) - kept not in starts:
        kept -= 1
    end = len(messages) - kept
    if kept == 0 or end <= head:
        return None
    return Span(head, end, tuple(result[head : len(result) - kept]), messages[end])


def new_checkpoint(
    conversation: Conversation,
    result: CompactionResult,
    *,
    id: str,
    created_at: float,
    progress_ok: bool,
    model: str = "",
    window: int = 0,
    precomputed: bool = False,
    base: Checkpoint | None = None,
) -> Checkpoint | None:
    """The checkpoint to store for ``result``, in the client's own terms, or
    ``None`` when the result replaced nothing that a later request can reuse.

    ``result.span`` is counted in the compacted messages, which may start
    with an applied checkpoint's replacement or hold results a repair
    added; it is found in the client's messages by the first message it
    keeps, which must be the client's own (not an earlier replacement's).
    A ``precomputed`` one (prepared ahead) records which version of ``base``,
    the checkpoint in use, it was prepared over.
    """
    span = result.span
    if span is None:
        return None
    client, head = conversation.messages, conversation.head
    end = next((i for i in range(len(client) - 1, head, -1) if client[i] is span.first_kept), None)
    if end is None:
        return None  # the span ends inside an earlier replacement or a repair
    covered = end - head
    return Checkpoint(
        session=conversation.session,
        end_hash=conversation.chain[covered - 1],
        covered=covered,
        replacement=span.replacement,
        stage=result.stage,
        reason=result.reason,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        model=model,
        window=window,
        progress_ok=progress_ok,
        precomputed=precomputed,
        prepared_over=replacement_digest(base) if precomputed else "",
        id=id,
        created_at=created_at,
        own=tuple(i for i, message in enumerate(span.replacement) if is_own(message)),
    )
