"""What a conversation recalled, put back on its next turns.

When the model recalls removed content, the proxy answers the call itself and
asks again (:mod:`proxy.recall.loop`); the client never sees that exchange, so
its next request does not hold it. Sent without it, the model would not know
it had already read the original — and would ask again — and the request would
no longer extend the bytes the provider cached. So each exchange is kept here
with where it sat: after the first ``at`` items of the conversation list the
recalling request sent, identified by a digest of those items' bytes. A later
request of the same owner whose list starts with the same items gets the
exchange back at the same place.

Kept in this process (a request served by another replica goes without it:
the model may recall once more — nothing is wrong, it costs a round), per
owner, at most :data:`PER_OWNER` exchanges for at most :data:`OWNERS` owners,
the least recently used dropped first.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

#: Exchanges kept per owner (the newest), and owners kept.
PER_OWNER = 32
OWNERS = 1_024


@dataclass(frozen=True)
class Exchange:
    """One recall exchange and the place it goes."""

    at: int  #: items of the conversation list before it
    digest: str  #: of those items' bytes (:func:`prefix_digests`)
    items: tuple[Any, ...]  #: the model's turn and the tool's answers, as sent


@dataclass(frozen=True)
class Restored:
    """A conversation list with its remembered exchanges put back."""

    items: list[Any]
    exchanges: tuple[Exchange, ...]  #: those put back, in order

    @property
    def added(self) -> list[Any]:
        return [item for exchange in self.exchanges for item in exchange.items]


def digest_of(items: Sequence[Any]) -> str:
    """The digest a list of ``items`` is remembered by (the same as a running
    one over them would give: see :meth:`RecallMemory.restore`)."""
    running = hashlib.blake2b(digest_size=16)
    for item in items:
        _extend(running, item)
    return running.hexdigest()


class RecallMemory:
    """Exchanges by owner (see the module doc). Thread-safe; cheap when empty."""

    def __init__(self, owners: int = OWNERS, per_owner: int = PER_OWNER) -> None:
        self._owners = owners
        self._per_owner = per_owner
        self._kept: OrderedDict[str, list[Exchange]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(len(kept) for kept in self._kept.values())

    def remember(self, owner: str, before: Sequence[Any], items: Sequence[Any]) -> None:
        """Keep ``items``, which went after ``before``, the conversation list sent."""
        exchange = Exchange(len(before), digest_of(before), tuple(items))
        with self._lock:
            kept = self._kept.pop(owner, [])
            kept = [e for e in kept if (e.at, e.digest) != (exchange.at, exchange.digest)]
            kept.append(exchange)
            self._kept[owner] = kept[-self._per_owner :]
            while len(self._kept) > self._owners:
                self._kept.popitem(last=False)

    def restore(self, owner: str, items: Sequence[Any]) -> Restored:
        """``items`` with each remembered exchange of ``owner`` whose place they
        still hold put back there; one pass over the items, hashed once."""
        with self._lock:
            kept = self._kept.get(owner)
            if kept:
                self._kept.move_to_end(owner)
                kept = sorted(kept, key=lambda e: e.at)
        if not kept:
            return Restored(list(items), ())
        out: list[Any] = []
        put: list[Exchange] = []
        running = hashlib.blake2b(digest_size=16)
        pending = iter(kept)
        exchange = next(pending, None)
        rest = list(items)
        index = 0
        while index < len(rest):
            while exchange is not None and exchange.at <= len(out):
                # Only in the middle: an exchange whose place is the end would
                # stand for an answer the client has not sent back.
                if exchange.at == len(out) and running.hexdigest() == exchange.digest:
                    for added in exchange.items:
                        out.append(added)
                        _extend(running, added)
                    put.append(exchange)
                    rest[index:] = _without_held(exchange.items, rest[index:])
                exchange = next(pending, None)
            if exchange is None:  # nothing more to place: the rest as it is, unhashed
                out.extend(rest[index:])
                break
            out.append(rest[index])
            _extend(running, rest[index])
            index += 1
        return Restored(out, tuple(put))


def _extend(running: Any, item: Any) -> None:
    running.update(orjson.dumps(_identity(item)))
    running.update(b"\x1e")


#: Keys that say how to cache an item, not what it is: Anthropic clients
#: move their ``cache_control`` breakpoints to the newest blocks every turn.
_NOT_CONTENT = "cache_control"


def _identity(item: Any) -> Any:
    """``item`` as its place is recognised by: without cache breakpoints, in the
    item or in its content blocks."""
    if not isinstance(item, dict):
        return item
    content = item.get("content")
    if _NOT_CONTENT not in item and not (
        isinstance(content, list)
        and any(isinstance(b, dict) and _NOT_CONTENT in b for b in content)
    ):
        return item
    bare = {k: v for k, v in item.items() if k != _NOT_CONTENT}
    if isinstance(content, list):
        bare["content"] = [_identity(block) for block in content]
    return bare


def _without_held(exchange: Sequence[Any], following: list[Any]) -> list[Any]:
    """The client's items after a put-back exchange, without what the exchange
    already holds.

    The model's turn that called the tool was streamed to the client up to the
    call (its reasoning, its first words), and the client keeps that part in
    its next item — as items of their own (Responses: the same ``id``), or as
    the first blocks (Anthropic) or the first text (Chat) of the assistant
    message it stores for the whole answer. With the exchange back in place,
    that part would be sent twice; it is taken from the client's copy, so
    everything the client sent is still sent, once.
    """
    ids = {item.get("id") for item in exchange if isinstance(item, dict) and item.get("id")}
    start = 0
    while (
        start < len(following)
        and isinstance(following[start], dict)
        and following[start].get("id") in ids
    ):
        start += 1
    following = following[start:]
    turn = next((item for item in exchange if _assistant(item)), None)
    if not following or turn is None or not _assistant(following[0]):
        return following
    ours, theirs = turn.get("content"), following[0].get("content")
    if isinstance(ours, str) and isinstance(theirs, str) and ours and theirs.startswith(ours):
        return [{**following[0], "content": theirs[len(ours) :]}, *following[1:]]
    if isinstance(ours, list) and isinstance(theirs, list):
        streamed = [_identity(b) for b in ours if not _calls_a_tool(b)]
        held = 0
        while (
            held < len(streamed)
            and held < len(theirs) - 1  # the client's own answer stays
            and _identity(theirs[held]) == streamed[held]
        ):
            held += 1
        if held:
            return [{**following[0], "content": theirs[held:]}, *following[1:]]
    return following


def _assistant(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") == "assistant"


def _calls_a_tool(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use"


__all__ = ["Exchange", "RecallMemory", "Restored", "digest_of"]
