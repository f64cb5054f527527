"""What the bench sends: request bodies, synthetic conversations of a given size, the corpus."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from compaction import TokenCounter
from tests.synthetic import agent_session

#: The real conversations beside the checkout (see ../shared/fixtures/README.md).
FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"

#: A small chat request, like a short turn of a chat app.
SMALL_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say hello in one short sentence."},
]


def chat_body(
    messages: list[dict[str, Any]], model: str = "gpt-4o", *, stream: bool = False
) -> bytes:
    body: dict[str, Any] = {"model": model, "messages": messages}
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def small_body(*, stream: bool = False) -> bytes:
    return chat_body(SMALL_MESSAGES, stream=stream)


def distinct_body(index: int) -> bytes:
    """A small request no other request repeats (for the memory run: every one is new)."""
    messages = [
        SMALL_MESSAGES[0],
        {"role": "user", "content": f"Request {index}: summarize the numbers {index * 7919}."},
    ]
    return chat_body(messages)


def conversation(tokens: int, seed: int, counter: TokenCounter) -> list[dict[str, Any]]:
    """A synthetic agent session of about ``tokens`` tokens (within a few percent)."""
    steps = max(tokens // 600, 1)
    for _ in range(3):
        messages = agent_session(seed=seed, steps=steps, output_chars=4_000)
        counted = counter.count_request({"messages": messages})
        if abs(counted - tokens) <= tokens * 0.03:
            break
        steps = max(round(steps * tokens / counted), 1)
    return messages


@dataclass(frozen=True)
class Fixture:
    name: str
    body: dict[str, Any]


def corpus() -> list[Fixture]:
    """Every request body under ../shared/fixtures; empty where the folder is absent."""
    if not FIXTURES.is_dir():
        return []
    bodies = [(path, orjson.loads(path.read_bytes())) for path in sorted(FIXTURES.glob("*/*.json"))]
    # clients/ also holds a bare list of tool schemas: not a request.
    return [
        Fixture(f"{path.parent.name}/{path.stem}", body)
        for path, body in bodies
        if isinstance(body, dict)
    ]
