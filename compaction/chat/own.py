"""The proxy's own messages: known by what the engine made and the proxy
stored, never by their text.

A client can send anything as a message's text — a line that starts like a
summary, a tool output that ends like a brief with ``[ref: …]`` — so text
proves nothing about who wrote it. The messages the engine writes (summaries,
briefs of tool outputs, placeholders) are made as :func:`own` messages, and a
stored :class:`~compaction.conversation.checkpoints.Checkpoint` records which of its
replacement's messages are the proxy's, to mark them again when it is read
back from JSON. A message that came from the client is a plain ``dict``
whatever it says.

The proxy's summaries are the chief of them: :func:`is_summary` knows one by
its :data:`SUMMARY_MARKER` and by being :func:`own`, and :func:`recorded`
marks one the proxy stored. Their format is :mod:`compaction.summary.format`'s.
"""

from __future__ import annotations

from typing import Any

from compaction.chat.messages import message_text
from compaction.types import Message

#: First line of every summary the condenser writes; how a later compaction
#: recognizes an earlier summary.
SUMMARY_MARKER = "[CONTEXT CONDENSED — REFERENCE ONLY]"


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


def _has_marker(message: Message) -> bool:
    return message.get("role") == "user" and message_text(message).startswith(SUMMARY_MARKER)


def is_summary(message: Message) -> bool:
    """Whether the message is a summary the proxy wrote: made by the condenser
    or stored by the proxy (:func:`recorded`), not merely text that starts
    with the marker."""
    return is_own(message) and _has_marker(message)


def recorded(message: Message) -> Message:
    """``message`` known as the proxy's own summary, when it has a summary's
    form; any other message as it is.

    For what the proxy computed and stored only — a checkpoint's replacement
    (:class:`~compaction.conversation.checkpoints.Checkpoint` calls it) — never for what a
    client sent.
    """
    return own(message) if _has_marker(message) else message
