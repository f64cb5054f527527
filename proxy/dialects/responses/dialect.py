"""OpenAI Responses (``POST /v1/responses``, Codex, the Agents SDK): :data:`RESPONSES`.

The dialect checks a request's shape, says which requests the proxy must not
rewrite (the history stored upstream, the client's own compaction), and maps
a request to the engine's conversation and back — :mod:`.to_engine` (the
items as engine messages: a model turn as one assistant message, the
provider's ``compaction`` item, what rides along with a condensed span) and
:mod:`.from_engine` (the engine's messages as items again). Summary requests
and replies, and the ``/compact`` answer, are in this API's shape.

Pure: no I/O; :data:`RESPONSES` is a stateless singleton.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from compaction import Message, SummarizationError, message_text
from config import ModelConfig
from proxy.dialects.base import Mapped, Reading, clean, read_mapped
from proxy.dialects.responses import replies
from proxy.dialects.responses.from_engine import from_engine, message_item
from proxy.dialects.responses.recall import RESPONSES_RECALL
from proxy.dialects.responses.to_engine import SYSTEM_ROLES, to_engine
from proxy.edge.errors import BadRequest

#: First line of Codex's compaction prompt (codex-rs/core/templates/compact/prompt.md):
#: Codex summarizing its own history; forwarded untouched.
CODEX_COMPACTION_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION."


class ResponsesDialect:
    name = "responses"
    #: Its side of recall (:mod:`proxy.dialects.recall`).
    recall = RESPONSES_RECALL
    path = "/responses"
    key_header = "authorization"
    cached_usage_apart = False

    def route(self, config: ModelConfig) -> tuple[str, str | None]:
        return config.upstream, config.api_key_env

    def read(self, raw: bytes) -> Reading:
        return read_mapped(self, raw)

    def check(self, body: dict[str, Any]) -> None:
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise BadRequest("'instructions' must be a string", param="instructions")
        items = body.get("input")
        if items is None or isinstance(items, str):
            return
        if not isinstance(items, list):
            raise BadRequest("'input' must be a string or an array of items", param="input")
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise BadRequest(f"input[{i}] must be an object", param=f"input[{i}]")

    def untouchable(self, body: dict[str, Any]) -> str | None:
        if body.get("previous_response_id") is not None:
            return "previous_response_id: the history is stored upstream"
        if body.get("conversation") is not None:
            return "conversation: the history is stored upstream"
        items = body.get("input")
        last: Any = items
        if isinstance(items, list) and items:
            if any(isinstance(i, dict) and i.get("type") == "compaction_trigger" for i in items):
                return "compaction_trigger: the client's own compaction"
            last = items[-1]
        if isinstance(last, dict) and last.get("role") == "user":
            last = message_text(last)
        if isinstance(last, str) and last.lstrip().startswith(CODEX_COMPACTION_PROMPT):
            return "Codex's compaction prompt: the client's own compaction"
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
        system = [message_text(m) for m in messages if m.get("role") in SYSTEM_ROLES]
        turns = [clean(m) for m in messages if m.get("role") not in SYSTEM_ROLES]
        request: dict[str, Any] = {"model": model}
        if system:
            request["instructions"] = "\n\n".join(system)
        request["input"] = [message_item(m) for m in turns]
        request.update(max_output_tokens=max_tokens, store=False, stream=False)
        return request

    def summary_retry(
        self, request: dict[str, Any], status: int, reply: bytes
    ) -> dict[str, Any] | None:
        return None

    def summary_text(self, reply: Any) -> str:
        if not isinstance(reply, dict) or not isinstance(reply.get("output"), list):
            raise SummarizationError("summarizer reply is not a Response")
        texts: list[str] = []
        for item in reply["output"]:
            if not isinstance(item, dict):
                continue
            if item.get("type") in ("function_call", "custom_tool_call"):
                raise SummarizationError("summarizer replied with a tool call")
            if item.get("type") == "message" and isinstance(item.get("content"), list):
                texts.extend(
                    part["text"]
                    for part in item["content"]
                    if isinstance(part, dict)
                    and part.get("type") == "output_text"
                    and isinstance(part.get("text"), str)
                )
        text = "".join(texts)
        if not text.strip() and isinstance(reply.get("output_text"), str):
            text = reply["output_text"]
        if not text.strip():
            raise SummarizationError("summarizer reply is empty")
        return text.strip()

    def summary_cut_off(self, reply: Any) -> bool:
        # Without details, an incomplete Response is taken as the usual case.
        if not isinstance(reply, dict) or reply.get("status") != "incomplete":
            return False
        details = reply.get("incomplete_details")
        return not isinstance(details, dict) or details.get("reason") == "max_output_tokens"

    def manual_reply(self, model: str, text: str) -> dict[str, Any]:
        return replies.response_object(model, text)

    def manual_events(
        self, model: str, text: str, request: Mapping[str, Any] | None = None
    ) -> Iterator[bytes]:
        return replies.response_events(model, text)

    def error_event(self, message: str, code: str) -> bytes:
        return replies.error_event(message, code)


RESPONSES = ResponsesDialect()


__all__ = ["CODEX_COMPACTION_PROMPT", "RESPONSES", "ResponsesDialect"]
