"""OpenAI Chat Completions: the engine's own format, so the mapping is the identity.

The chat path keeps its hot-path shortcuts: :meth:`ChatDialect.read` hands the
request's messages to the engine as they are, untagged, with no
:class:`~proxy.dialects.base.Mapped` (the request is its own engine view), and
they come back as the request's ``messages``. The rest gives it the same face
as the other dialects: the summary request (with the second try reasoning
models need), the ``/compact`` answer as a completion or a chunk stream ended
by ``[DONE]``, and the error event in the shape the ``openai`` SDK raises.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from compaction import Message, SummarizationError
from config import ModelConfig
from proxy.dialects import sse
from proxy.dialects.base import Mapped, Reading
from proxy.dialects.chat.recall import CHAT_RECALL
from proxy.edge.body import parse_object


class ChatDialect:
    name = "chat"
    #: Its side of recall (:mod:`proxy.dialects.recall`).
    recall = CHAT_RECALL
    path = "/chat/completions"
    key_header = "authorization"
    cached_usage_apart = False

    def route(self, config: ModelConfig) -> tuple[str, str | None]:
        return config.upstream, config.api_key_env

    def read(self, raw: bytes) -> Reading:
        body = parse_object(raw, chat=True)
        return Reading(body=body, messages=body["messages"])

    def check(self, body: dict[str, Any]) -> None:
        """Checked by :func:`proxy.edge.body.parse_object` already."""

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

    def summary_retry(
        self, request: dict[str, Any], status: int, reply: bytes
    ) -> dict[str, Any] | None:
        # Reasoning models (o-series, gpt-5) refuse max_tokens and a
        # temperature other than the default; they are asked once more their way.
        if status != 400 or "max_tokens" not in request or not _rejects_classic(reply):
            return None
        retry = {k: v for k, v in request.items() if k not in ("temperature", "max_tokens")}
        retry["max_completion_tokens"] = request["max_tokens"]
        return retry

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

    def summary_cut_off(self, reply: Any) -> bool:
        try:
            return bool(reply["choices"][0]["finish_reason"] == "length")
        except (KeyError, IndexError, TypeError):
            return False

    def manual_reply(self, model: str, text: str) -> dict[str, Any]:
        return {
            "id": _completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    def manual_events(
        self, model: str, text: str, request: Mapping[str, Any] | None = None
    ) -> Iterator[bytes]:
        """The completion as chunks; with ``stream_options.include_usage``, every
        chunk carries ``usage: null`` and a last one, with no choices, the usage."""
        options = (request or {}).get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        ident = _completion_id()
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
            body = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                body["usage"] = None
            return sse.json_frame(body)

        yield chunk({"role": "assistant", "content": ""}, None)
        yield chunk({"content": text}, None)
        yield chunk({}, "stop")
        if include_usage:
            usage = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
            yield sse.json_frame(usage)
        yield sse.DONE

    def error_event(self, message: str, code: str) -> bytes:
        # An unnamed event whose data has ``error``: what the openai SDK raises as an APIError.
        return sse.json_frame(
            {"error": {"message": message, "type": "upstream_error", "code": code}}
        )


def _completion_id() -> str:
    return f"chatcmpl-compact-{uuid.uuid4().hex[:24]}"


def _rejects_classic(reply: bytes) -> bool:
    """Whether an error answer says the model wants ``max_completion_tokens`` or
    refuses a temperature."""
    text = reply.decode("utf-8", "replace")
    return "max_completion_tokens" in text or (
        "temperature" in text and "unsupported" in text.lower()
    )


CHAT = ChatDialect()

__all__ = ["CHAT", "ChatDialect"]
