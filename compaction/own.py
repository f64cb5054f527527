"""The proxy's own messages: known by what the engine made and the proxy
stored, never by their text.

A client can send anything as a message's text — a line that starts like a
summary, a tool output that ends like a brief with ``[ref: …]`` — so text
proves nothing about who wrote it. The messages the engine writes (summaries,
briefs of tool outputs, placeholders) are made as :func:`own` messages, and a
stored :class:`~compaction.checkpoints.Checkpoint` records which of its
replacement's messages are the proxy's, to mark them again when it is read
back from JSON. A message that came from the client is a plain ``dict``
whatever it says.
"""

from __future__ import annotations

from typing import Any

from compaction.types import Message


class _Own(dict[str, Any]):
    """A message the proxy wrote: a ``dict`` like any other message (serialized,
    compared and copied as one), whose type JSON from a client never produces."""

    __slots__ = ()


def own(message: Message) -> Message:
    """``message`` as one the proxy wrote. For what the engine made and the
    proxy stored only, never for what a client sent."""
    return message if isinstance(message, _Own) else _Own(message)


def is_own(message: Message) -> bool:
    """Whether the proxy wrote ``message`` (:func:`own`)."""
    return isinstance(message, _Own)
