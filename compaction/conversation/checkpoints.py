"""Checkpoints: remembering a compaction so the next request can reuse it.

Pure functions and data; the proxy's store does the I/O (docs/state.md).

A client resends its whole history on every request. A checkpoint records
that the first ``covered`` messages after the head were replaced by
``replacement`` (a summary, pruned briefs, a truncation note…, and the system
messages of the span, which no stage drops: stored with the rest, so that the
next request forwards them in the same place). It is found
again through a **hash chain** over the normalized messages after the head::

    s = H(…H(H(scope ‖ t_1) ‖ t_2)… ‖ t_k)      the head's task
    h_0 = H(s ‖ m_0),  h_i = H(h_{i-1} ‖ m_i)

seeded with the caller's ``scope`` and the head's messages other than system
ones (``t_1 … t_k``: the task, usually the first user message), so that
``h_{covered-1}`` identifies exactly that prefix of this task's conversation,
whatever the system prompt says today (:func:`chain_hashes` says why). The
newest checkpoint whose ``end_hash`` occurs in the request's chain, at a group
boundary, applies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from compaction.chat.groups import group_starts
from compaction.chat.messages import HEAD_ROLES, call_name_and_arguments, message_text, tool_calls
from compaction.chat.own import own, recorded
from compaction.tokens.counter import message_key
from compaction.types import Message


@dataclass(frozen=True)
class Checkpoint:
    """A stored compaction of the span right after the head."""

    session: str
    end_hash: str  #: chain hash of the last covered message
    covered: int  #: how many messages after the head it replaces
    replacement: tuple[Message, ...]
    stage: str
    reason: str
    tokens_before: int
    tokens_after: int
    model: str = ""
    #: The context window it was made for; a request with another window
    #: (a learned one, another model's) does not reuse it. 0: unknown.
    window: int = 0
    #: False when this compaction shrank the request by less than the
    #: progress guard asks: the span is then not summarized again until new
    #: messages give the summarizer something to work on.
    progress_ok: bool = True
    #: True for a compaction prepared ahead of need, in the background
    #: (:func:`compaction.stages.decide.ahead`): it is not applied while the
    #: conversation stays under its trigger — the forwarded bytes do not change
    #: between compactions — and becomes the next compaction when it crosses it.
    precomputed: bool = False
    #: For a precomputed one: :func:`replacement_digest` of the checkpoint it
    #: was prepared over. If that one has changed since (its summary edited),
    #: the preparation is stale and never applied.
    prepared_over: str = ""
    #: Drawn by the caller (the store's owner): the library draws no ids
    #: and reads no clock.
    id: str = field(kw_only=True)
    created_at: float = field(kw_only=True)
    #: Which messages of ``replacement`` the proxy wrote (summaries, briefs,
    #: placeholders), by index: the rest are the client's, kept as they were.
    #: ``None`` for one stored before it was recorded: then its summaries are.
    own: tuple[int, ...] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        # What the proxy wrote is known as its own wherever the checkpoint is
        # applied, also when it was read back from JSON (compaction.chat.own: the
        # text of a message never says who wrote it).
        if self.own is None:
            mine = tuple(recorded(message) for message in self.replacement)
        else:
            written = frozenset(self.own)
            mine = tuple(own(m) if i in written else m for i, m in enumerate(self.replacement))
        object.__setattr__(self, "replacement", mine)


@dataclass(frozen=True)
class AppliedCheckpoint:
    """A request with a checkpoint applied: what to compact or forward next."""

    checkpoint: Checkpoint
    messages: list[Message]


def normalize(message: Message) -> bytes:
    """The parts of a message that identify it: role, text, tool calls, ids, name."""
    calls = [(call.get("id"), *call_name_and_arguments(call)) for call in tool_calls(message)]
    function_call = message.get("function_call")
    if isinstance(function_call, dict):
        calls.append((None, *call_name_and_arguments(function_call)))
    return orjson.dumps(
        [
            message.get("role"),
            message_text(message),
            calls,
            message.get("tool_call_id"),
            message.get("name"),
        ],
        default=repr,
    )


class ChainMemo(Protocol):
    """Remembers chain links by message key
    (:class:`~compaction.tokens.counter.TokenCounter` does)."""

    def follow(self, keys: Sequence[bytes], start: int, previous: bytes) -> list[bytes]:
        """The links remembered for ``keys[start:]`` in turn, the first one after
        ``previous``, up to the first that is not remembered."""
        ...

    def remember_links(self, links: Iterable[tuple[bytes, bytes, bytes]]) -> None:
        """Remember ``(message key, previous hash, link)`` triples."""
        ...


def chain_hashes(
    messages: Sequence[Message],
    start: int,
    *,
    memo: ChainMemo | None = None,
    keys: Sequence[bytes] | None = None,
    seed: bytes = b"",
) -> list[str]:
    """``h_i`` for every message from ``start`` (the head's end) on, as hex strings.

    The chain is seeded with ``seed`` — the caller's scope: whose conversation
    this is, for which model, so that the same messages sent by another caller
    never lead to this caller's checkpoints — followed by the head's messages
    other than system and developer ones (:data:`~compaction.chat.messages.HEAD_ROLES`).
    Those are the task: two conversations of one caller that begin alike (an
    agent's first steps are often the same ``ls`` and README) but were given
    different tasks share no hash, so one task's summary — whose goal is
    quoted from the head, whose session is the other's — never stands in for
    the other's span. The system messages stay out: clients rewrite the system
    prompt (or the Responses API's ``instructions``) between requests of one
    session — a date, the git status, the environment, a memory file — and
    that must not lose the checkpoint. The first user message, by contrast, is
    history the client resends as it was (its ``cache_control`` markers, which
    move, are not part of :func:`normalize`). Editing the task therefore starts
    a new chain, as editing any covered message does.

    With a ``memo``, a link it remembers (the same message after the same
    hash) is looked up by the message's :func:`~compaction.tokens.counter.message_key`
    instead of normalized and hashed again: a client resends its history on
    every request. ``keys`` are those keys, one per message, if already known.
    """
    if memo is not None and keys is None:
        keys = [
            b"" if i < start and m.get("role") in HEAD_ROLES else message_key(m)
            for i, m in enumerate(messages)
        ]
    head = range(min(start, len(messages)))
    task = [i for i in head if messages[i].get("role") not in HEAD_ROLES]
    anchor = seed
    if task:
        task_keys = None if keys is None else [keys[i] for i in task]
        anchor = _links([messages[i] for i in task], 0, anchor, memo, task_keys)[-1]
    return [link.hex() for link in _links(messages, start, anchor, memo, keys)]


def continue_chain(
    messages: Sequence[Message],
    start: int,
    last: str,
    *,
    memo: ChainMemo | None = None,
    keys: Sequence[bytes] | None = None,
) -> list[str]:
    """The links after ``last`` (a chain's last hash, of ``messages[start - 1]``)
    for ``messages[start:]``: a chain read before, extended over new messages."""
    if memo is not None and keys is None:
        keys = [b""] * start + [message_key(m) for m in messages[start:]]
    return [link.hex() for link in _links(messages, start, bytes.fromhex(last), memo, keys)]


def _links(
    messages: Sequence[Message],
    start: int,
    previous: bytes,
    memo: ChainMemo | None,
    keys: Sequence[bytes] | None,
) -> list[bytes]:
    """The chain's links over ``messages[start:]``, the first one after ``previous``."""
    links: list[bytes] = []
    learned: list[tuple[bytes, bytes, bytes]] = []
    i = start
    while i < len(messages):
        if memo is not None and keys is not None:
            found = memo.follow(keys, i, previous)
            if found:
                links.extend(found)
                i += len(found)
                previous = found[-1]
                continue
            learned.append((keys[i], previous, link := _link(previous, messages[i])))
        else:
            link = _link(previous, messages[i])
        links.append(link)
        previous = link
        i += 1
    if memo is not None and learned:
        memo.remember_links(learned)
    return links


def _link(previous: bytes, message: Message) -> bytes:
    return hashlib.blake2b(previous + normalize(message), digest_size=16).digest()


def session_key(messages: Sequence[Message]) -> str:
    """Groups events of one conversation: the hash of its first non-system message."""
    for message in messages:
        if message.get("role") not in HEAD_ROLES:
            return hashlib.blake2b(normalize(message), digest_size=8).hexdigest()
    return "empty"


def replacement_digest(checkpoint: Checkpoint | None) -> str:
    """Identifies what ``checkpoint`` replaces its span with ("" for none)."""
    if checkpoint is None:
        return ""
    raw = orjson.dumps(list(checkpoint.replacement), default=repr)
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def find_checkpoint(
    chain: Sequence[str],
    found: Mapping[str, Checkpoint],
    *,
    precomputed: bool = False,
    beyond: int = 0,
) -> Checkpoint | None:
    """The newest checkpoint on the chain, among ``found`` (the store's answer
    for the chain's hashes, fetched in one round trip): a compaction in use,
    or with ``precomputed`` one prepared ahead of need, covering more than
    ``beyond`` messages.

    One that covers ``covered`` messages is on the chain when its hash is
    ``chain[covered - 1]``; the store's few answers are looked at, not the
    chain's every link (a request with no checkpoint costs nothing here).
    """
    newest: Checkpoint | None = None
    for end_hash, checkpoint in found.items():
        covered = checkpoint.covered
        if (
            checkpoint.precomputed == precomputed
            and beyond < covered <= len(chain)
            and chain[covered - 1] == end_hash
            and (newest is None or covered > newest.covered)
        ):
            newest = checkpoint
    return newest


def apply_checkpoint(
    messages: Sequence[Message], head_end: int, checkpoint: Checkpoint, groups: Sequence[Any]
) -> AppliedCheckpoint | None:
    """Replace the covered span, or ``None`` if that would split a group."""
    cut = head_end + checkpoint.covered
    if cut > len(messages) or cut not in group_starts(groups):
        return None
    applied = [*messages[:head_end], *checkpoint.replacement, *messages[cut:]]
    return AppliedCheckpoint(checkpoint, applied)
