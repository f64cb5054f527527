"""One call for one request: read → decide → execute (docs/compaction.md, "The stages").

:func:`compact` is the library's simplest entry point, for a caller with no
store: it reads the conversation once (:mod:`compaction.conversation.reading`),
decides against the trigger (:mod:`compaction.stages.decide`) and, when needed,
compacts (:mod:`compaction.stages.execute`). The proxy calls the three steps itself,
because it looks up a stored checkpoint and takes a lock between them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compaction.budget.calibrated import calibrated_budget, requested_output_tokens
from compaction.budget.profile import Profile
from compaction.chat.messages import check_messages
from compaction.conversation.reading import read_conversation
from compaction.stages.decide import decide
from compaction.stages.execute import execute
from compaction.stages.results import CompactionResult
from compaction.tokens.counter import TokenCounter, count_messages_off_loop, message_keys
from compaction.types import Reason, Summarizer

__all__ = ["CompactionResult", "compact"]


async def compact(
    request: Mapping[str, Any],
    profile: Profile,
    summarizer: Summarizer | None = None,
    *,
    reason: Reason = "threshold",
    instructions: str | None = None,
    counter: TokenCounter | None = None,
    keys: Sequence[bytes] | None = None,
    ratio: float = 1.0,
    recall_salt: str = "",
) -> CompactionResult:
    """Bring a chat-completions request within its model's input limit.

    ``request`` is the body (``messages`` plus ``model``, ``tools``,
    ``max_tokens``…); only ``messages`` is rewritten, and the caller rebuilds
    the body. ``reason="threshold"`` returns the request unchanged when it is
    within the trigger; ``"overflow"`` and ``"manual"`` always compact.
    ``ratio`` is the upstream's count ÷ our estimate, when known.

    Raises :class:`~compaction.errors.InvalidMessagesError` for input that is
    not a list of messages and :class:`~compaction.errors.CannotFitError`
    when the head alone (or the newest group, even shrunk) exceeds the limit.

    ``keys`` are the :func:`~compaction.tokens.counter.message_key` of each of the
    request's messages, when the caller has computed them already.
    ``recall_salt`` (whose conversation this is) makes the briefs and ledger
    entries of shortened content carry refs, when ``profile.recall`` is on
    (:mod:`compaction.chat.recall`).
    """
    messages = check_messages(request.get("messages"))
    counter = counter or TokenCounter(request.get("model"), image_tokens=profile.image_tokens)
    known = list(keys) if keys is not None else message_keys(messages)
    counts = await count_messages_off_loop(counter, messages, known)
    conversation = read_conversation(
        request,
        messages,
        counter,
        profile.head_count,
        keys=known,
        counts=counts,
        recall_salt=recall_salt,
    )
    budget = calibrated_budget(profile, requested_output_tokens(request), ratio)
    decision = decide(conversation, profile, budget, reason=reason)
    return await execute(conversation, decision, summarizer, instructions=instructions)
