"""Read a conversation once: keys, counts, groups, pairing, head and chain.

Every later step — the decision (:mod:`compaction.decide`), the compaction
(:mod:`compaction.execute`), the checkpoint lookup — works from this one
reading, so no message is serialized, hashed, tokenized or grouped twice per
request. Pure: the token counter's cache is the only state touched.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from compaction.checkpoints import chain_hashes, session_key
from compaction.messages import Group, PairingProblem, group_and_validate, head_end
from compaction.tokens import TokenCounter, count_messages_off_loop, message_keys
from compaction.types import Message


@dataclass(frozen=True)
class Conversation:
    """A request's messages and everything worked out about them.

    ``counts`` are the estimate of each message; ``overhead`` is what the rest
    of the request costs (tool schemas, ``response_format``, reply priming),
    so ``tokens`` is the estimate of the whole request.
    """

    messages: list[Message]
    keys: list[bytes]  #: :func:`~compaction.tokens.message_key` of each message
    counts: list[int]
    overhead: int
    groups: tuple[Group, ...]
    problems: tuple[PairingProblem, ...]  #: how tool calls and results fail to pair up
    head: int  #: index one past the head
    head_count: int  #: the profile's ``head_count`` the head was found with
    chain: list[str]  #: checkpoint hash chain of the messages after the head
    counter: TokenCounter = field(repr=False, compare=False)
    scope: bytes = b""  #: what seeded the chain

    @property
    def tokens(self) -> int:
        return sum(self.counts) + self.overhead

    @functools.cached_property
    def session(self) -> str:
        """What groups this conversation's events (the hash of its first request)."""
        return session_key(self.messages)


def read_conversation(
    request: Mapping[str, Any],
    messages: list[Message],
    counter: TokenCounter,
    head_count: int,
    *,
    keys: list[bytes] | None = None,
    counts: list[int] | None = None,
    scope: bytes = b"",
) -> Conversation:
    """Key, count, group and chain ``messages`` of ``request``.

    ``messages`` may differ from ``request["messages"]`` (the proxy removes
    ``/compact`` exchanges first); every other field of ``request`` is only
    counted. Tokenizes what the counter's cache has not seen: for a large new
    request, run this in a worker thread or use :func:`read_conversation_async`.
    ``scope`` seeds the checkpoint chain (see
    :func:`~compaction.checkpoints.chain_hashes`): a digest of whose
    conversation this is and for which model.
    """
    keys = message_keys(messages) if keys is None else keys
    counts = counter.count_messages(messages, keys) if counts is None else counts
    grouping = group_and_validate(messages)
    head = head_end(messages, grouping.groups, head_count)
    return Conversation(
        messages=messages,
        keys=keys,
        counts=counts,
        overhead=counter.request_overhead(request),
        groups=grouping.groups,
        problems=grouping.problems,
        head=head,
        head_count=head_count,
        chain=chain_hashes(messages, head, memo=counter, keys=keys, seed=scope),
        scope=scope,
        counter=counter,
    )


async def read_conversation_async(
    request: Mapping[str, Any],
    messages: list[Message],
    counter: TokenCounter,
    head_count: int,
    *,
    scope: bytes = b"",
) -> Conversation:
    """:func:`read_conversation`, tokenizing much new text in a worker thread."""
    keys = message_keys(messages)
    counts = await count_messages_off_loop(counter, messages, keys)
    return read_conversation(
        request, messages, counter, head_count, keys=keys, counts=counts, scope=scope
    )
