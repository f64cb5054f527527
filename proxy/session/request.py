"""A request, as the session layer sees it: its conversation, model and
caller (:class:`ConversationRequest`), and what the session answers
(:class:`Resolved`): the full way
(:func:`proxy.session.conversation.compact_if_needed`) and the short one
(:func:`proxy.session.untouched.as_sent`) alike, and what both work out the
same way — the request's budget, and the reading of a large body made ahead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from compaction import (
    Budget,
    Checkpoint,
    CompactionResult,
    Conversation,
    Message,
    calibrated_budget,
    requested_output_tokens,
)
from config import ModelConfig
from proxy.session.service import Conversations


@dataclass(frozen=True)
class Resolved:
    """What to forward for one request, and what happened on the way."""

    #: True when :attr:`messages` is exactly what the client sent.
    untouched: bool
    result: CompactionResult
    checkpoint: Checkpoint | None  #: made or used
    session: str  #: which conversation (:attr:`compaction.Conversation.session`)
    #: The checkpoint this request's compaction made (``None`` when it made none).
    made: Checkpoint | None = None
    #: The stored checkpoint the compaction started from (its summary folded in).
    base: Checkpoint | None = None

    @property
    def messages(self) -> list[Message]:
        """What to forward: the result's, not a field of its own (one copy of
        the request's data fewer on its way upstream)."""
        return self.result.messages

    @property
    def stage(self) -> str:
        return self.result.stage

    @property
    def tokens_before(self) -> int:
        return self.result.tokens_before

    @property
    def reason(self) -> str:
        """Why it was compacted: ``none`` for a request merely forwarded. A
        manual compaction says so even when it found nothing to do."""
        result = self.result
        if result.stage not in ("none", "reused") or result.reason == "manual":
            return result.reason
        return "none"

    def headers(self) -> dict[str, str]:
        result = self.result
        headers = {
            "x-compaction-stage": result.stage,
            "x-compaction-reason": self.reason,
            "x-compaction-tokens-before": str(result.tokens_before),
            "x-compaction-tokens-after": str(result.tokens_after),
        }
        if self.checkpoint is not None:
            headers["x-compaction-id"] = self.checkpoint.id
        if result.precomputed is not None:
            headers["x-compaction-precomputed"] = result.precomputed
        return headers


class ConversationRequest(Protocol):
    """A request, as far as the session layer reads it: its conversation, its
    model's configuration and whose it is (the handler's
    :class:`proxy.flow.read.Call` is one; :class:`BareRequest` another)."""

    @property
    def body(self) -> Mapping[str, Any]: ...  # every field but the messages, for counting
    @property
    def messages(self) -> list[Message]: ...  # the client's (``/compact`` exchanges removed)
    @property
    def config(self) -> ModelConfig: ...
    @property
    def scope(self) -> bytes: ...  # :func:`~proxy.session.conversation.scope_of` the request
    @property
    def owner(self) -> str: ...  # whose events and checkpoint (proxy.edge.access.owner_of)
    @property
    def identified(
        self,
    ) -> Conversation | None: ...  # :func:`~proxy.session.conversation.identify` of the messages
    @property
    def client_session(self) -> str | None: ...  # proxy.session.naming.client_session


@dataclass(frozen=True)
class BareRequest:
    """A :class:`ConversationRequest` made of its parts alone, for callers with
    no HTTP request behind it (the tests, a conversation compacted by hand)."""

    body: Mapping[str, Any]
    messages: list[Message]
    config: ModelConfig
    scope: bytes = b""
    owner: str = ""
    identified: Conversation | None = None
    client_session: str | None = None


def request_budget(
    conversations: Conversations, request: ConversationRequest, held_back: int = 0
) -> Budget:
    """The request's budget: calibrated to its upstream's ratio for its owner,
    ``held_back`` tokens kept for what joins it once compacted."""
    config = request.config
    return calibrated_budget(
        config.profile,
        requested_output_tokens(request.body),
        conversations.models.ratio(config, request.owner),
        held_back=held_back,
    )


def usable_reading(
    conversations: Conversations, request: ConversationRequest
) -> Conversation | None:
    """``request.identified`` when it was read from these messages for this model
    and scope (a large body, read ahead or against its previous request)."""
    conversation = request.identified
    if (
        conversation is None
        or conversation.messages is not request.messages
        or conversation.head_count != request.config.profile.head_count
        or conversation.counter is not conversations.counter(request.config)
        or conversation.scope != request.scope
    ):
        return None
    return conversation
