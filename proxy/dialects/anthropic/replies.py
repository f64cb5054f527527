"""The Anthropic Messages answers the proxy writes itself (``/compact``): a whole
message and its named event stream, with the fields the ``anthropic`` SDK
reads (checked against its models and its stream reader in the tests)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from proxy.dialects import sse


def message_reply(model: str, text: str) -> dict[str, Any]:
    """A finished assistant message carrying ``text``."""
    return {
        **_message_head(model),
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
    }


def message_events(model: str, text: str) -> Iterator[bytes]:
    """The same message as the API's stream: start, one text block, stop."""
    start = {**_message_head(model), "content": []}
    yield sse.json_frame({"type": "message_start", "message": start}, "message_start")
    yield sse.json_frame(
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        },
        "content_block_start",
    )
    yield sse.json_frame(
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text},
        },
        "content_block_delta",
    )
    yield sse.json_frame({"type": "content_block_stop", "index": 0}, "content_block_stop")
    yield sse.json_frame(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 0},
        },
        "message_delta",
    )
    yield sse.json_frame({"type": "message_stop"}, "message_stop")


def error_event(message: str) -> bytes:
    """The API's ``error`` event (an ``api_error``): the SDK raises it as an APIError."""
    return sse.json_frame(
        {"type": "error", "error": {"type": "api_error", "message": message}}, "error"
    )


def _message_head(model: str) -> dict[str, Any]:
    """A synthetic message's fields, before its content (``stop_reason`` null: a stream's start)."""
    return {
        "id": f"msg_compact_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
