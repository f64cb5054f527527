"""Reading a chat request's body: size-limited, parsed once, checked.

A body over the size limit gets 413 before it is parsed; a compressed one
415; one that is not a JSON object with a ``messages`` list of objects, 400
— all in OpenAI's error shape (:mod:`proxy.errors`).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from compaction import InvalidMessagesError, check_messages
from proxy.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 above ``limit`` before it is parsed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body is larger than the limit of {limit:,} bytes.")
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding not in ("identity", ""):
        raise UnsupportedMediaType(
            f"Compressed request bodies ({encoding}) are not supported; send identity."
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"The request body is larger than the limit of {limit:,} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """The body as a dict with a valid ``messages`` list, or a 400."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    # orjson reads 1024 levels of nesting but writes only 254, and counting,
    # hashing and forwarding a rewritten body all write it again. The
    # messages are written anyway when they are keyed (see _too_deep); the
    # other fields are checked here.
    _writable({key: value for key, value in body.items() if key != "messages"})
    if "messages" not in body:
        raise BadRequest("'messages' is a required property.", param="messages")
    try:
        check_messages(body["messages"])
    except InvalidMessagesError as exc:
        raise BadRequest(f"Invalid {exc.where}: {exc.problem}.", param=exc.where) from exc
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string.", param="model")
    return body


def _writable(value: Any) -> None:
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise too_deep(exc) from exc


def too_deep(exc: orjson.JSONEncodeError) -> BadRequest:
    return BadRequest(f"The request body is nested too deeply: {exc}.")
