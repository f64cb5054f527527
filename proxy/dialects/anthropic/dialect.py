"""Anthropic Messages (``POST /v1/messages``, Claude Code): :data:`ANTHROPIC`.

The dialect checks a request's shape, routes it, and maps it to the engine's
conversation and back — the mapping is :mod:`.to_engine` (the request's blocks
as engine messages: what the engine may cut, what it must only count, what
rides along with a condensed span) and :mod:`.from_engine` (the engine's
messages as the request's items again, signed blocks and ``cache_control``
breakpoints kept). Summary requests and replies, and the ``/compact`` answer,
are in this API's shape.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from compaction import Message, SummarizationError, message_text
from config import ModelConfig
from proxy.dialects.anthropic import replies
from proxy.dialects.anthropic.from_engine import from_engine
from proxy.dialects.anthropic.pairing import pairing_problems
from proxy.dialects.anthropic.recall import ANTHROPIC_RECALL
from proxy.dialects.anthropic.to_engine import ROLES, UNCUT, to_engine
from proxy.dialects.base import Mapped, Reading, read_mapped
from proxy.edge.errors import BadRequest


class AnthropicDialect:
    name = "anthropic"
    #: Its side of recall (:mod:`proxy.dialects.recall`).
    recall = ANTHROPIC_RECALL
    path = "/messages"
    key_header = "x-api-key"
    cached_usage_apart = True

    def route(self, config: ModelConfig) -> tuple[str, str | None]:
        return config.anthropic_upstream, config.anthropic_api_key_env

    def read(self, raw: bytes) -> Reading:
        return read_mapped(self, raw)

    def check(self, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("messages: expected an array", param="messages")
        for i, message in enumerate(messages):
            role = message.get("role") if isinstance(message, dict) else None
            if not isinstance(role, str) or role not in ROLES:
                raise BadRequest(
                    f"messages[{i}]: expected an object with role user, assistant or system",
                    param=f"messages[{i}]",
                )
            if not isinstance(message.get("content"), (str, list)):
                raise BadRequest(
                    f"messages[{i}].content: expected a string or an array",
                    param=f"messages[{i}].content",
                )
        system = body.get("system")
        if system is not None and not isinstance(system, (str, list)):
            raise BadRequest("system: expected a string or an array", param="system")

    def untouchable(self, body: dict[str, Any]) -> str | None:
        # An API compaction block is handled by compacting after it (to_engine.py).
        return None

    def to_engine(self, body: dict[str, Any]) -> Mapped:
        return to_engine(body)

    def from_engine(
        self, body: dict[str, Any], mapped: Mapped, messages: list[Message]
    ) -> dict[str, Any]:
        return from_engine(body, mapped, messages)

    def summary_request(
        self, model: str, messages: list[Message], max_tokens: int
    ) -> dict[str, Any]:
        system = "\n\n".join(
            message_text(m) for m in messages if m.get("role") in ("system", "developer")
        )
        turns = [
            {
                "role": "assistant" if m.get("role") == "assistant" else "user",
                "content": message_text(m),
            }
            for m in messages
            if m.get("role") not in ("system", "developer") and message_text(m)
        ]
        request: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
        if system:
            request["system"] = system
        request["messages"] = turns
        return request

    def summary_text(self, reply: Any) -> str:
        content = reply.get("content") if isinstance(reply, dict) else None
        if not isinstance(content, list):
            raise SummarizationError("summarizer reply is not an Anthropic message")
        blocks = [b for b in content if isinstance(b, dict)]
        if any(b.get("type") in ("tool_use", "server_tool_use") for b in blocks):
            raise SummarizationError("summarizer replied with tool calls instead of text")
        text = "".join(
            b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)
        )
        if not text.strip():
            raise SummarizationError("summarizer reply is empty")
        return text.strip()

    def summary_retry(
        self, request: dict[str, Any], status: int, reply: bytes
    ) -> dict[str, Any] | None:
        return None

    def summary_cut_off(self, reply: Any) -> bool:
        return isinstance(reply, dict) and reply.get("stop_reason") == "max_tokens"

    def manual_reply(self, model: str, text: str) -> dict[str, Any]:
        return replies.message_reply(model, text)

    def manual_events(
        self, model: str, text: str, request: Mapping[str, Any] | None = None
    ) -> Iterator[bytes]:
        return replies.message_events(model, text)

    def error_event(self, message: str, code: str) -> bytes:
        return replies.error_event(message)  # the API's error event has no code


ANTHROPIC = AnthropicDialect()


__all__ = ["ANTHROPIC", "UNCUT", "AnthropicDialect", "pairing_problems"]
