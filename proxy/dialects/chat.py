"""OpenAI Chat Completions: the engine's own format, so the mapping is the identity.

The chat path keeps its hot-path shortcuts (proxy.flow.handler): its messages go to
the engine as they are, untagged, and come back as the request's
``messages``. This object gives it the same face as the other dialects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from compaction import Message, SummarizationError
from config import ModelConfig
from proxy.dialects.base import Mapped
from proxy.flow import manual


class ChatDialect:
    name = "chat"
    path = "/chat/completions"
    key_header = "authorization"
    cached_usage_apart = False

    def route(self, config: ModelConfig) -> tuple[str, str | None]:
        return config.upstream, config.api_key_env

    def check(self, body: dict[str, Any]) -> None:
        """Checked by :func:`proxy.edge.body.parse_chat_body` already."""

    def untouchable(self, body: dict[str, Any]) -> str | None:
        return None

    def to_engine(self, body: dict[str, Any]) -> Mapped:
        return Mapped(messages=body["messages"], request=body)

    def from_engine(
        self, body: dict[str, Any], mapped: Mapped, messages: list[Message]
    ) -> dict[str, Any]:
        return {**body, "messages": messages}

    def summary_request(
        self, model: str, messages: list[Message], max_tokens: int
    ) -> dict[str, Any]:
        return {
            "model": model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": max_tokens,
            "stream": False,
        }

    def summary_text(self, reply: Any) -> str:
        try:
            message = reply["choices"][0]["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise SummarizationError("summarizer reply is not a chat completion") from exc
        if not isinstance(message, dict):
            raise SummarizationError("summarizer reply has no message")
        if message.get("tool_calls") or message.get("function_call"):
            raise SummarizationError("summarizer replied with tool calls instead of text")
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            raise SummarizationError("summarizer reply is empty")
        return content.strip()

    def manual_reply(self, model: str, text: str) -> dict[str, Any]:
        return manual.completion(model, text)

    def manual_events(self, model: str, text: str) -> Iterator[bytes]:
        return manual.completion_chunks(model, text)


CHAT = ChatDialect()

__all__ = ["CHAT", "ChatDialect"]
