"""The Responses answers the proxy writes itself (``/compact``): a whole Response
object and its typed event stream, with every field the API always sends, so
that the ``openai`` SDK parses them (checked against its models in the tests)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from proxy.dialects import sse


def response_object(model: str, text: str) -> dict[str, Any]:
    """A completed Response carrying ``text``."""
    return _response(model, "completed", [_output_message(text)], _usage(text))


def response_events(model: str, text: str) -> Iterator[bytes]:
    """The same answer as the API's typed event stream, numbered."""
    response = _response(model, "in_progress", [], None)
    message = _output_message(text)
    pending = {**message, "status": "in_progress", "content": []}
    part = message["content"][0]
    empty = {**part, "text": ""}
    where = {"item_id": message["id"], "output_index": 0}
    at = {**where, "content_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {"type": "response.output_item.added", "output_index": 0, "item": pending},
        {"type": "response.content_part.added", **at, "part": empty},
        {"type": "response.output_text.delta", **at, "delta": text, "logprobs": []},
        {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {
            "type": "response.completed",
            "response": {
                **response,
                "status": "completed",
                "output": [message],
                "usage": _usage(text),
            },
        },
    ]
    for number, event in enumerate(events):
        event["sequence_number"] = number
        yield sse.json_frame(event, event["type"])


def error_event(message: str, code: str) -> bytes:
    """How a stream the proxy cannot finish ends: the API's ``error`` event (the
    SDK raises it as an APIError with its code), then ``response.failed``, the
    event that ends a Response that failed — a client that waits for
    ``response.completed`` or ``response.failed`` (Codex) is told the answer
    failed, rather than that the stream closed early (which it retries)."""
    error = {"code": code, "message": message}
    failed = {
        "type": "response.failed",
        "response": {
            "id": "resp_proxy_error",
            "object": "response",
            "created_at": 0,
            "status": "failed",
            "error": error,
            "incomplete_details": None,
            "output": [],
        },
    }
    return sse.json_frame(
        {"type": "error", "code": code, "message": message, "param": None}, "error"
    ) + sse.json_frame(failed, "response.failed")


def _output_message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_compact_{uuid.uuid4().hex[:24]}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _usage(text: str) -> dict[str, Any]:
    output = max(1, len(text) // 4)
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": output,
    }


def _response(
    model: str, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
) -> dict[str, Any]:
    """A Response object with every field the API always sends."""
    return {
        "id": f"resp_compact_{uuid.uuid4().hex[:24]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    }
