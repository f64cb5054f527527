"""Reading a folder of request bodies, in any of the proxy's APIs, as engine requests.

Every ``*.json`` under the folder (recursively) holding a JSON object is a
request body; anything else (a bare list of tool schemas) is skipped. The API
is told by the body's shape — ``input`` is OpenAI Responses; ``messages`` with
a top-level ``system`` or ``tool_use`` / ``tool_result`` blocks is Anthropic
Messages; other ``messages`` are Chat Completions — and non-chat bodies are
mapped with their dialect's own ``to_engine``, as the proxy maps them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.dialects.chat import CHAT
from proxy.dialects.shapes import dialect_of


@dataclass(frozen=True)
class Body:
    """One request body of the folder, as the engine sees it."""

    name: str  #: its path under the folder
    api: str  #: "chat", "anthropic" or "responses"
    request: dict[str, Any]  #: model, messages, tools, max_tokens


def read_bodies(folder: Path, names: set[str] | None = None) -> Iterator[Body]:
    """The request bodies under ``folder``, sorted by path; only ``names`` when given."""
    for path in sorted(folder.rglob("*.json")):
        name = path.relative_to(folder).as_posix()
        if names is not None and name not in names:
            continue
        body = orjson.loads(path.read_bytes())
        if not isinstance(body, dict):
            continue
        dialect = dialect_of(body)
        request = body if dialect is CHAT else dialect.to_engine(body).request
        yield Body(name, dialect.name, request)
