"""Anthropic's own compaction is Anthropic's: ``context_management`` edits and
``compaction`` blocks reach the API unchanged, and the proxy compacts only what
follows the latest block (the API drops everything before it)."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.anthropic.replies import message_reply
from tests.proxy.dialects.anthropic.sessions import claude_code_request
from tests.proxy.inprocess import RecordingTransport, json_reply, running, settings_for

EDITS = {
    "edits": [
        {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150_000}},
        {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 3}},
    ]
}
#: The message holding the compaction block.
AT = 11
ANSWER = message_reply("claude-sonnet-4-6", "ok")


def _session(turns: int) -> dict[str, Any]:
    body = claude_code_request(turns, output_chars=6_000)
    body.update(max_tokens=4_096, stream=False, context_management=EDITS)
    # Where the API puts it: first in the assistant message of the turn it compacted.
    assert body["messages"][AT]["role"] == "assistant"
    body["messages"][AT]["content"].insert(
        0, {"type": "compaction", "content": "Summary of the work so far."}
    )
    return body


def _post(window: int, body: dict[str, Any]) -> tuple[Any, dict[str, Any], bytes]:
    raw = orjson.dumps(body)
    transport = RecordingTransport()
    transport.script(json_reply(ANSWER))
    settings = settings_for(
        compaction={"summarizer": "extractive"},
        models={body["model"]: {"context_window": window, "precompute_share": 0}},
    )
    with running(settings, transport) as proxy:
        reply = proxy.http.post(
            "/v1/messages",
            content=raw,
            headers={"anthropic-version": "2023-06-01", "content-type": "application/json"},
        )
    assert reply.status_code == 200, reply.text
    (asked,) = transport.asked("/messages")
    return reply, asked.json(), asked.body


def test_a_request_within_its_window_goes_with_its_compaction_block_byte_for_byte() -> None:
    body = _session(20)
    reply, _, sent = _post(200_000, body)
    assert reply.headers["x-compaction-stage"] == "none"
    assert sent == orjson.dumps(body)


def test_a_compacted_request_keeps_the_edits_and_everything_up_to_the_block() -> None:
    body = _session(30)
    reply, sent, _ = _post(16_384, body)
    assert reply.headers["x-compaction-stage"] != "none"
    assert sent["context_management"] == EDITS
    assert sent["messages"][: AT + 1] == body["messages"][: AT + 1]
    assert len(sent["messages"]) < len(body["messages"])
