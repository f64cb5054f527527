"""Read a conversation once: keys, counts, groups, pairing, head and chain.

Every later step — the decision (:mod:`compaction.decide`), the compaction
(:mod:`compaction.execute`), the checkpoint lookup — works from this one
reading, so no message is serialized, hashed, tokenized or grouped twice per
request. Pure: the token counter's cache is the only state touched.

Read against the ``previous`` reading of the same conversation (its messages
the first of these, the same objects: see :mod:`compaction.incremental`),
only what is new is keyed, counted and chained, and only the groups from the
last one that could still grow are found again; the result is the one a full
reading gives.

With ``bound``, what is new is not tokenized yet: each new message gets an
upper bound of its count (a token is at least a byte), and the reading says
how many of its last counts are such bounds (:attr:`Conversation.bounded`).
That is enough to prove the request far under every threshold
(:func:`compaction.decide.steering_can_matter`), and the exact counts
(:attr:`Conversation.exact`) can then wait until the request is on its way.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from compaction.checkpoints import chain_hashes, continue_chain, session_key
from compaction.messages import (
    Group,
    Grouping,
    PairingProblem,
    group_and_validate,
    group_of,
    head_end,
)
from compaction.tokens import TokenCounter, count_messages_off_loop, message_keys
from compaction.types import Message


@dataclass(frozen=True)
class Conversation:
    """A request's messages and everything worked out about them.

    ``counts`` are the estimate of each message; ``overhead`` is what the rest
    of the request costs (tool schemas, ``response_format``, reply priming),
    so ``tokens`` is the estimate of the whole request. When ``bounded`` is
    not 0, the last ``bounded`` counts are only upper bounds of it: nothing but
    the proof that the request is forwarded as it stands may read them, and
    everything else reads :attr:`exact`.
    """

    messages: list[Message]
    keys: list[bytes]  #: :func:`~compaction.tokens.message_key` of each message
    counts: list[int]
    overhead: int
    groups: tuple[Group, ...]
    problems: tuple[PairingProblem, ...]  #: how tool calls and results fail to pair up
    head: int  #: index one past the head
    head_count: int  #: the profile's ``head_count`` the head was found with
    #: Checkpoint hash chain of the messages after the head, seeded with the
    #: scope and the head's task (:func:`~compaction.checkpoints.chain_hashes`).
    chain: list[str]
    counter: TokenCounter = field(repr=False, compare=False)
    scope: bytes = b""  #: whose conversation, for which model: what seeded the chain
    #: Whose conversation, as the key of the refs that the briefs and ledger
    #: entries of shortened content carry when ``Profile.recall`` is on
    #: (:mod:`compaction.recall`); empty: no refs.
    recall_salt: str = field(default="", repr=False)
    #: How many of the last ``counts`` are upper bounds, their text not yet tokenized.
    bounded: int = 0

    @property
    def tokens(self) -> int:
        return sum(self.counts) + self.overhead

    @functools.cached_property
    def exact(self) -> Conversation:
        """This reading with no count a bound: itself when none is, else its
        bounded messages tokenized (once: the answer is kept). :meth:`exactly`
        does it off the event loop when there is much text."""
        if not self.bounded:
            return self
        start = len(self.messages) - self.bounded
        return self._counted(self.counter.count_messages(self.messages[start:], self.keys[start:]))

    async def exactly(self) -> Conversation:
        """:attr:`exact`, tokenizing much new text in a worker thread."""
        if not self.bounded or "exact" in self.__dict__:
            return self.exact
        start = len(self.messages) - self.bounded
        counts = await count_messages_off_loop(
            self.counter, self.messages[start:], self.keys[start:]
        )
        # Whichever finished first is kept; both hold the same counts.
        exact: Conversation = self.__dict__.setdefault("exact", self._counted(counts))
        return exact

    def _counted(self, tail: list[int]) -> Conversation:
        """This reading with its bounded counts replaced by ``tail``, theirs exactly.

        Their messages were chained before they were counted, when the counter
        kept no chain link for them (it keeps links of the messages it holds):
        the links are given to it now, as a reading in full would have left them.
        """
        start = len(self.messages) - self.bounded
        exact = dataclasses.replace(self, counts=[*self.counts[:start], *tail], bounded=0)
        if "session" in self.__dict__:
            exact.__dict__["session"] = self.session
        first = max(start, self.head + 1)  # the head's first message follows the seed
        self.counter.remember_links(
            (self.keys[i], bytes.fromhex(self.chain[i - self.head - 1]), bytes.fromhex(link))
            for i, link in zip(
                range(first, len(self.messages)), self.chain[first - self.head :], strict=True
            )
        )
        return exact

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
    previous: Conversation | None = None,
    recall_salt: str = "",
    bounded: int = 0,
) -> Conversation:
    """Key, count, group and chain ``messages`` of ``request``.

    ``messages`` may differ from ``request["messages"]`` (the proxy removes
    ``/compact`` exchanges first); every other field of ``request`` is only
    counted. Tokenizes what the counter's cache has not seen: for a large new
    request, run this in a worker thread or use :func:`read_conversation_async`.
    ``scope`` seeds the checkpoint chain (see
    :func:`~compaction.checkpoints.chain_hashes`): a digest of whose
    conversation this is and for which model; the head's task (its messages
    other than system ones) is chained after it, so another task of the same
    caller starts another chain even where their later messages agree, while a
    system prompt rewritten between requests keeps it. ``previous``, if it
    :func:`continues` into ``messages``, is reused for what it already read —
    its chain too when the head is the same, for the head's messages are then
    the same objects, and so the same seed. ``recall_salt`` is kept as
    :attr:`Conversation.recall_salt`: the key of the refs its compaction
    writes (it changes no reading, so ``previous`` may have another).
    ``bounded`` goes with ``counts``: how many of its last are upper bounds.
    """
    if counts is None:
        bounded = 0  # counted here: exactly
    if previous is not None and previous.bounded:
        previous = previous.exact
    known = continues(previous, messages, counter, head_count, scope)
    if previous is not None and known:
        if keys is None:
            keys = [*previous.keys, *message_keys(messages[known:])]
        if counts is None:
            counts = [*previous.counts, *counter.count_messages(messages[known:], keys[known:])]
        grouping = _regroup(previous, messages)
    else:
        keys = message_keys(messages) if keys is None else keys
        counts = counter.count_messages(messages, keys) if counts is None else counts
        grouping = group_and_validate(messages)
    head = head_end(messages, grouping.groups, head_count)
    if previous is not None and known and head == previous.head:
        chain = _chain_on(previous, messages, keys, counter)
    else:
        chain = chain_hashes(messages, head, memo=counter, keys=keys, seed=scope)
    return Conversation(
        messages=messages,
        keys=keys,
        counts=counts,
        overhead=counter.request_overhead(request),
        groups=grouping.groups,
        problems=grouping.problems,
        head=head,
        head_count=head_count,
        chain=chain,
        scope=scope,
        counter=counter,
        recall_salt=recall_salt,
        bounded=bounded,
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
    bound: bool = False,
) -> Conversation:
    """:func:`read_conversation`, tokenizing much new text in a worker thread.

    With ``bound``, the messages that continue ``previous`` are not tokenized
    yet: they get upper bounds (:meth:`~compaction.tokens.TokenCounter.bound_messages`),
    and the reading is :attr:`~Conversation.bounded` by them (see the module doc).
    A reading in full is always counted.
    """
    if previous is not None and previous.bounded:
        previous = await previous.exactly()
    known = continues(previous, messages, counter, head_count, scope)
    bounded = 0
    if previous is not None and known:
        new = messages[known:]
        new_keys = message_keys(new)
        keys = [*previous.keys, *new_keys]
        if bound:
            fresh = counter.bound_messages(new, new_keys)
            bounded = len(new)
        else:
            fresh = await count_messages_off_loop(counter, new, new_keys)
        counts = [*previous.counts, *fresh]
    else:
        previous = None
        keys = message_keys(messages)
        counts = await count_messages_off_loop(counter, messages, keys)
    return read_conversation(
        request,
        messages,
        counter,
        head_count,
        keys=keys,
        counts=counts,
        scope=scope,
        previous=previous,
        recall_salt=recall_salt,
        bounded=bounded,
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
    known = len(previous.messages)
    if all(map(operator.is_, previous.messages, messages[:known])):
        return known
    return 0


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
    kept = groups[: _index_of(groups, start)]
    moved = tuple(Group(g.start + start, g.end + start, g.kind) for g in found.groups)
    problems = tuple(p for p in previous.problems if p.index < start) + tuple(
        PairingProblem(p.index + start, p.kind, p.tool_call_id) for p in found.problems
    )
    return Grouping(kept + moved, problems)


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
