"""Read a conversation once: keys, counts, groups, pairing, head and chain.

Every later step — the decision (:mod:`compaction.stages.decide`), the compaction
(:mod:`compaction.stages.execute`), the checkpoint lookup — works from this one
reading, so no message is serialized, hashed, tokenized or grouped twice per
request. Pure: the token counter's cache is the only state touched.

Read against the ``previous`` reading of the same conversation (its messages
the first of these, the same objects: see :mod:`compaction.conversation.incremental`),
only what is new is keyed, counted and chained, and only the groups from the
last one that could still grow are found again; the result is the one a full
reading gives.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from compaction.chat.groups import Group, Grouping, PairingProblem, group_and_validate, group_of
from compaction.chat.typed import EXAMPLE_SCAN, context_end, system_texts
from compaction.conversation.checkpoints import chain_hashes, continue_chain, session_key
from compaction.conversation.regions import head_end
from compaction.tokens.counter import TokenCounter, count_messages_off_loop, message_keys
from compaction.types import Message


@dataclass(frozen=True)
class Conversation:
    """A request's messages and everything worked out about them.

    ``counts`` are the estimate of each message; ``overhead`` is what the rest
    of the request costs (tool schemas, ``response_format``, reply priming),
    so ``tokens`` is the estimate of the whole request.
    """

    messages: list[Message]
    keys: list[bytes]  #: :func:`~compaction.tokens.counter.message_key` of each message
    counts: list[int]
    #: ``sum(counts)``, carried from a previous reading rather than summed again
    #: over every message.
    message_tokens: int
    overhead: int
    groups: tuple[Group, ...]
    problems: tuple[PairingProblem, ...]  #: how tool calls and results fail to pair up
    head: int  #: index one past the head
    head_count: int  #: the profile's ``head_count`` the head was found with
    #: Checkpoint hash chain of the messages after the head, seeded with the
    #: scope and the head's task (:func:`~compaction.conversation.checkpoints.chain_hashes`).
    chain: list[str]
    counter: TokenCounter = field(repr=False, compare=False)
    scope: bytes = b""  #: whose conversation, for which model: what seeded the chain
    #: Whose conversation, as the key of the refs that the briefs and ledger
    #: entries of shortened content carry when ``Profile.recall`` is on
    #: (:mod:`compaction.chat.recall`); empty: no refs.
    recall_salt: str = field(default="", repr=False)
    #: The session the caller names this conversation's events by (its
    #: client's own session id, say); empty: the hash of its first request.
    named: str = ""
    #: Its system texts (:func:`~compaction.chat.typed.system_texts`) and the
    #: index past the client's context at its start
    #: (:func:`~compaction.chat.typed.context_end`): found once for a
    #: conversation, since both read every message, and carried to its next
    #: request's reading.
    echoes: tuple[str, ...] = field(default=(), repr=False, compare=False)
    context: int = 0

    @property
    def tokens(self) -> int:
        return self.message_tokens + self.overhead

    @functools.cached_property
    def session(self) -> str:
        """What groups this conversation's events: :attr:`named`, else the hash
        of its first request."""
        return self.named or session_key(self.messages)


def read_conversation(
    request: Mapping[str, Any],
    messages: list[Message],
    counter: TokenCounter,
    head_count: int,
    *,
    keys: list[bytes] | None = None,
    counts: list[int] | None = None,
    scope: bytes = b"",
    previous: Conversation | None = None,
    recall_salt: str = "",
) -> Conversation:
    """Key, count, group and chain ``messages`` of ``request``.

    ``messages`` may differ from ``request["messages"]`` (the proxy removes
    ``/compact`` exchanges first); every other field of ``request`` is only
    counted. Tokenizes what the counter's cache has not seen: for a large new
    request, run this in a worker thread or use :func:`read_conversation_async`.
    ``scope`` seeds the checkpoint chain (see
    :func:`~compaction.conversation.checkpoints.chain_hashes`): a digest of whose
    conversation this is and for which model; the head's task (its messages
    other than system ones) is chained after it, so another task of the same
    caller starts another chain even where their later messages agree, while a
    system prompt rewritten between requests keeps it. ``previous``, if it
    :func:`continues` into ``messages``, is reused for what it already read —
    its chain too when the head is the same, for the head's messages are then
    the same objects, and so the same seed. ``recall_salt`` is kept as
    :attr:`Conversation.recall_salt`: the key of the refs its compaction
    writes (it changes no reading, so ``previous`` may have another).
    """
    known = continues(previous, messages, counter, head_count, scope)
    return _read(
        request,
        messages,
        counter,
        head_count,
        previous if known else None,
        keys=keys,
        counts=counts,
        scope=scope,
        recall_salt=recall_salt,
    )


def _read(
    request: Mapping[str, Any],
    messages: list[Message],
    counter: TokenCounter,
    head_count: int,
    previous: Conversation | None,
    *,
    keys: list[bytes] | None,
    counts: list[int] | None,
    scope: bytes,
    recall_salt: str,
    new_counts: list[int] | None = None,
) -> Conversation:
    """:func:`read_conversation` once it is known whether ``previous`` continues
    into ``messages`` (``None``: it does not), which asks every message.
    ``new_counts``, with ``previous``: the counts of the messages it had not,
    instead of ``counts``."""
    known = len(previous.messages) if previous is not None else 0
    if previous is not None:
        if keys is None:
            keys = [*previous.keys, *message_keys(messages[known:])]
        if counts is None:
            if new_counts is None:
                new_counts = counter.count_messages(messages[known:], keys[known:])
            counts = [*previous.counts, *new_counts]
            message_tokens = previous.message_tokens + sum(new_counts)
        else:
            message_tokens = sum(counts)
        grouping = _regroup(previous, messages)
        echoes, context = _context_on(previous, messages)
    else:
        keys = message_keys(messages) if keys is None else keys
        counts = counter.count_messages(messages, keys) if counts is None else counts
        message_tokens = sum(counts)
        grouping = group_and_validate(messages)
        echoes = system_texts(messages)
        context = context_end(messages, echoes)
    head = head_end(messages, grouping.groups, head_count, context)
    if previous is not None and head == previous.head:
        chain = _chain_on(previous, messages, keys, counter)
    else:
        chain = chain_hashes(messages, head, memo=counter, keys=keys, seed=scope)
    return Conversation(
        messages=messages,
        keys=keys,
        counts=counts,
        message_tokens=message_tokens,
        overhead=counter.request_overhead(request),
        groups=grouping.groups,
        problems=grouping.problems,
        head=head,
        head_count=head_count,
        chain=chain,
        scope=scope,
        counter=counter,
        recall_salt=recall_salt,
        echoes=echoes,
        context=context,
    )


async def read_conversation_async(
    request: Mapping[str, Any],
    messages: list[Message],
    counter: TokenCounter,
    head_count: int,
    *,
    scope: bytes = b"",
    previous: Conversation | None = None,
    recall_salt: str = "",
) -> Conversation:
    """:func:`read_conversation`, tokenizing much new text in a worker thread."""
    known = continues(previous, messages, counter, head_count, scope)
    if previous is not None and known:
        new = messages[known:]
        new_keys = message_keys(new)
        return _read(
            request,
            messages,
            counter,
            head_count,
            previous,
            keys=[*previous.keys, *new_keys],
            counts=None,
            new_counts=await count_messages_off_loop(counter, new, new_keys),
            scope=scope,
            recall_salt=recall_salt,
        )
    keys = message_keys(messages)
    counts = await count_messages_off_loop(counter, messages, keys)
    return _read(
        request,
        messages,
        counter,
        head_count,
        None,
        keys=keys,
        counts=counts,
        scope=scope,
        recall_salt=recall_salt,
    )


def continues(
    previous: Conversation | None,
    messages: list[Message],
    counter: TokenCounter,
    head_count: int,
    scope: bytes,
) -> int:
    """How many of ``messages`` ``previous`` already read (its messages, the same
    objects, then more or none), read the same way; 0 when it did not."""
    if (
        previous is None
        or previous.counter is not counter
        or previous.head_count != head_count
        or previous.scope != scope
        or not previous.messages
        or len(messages) < len(previous.messages)
    ):
        return 0
    # Not a slice of the new list: it would copy the whole history to compare
    # it (map stops at the shorter, the previous messages).
    if all(map(operator.is_, previous.messages, messages)):
        return len(previous.messages)
    return 0


def _context_on(previous: Conversation, messages: list[Message]) -> tuple[tuple[str, ...], int]:
    """The system texts and the context's end of ``messages``, which continue
    ``previous``'s: its texts and those of the new messages, and its end again
    when no new text came and its end was found with all it looked at inside
    ``previous``'s messages — the context stops at the first message it is
    not, looking at most :data:`~compaction.chat.typed.EXAMPLE_SCAN` further
    for a canned example, so messages after that change nothing."""
    known = len(previous.messages)
    new = system_texts(messages[known:])
    if not new and previous.context + EXAMPLE_SCAN < known:
        return previous.echoes, previous.context
    echoes = previous.echoes + new
    return echoes, context_end(messages, echoes)


def _regroup(previous: Conversation, messages: list[Message]) -> Grouping:
    """The groups of ``messages``, found again only from where ``previous``'s
    could change.

    A group is found by looking forward from its start, and stays as it is
    once every call in it has its result: only the last group (results may
    still follow it) and any group with a call still unanswered (its result
    may come later) are looked at again, from the earliest of them on. The
    scan meets groups in order, and so their problems.
    """
    groups = previous.groups
    if not groups:
        return group_and_validate(messages)
    start = groups[-1].start
    for problem in previous.problems:
        if problem.kind == "missing_result":
            start = min(start, group_of(groups, problem.index).start)
            break
    found = group_and_validate(messages[start:])
    moved = (Group(g.start + start, g.end + start, g.kind) for g in found.groups)
    problems = tuple(p for p in previous.problems if p.index < start) + tuple(
        PairingProblem(p.index + start, p.kind, p.tool_call_id) for p in found.problems
    )
    # One new tuple: a slice of the kept groups and then their concatenation
    # would each take every earlier group of the conversation in hand again.
    kept = itertools.islice(groups, _index_of(groups, start))
    return Grouping(tuple(itertools.chain(kept, moved)), problems)


def _index_of(groups: tuple[Group, ...], start: int) -> int:
    """The index of the group that starts at ``start``, looking from the end (it
    is one of the last)."""
    for index in range(len(groups) - 1, -1, -1):
        if groups[index].start == start:
            return index
    raise ValueError(start)


def _chain_on(
    previous: Conversation, messages: list[Message], keys: list[bytes], counter: TokenCounter
) -> list[str]:
    """``previous``'s chain, continued over the new messages.

    The head is unchanged — the same objects, found with the same scope — so
    the seed it gave ``previous``'s chain is this one's too. With no link yet
    (nothing after the head), the chain is started from the head as usual: its
    links are remembered by the counter, so the head is not hashed again."""
    if not previous.chain:
        return chain_hashes(messages, previous.head, memo=counter, keys=keys, seed=previous.scope)
    start = len(previous.messages)
    return [
        *previous.chain,
        *continue_chain(messages, start, previous.chain[-1], memo=counter, keys=keys),
    ]
