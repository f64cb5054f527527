"""Which API a request body is written for, told by its shape alone: for bodies
read from a file (``compaction-proxy inspect``, ``eval``), which come with no
route to say it."""

from __future__ import annotations

from typing import Any

from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.dialects.responses import RESPONSES


def dialect_of(body: dict[str, Any]) -> Dialect:
    """Responses for an ``input`` without ``messages``; Anthropic's Messages for a
    top-level ``system`` or content blocks of ``tool_use``/``tool_result``;
    Chat Completions otherwise (the engine's own format)."""
    if "input" in body and "messages" not in body:
        return RESPONSES
    messages = body.get("messages")
    if "system" in body or any(
        isinstance(block, dict) and block.get("type") in ("tool_use", "tool_result")
        for message in (messages if isinstance(messages, list) else ())
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for block in message["content"]
    ):
        return ANTHROPIC
    return CHAT


__all__ = ["dialect_of"]
