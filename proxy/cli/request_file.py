"""Reading a request body from a file or stdin, for the CLI: a chat-completions
body, or (for ``inspect``) one of another API, seen as the proxy maps it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from compaction import InvalidMessagesError, check_messages
from proxy.dialects.shapes import dialect_of
from proxy.edge.errors import ProxyError


@dataclass(frozen=True)
class RequestFile:
    """A request body as read: its raw bytes, the body, and whether it was a bare array."""

    source: str
    raw: bytes
    body: dict[str, Any]
    bare_array: bool
    #: The API the file was written for (``chat`` unless read with ``any_api``).
    api: str = "chat"

    @property
    def model(self) -> str | None:
        model = self.body.get("model")
        return model if isinstance(model, str) else None

    def with_messages(self, messages: list[Any]) -> Any:
        """The same shape as the input, every other field untouched."""
        if self.bare_array:
            return messages
        return {**self.body, "messages": messages}


def read_request(path: str, *, any_api: bool = False) -> RequestFile:
    """Read and check a request body; raise ``OSError`` or ``InvalidMessagesError``.

    With ``any_api``, an Anthropic Messages or a Responses body is read too, as
    the proxy maps it to the engine (tool calls and results with their names):
    the body of the file is then that view of it, and ``api`` says which it was.
    """
    source = "stdin" if path == "-" else path
    raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessagesError(source, f"not valid JSON ({exc})") from exc
    api = "chat"
    if any_api and isinstance(data, dict) and ("messages" in data or "input" in data):
        dialect = dialect_of(data)
        try:
            data, api = dialect.to_engine(data).request, dialect.name
        except ProxyError as exc:
            raise InvalidMessagesError(source, exc.message) from exc
    if isinstance(data, list):
        body, bare = {"messages": data}, True
    elif isinstance(data, dict):
        if "messages" not in data:
            raise InvalidMessagesError(source, "the object has no 'messages' field")
        body, bare = data, False
    else:
        raise InvalidMessagesError(source, "expected a request object or an array of messages")
    try:
        check_messages(body["messages"])
    except InvalidMessagesError as exc:
        raise InvalidMessagesError(f"{source}: {exc.where}", exc.problem) from exc
    return RequestFile(source, raw, body, bare, api)
