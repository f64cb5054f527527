"""Between two compactions the tools block never changes: the recall tool's
room is held back from the budget, so it is never left out near the trigger
and added back at the next compaction (each change rewrites the provider's
whole prompt cache)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from compaction.chat.recall import RECALL_TOOL_NAME
from tests.proxy.inprocess import RecordingTransport, json_reply, running, settings_for

MODEL = "scripted-model"
READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": READ_SCHEMA}}]
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
}


def _turn(i: int) -> list[dict[str, Any]]:
    """One small step of an agent: a read and its ~70-token output."""
    output = "\n".join(f"src/module_{i}.py:{n}: value_{i}_{n} = {n * i}" for n in range(6))
    call = {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "read_file", "arguments": orjson.dumps({"path": f"m{i}.py"}).decode()},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": output},
    ]


def test_the_tools_block_stays_the_same_between_two_compactions() -> None:
    transport = RecordingTransport()
    settings = settings_for(
        compaction={"context_window": 4096, "summarizer": "extractive", "tool_result_chars": 200}
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read every module and report the values."},
    ]
    seen: list[tuple[str | None, dict[str, Any]]] = []
    with running(settings, transport) as proxy:
        for i in range(90):
            messages = [*messages, *_turn(i)]
            transport.script(json_reply(ANSWER))
            reply = proxy.http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": messages, "tools": TOOLS},
                headers={"authorization": "Bearer sk-client"},
            )
            assert reply.status_code == 200, reply.text
            sent = orjson.loads(transport.requests[-1].body)
            seen.append((reply.headers.get("x-compaction-id"), sent))

    compacted = [sent for checkpoint, sent in seen if checkpoint is not None]
    assert len({checkpoint for checkpoint, _ in seen if checkpoint}) >= 2, "needs compactions"
    # Every request sent over a compaction carries the recall tool ...
    assert all(sent["tools"][-1]["function"]["name"] == RECALL_TOOL_NAME for sent in compacted)
    # ... and between two compactions each request extends the one before it.
    for (before_id, before), (after_id, after) in itertools.pairwise(seen):
        if before_id is None or before_id != after_id:
            continue
        assert after["tools"] == before["tools"]
        assert after["messages"][: len(before["messages"])] == before["messages"]
