"""A tool call whose arguments nest deeper than Python's recursion allows — a
client's history, or a model's turn — is compacted like any other, never a 500."""

from __future__ import annotations

from typing import Any

from tests.proxy.inprocess import RecordingTransport, json_reply, running, settings_for
from tests.synthetic import agent_session

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
}


def test_a_history_with_arguments_nested_past_the_recursion_is_compacted() -> None:
    messages: list[dict[str, Any]] = agent_session(seed=9, steps=40, output_chars=3_000)
    deep = "[" * 5_000 + "]" * 5_000
    call = {"id": "deep", "type": "function", "function": {"name": "bash", "arguments": deep}}
    messages[4:4] = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "deep", "content": "x\n" * 400},
    ]
    transport = RecordingTransport()
    transport.script(json_reply(ANSWER))
    settings = settings_for(compaction={"context_window": 8_192, "summarizer": "extractive"})
    with running(settings, transport) as proxy:
        reply = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-compaction-stage"] in ("pruned", "condensed", "truncated")
