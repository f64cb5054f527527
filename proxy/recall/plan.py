"""Whether a request goes upstream with the recall tool, and with what room.

A request that declares tools and sends something compaction shortened with
a ``[ref: …]`` gets ``compaction_recall`` at the end of its ``tools``; the
exchanges the conversation recalled before are put back where they sat
(:mod:`proxy.recall.memory`). The room the rounds may add is
``recall_max_tokens``, and never more than is left under the input limit.
Deciding only: the rounds are answered in :mod:`proxy.recall.rounds`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import orjson

from compaction import Message, Profile, TokenCounter, message_text
from proxy.dialects.recall import RecallSurface
from proxy.recall.memory import RecallMemory

#: The marker every ref is written with (:data:`compaction.recall.REF_PATTERN`).
_REF_MARK = "[ref: "


@dataclasses.dataclass(frozen=True)
class Plan:
    """A request that goes upstream with the recall tool."""

    surface: RecallSurface
    body: dict[str, Any]  #: the first round's request
    messages: list[Message]  #: the client's conversation as the engine read it
    salt: str
    owner: str
    #: Tokens the tool and the exchanges put back add to the compaction's count.
    extra_tokens: int
    #: Tokens the rounds may add to this request, all together (the model's
    #: turns and the tool's answers): ``recall_max_tokens``, within the room
    #: left under the input limit.
    room: int
    rounds: int  #: recall rounds the model may have
    slice_chars: int
    restored: int  #: remembered exchanges put back


def plan(
    body: dict[str, Any],
    surface: RecallSurface,
    *,
    profile: Profile,
    originals: list[Message],
    sent: Sequence[Message],
    left: int,
    salt: str,
    owner: str,
    memory: RecallMemory,
    counter: TokenCounter,
) -> Plan | None:
    """The request to send with the recall tool, or ``None`` to send ``body`` as
    it is: nothing in ``sent`` (the conversation as it goes upstream) was
    shortened with a ref, no tools declared, the last turn not the user's, or
    no room left for the tool itself under the input limit (``left``: the
    tokens left under it once compacted). ``originals`` is the client's
    conversation as the engine read it, where a ref's original is found."""
    tooled = surface.with_tool(body)
    if tooled is None or not _has_refs(sent):
        return None
    items = tooled.get(surface.items_key)
    if not isinstance(items, list) or not items or _assistant_last(items):
        return None
    restored = memory.restore(owner, items)
    # The tool's tokens were held back from the budget (tool_tokens): the
    # room under the limit is theirs, so the tool always fits.
    extra = counted_tool(counter, orjson.dumps(tooled["tools"][-1]))
    left += extra
    put_back = sum(counter.count_text(orjson.dumps(item).decode()) for item in restored.added)
    if put_back > left - extra:
        # The exchanges put back do not fit: sent without them (the model may
        # recall again), which is what the compaction counted.
        restored = dataclasses.replace(restored, items=items, exchanges=())
        put_back = 0
    extra += put_back
    room = left - extra
    if room < 0:
        return None
    if restored.exchanges:
        tooled = {**tooled, surface.items_key: restored.items}
    return Plan(
        surface=surface,
        body=tooled,
        messages=originals,
        salt=salt,
        owner=owner,
        extra_tokens=extra,
        room=min(room, profile.recall_max_tokens),
        rounds=profile.recall_rounds,
        slice_chars=profile.recall_slice_chars,
        restored=len(restored.exchanges),
    )


@functools.lru_cache(maxsize=16)
def counted_tool(counter: TokenCounter, tool: bytes) -> int:
    """A recall tool's tokens: the same few bytes per API and counter, counted once."""
    return counter.count_text(tool.decode())


def _has_refs(messages: Sequence[Message]) -> bool:
    """Whether any message the request sends carries a ref (a brief, a ledger)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            if _REF_MARK in content:
                return True
        elif _REF_MARK in message_text(message):
            return True
    return False


def _assistant_last(items: list[Any]) -> bool:
    """Whether the conversation ends on the model's turn (a prefill): a recall
    exchange appended after it would put two model turns in a row."""
    last = items[-1]
    return isinstance(last, dict) and last.get("role") == "assistant"


__all__ = ["Plan", "counted_tool", "plan"]
