"""A growing conversation's next request, read as its previous one plus what is new.

Agents resend the whole history every turn; :mod:`compaction.incremental`
recognises a body that continues the same caller's previous request to the
same API byte for byte, and this module fits that into the read step: the
new part is checked by the API's own reader as any body is (its messages,
its fields), the conversation is read against the previous reading, and the
request is remembered for the next one. Anything that does not line up is
read in full, so a client sees the same answers, errors included, either way.

Only a body that is its own engine view (chat) is continued: another API's
request is mapped to the engine as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compaction import Conversation, Message, read_conversation_async
from config import ModelConfig
from proxy.dialects.base import Dialect, Reading
from proxy.edge.body import deep_nesting_refused
from proxy.edge.errors import BadRequest
from proxy.flow import manual
from proxy.session.conversation import recall_salt
from proxy.session.service import Conversations

#: A tail larger than this is parsed no quicker than the whole body is read
#: in a worker thread (proxy.flow.read.OFF_LOOP_BYTES): it is read in full.
MAX_TAIL_BYTES = 1 << 20


@dataclass(frozen=True)
class Continuation:
    """A body read as the continuation of its conversation's previous request."""

    reading: Reading
    previous: Conversation | None  #: the previous request's conversation, read
    #: How many of the first messages are known to hold no ``/compact``
    #: exchange: the previous request's, when it had none to remove.
    settled: int = 0


def without_commands(messages: list[Message], settled: int = 0) -> list[Message]:
    """:func:`proxy.flow.manual.strip_commands` of ``messages`` whose first
    ``settled`` hold no ``/compact`` exchange: an exchange is a pair of
    neighbours judged by those two alone, so only the pairs from the last
    settled message on are looked at."""
    if settled < 2:
        return manual.strip_commands(messages)
    tail = messages[settled - 1 :]
    return messages if manual.strip_commands(tail) is tail else manual.strip_commands(messages)


def _owner_key(dialect: Dialect, owner: str) -> str:
    # The same bytes sent to another API are another API's request.
    return f"{dialect.name}\x1f{owner}"


def continued(
    conversations: Conversations, dialect: Dialect, owner: str, raw: bytes
) -> Continuation | None:
    """``raw`` read as ``owner``'s previous request to this API plus its tail,
    or ``None`` to read it in full."""
    found = conversations.readings.find(_owner_key(dialect, owner), raw, max_tail=MAX_TAIL_BYTES)
    if found is None:
        return None
    field = found.reading.field
    try:
        # The reading's own bytes were checked when they came; the tail is
        # checked the way any body is, so what a full read refuses is refused.
        part = dialect.read(found.tail)
    except BadRequest:
        return None
    if part.original is not None or part.untouchable is not None:
        return None
    if part.messages is not part.body.get(field):
        return None
    body = found.body
    previous = found.reading.conversation
    # The previous request's conversation is its array itself when nothing was removed.
    settled = (
        found.known if previous is not None and previous.messages is found.reading.messages else 0
    )
    return Continuation(Reading(body=body, messages=body[field]), previous, settled)


async def remember_reading(
    conversations: Conversations,
    dialect: Dialect,
    owner: str,
    raw: bytes,
    body: dict[str, Any],
    messages: list[Message],
    *,
    config: ModelConfig,
    scope: bytes,
    identified: Conversation | None,
    previous: Conversation | None,
) -> Conversation | None:
    """The conversation of a body that is its own engine view (``messages``
    of ``body``, ``/compact`` exchanges removed), read against ``previous`` when
    it continues it, and kept for the next request. Only for a body large
    enough to be worth it (:meth:`compaction.ReadingCache.wants`: the caller
    asks)."""
    if identified is None:
        counter = conversations.counter(config)
        with deep_nesting_refused():
            identified = await read_conversation_async(
                body,
                messages,
                counter,
                config.profile.head_count,
                scope=scope,
                previous=previous,
                recall_salt=recall_salt(scope),
            )
    conversation = f"{scope.hex()}\x1f{identified.session}"
    conversations.readings.remember(_owner_key(dialect, owner), conversation, raw, body, identified)
    return identified
