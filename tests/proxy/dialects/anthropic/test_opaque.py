"""Blocks no summary can stand for (a ``tool_reference`` that loads a tool, a
type that does not exist yet) reach the upstream through every stage: pruned
beside the brief, condensed by riding along after the summary."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from compaction import Profile, TokenCounter, compact
from proxy.dialects.anthropic import ANTHROPIC, pairing_problems
from proxy.dialects.anthropic.replies import message_reply
from tests.proxy.dialects.anthropic.sessions import claude_code_request
from tests.proxy.inprocess import RecordingTransport, json_reply, running, settings_for

COUNTER = TokenCounter("gpt-4o")
REFERENCES = [
    {"type": "tool_reference", "tool_name": "WebFetch"},
    {"type": "tool_reference", "tool_name": "NotebookEdit"},
]
ANSWER = message_reply("claude-sonnet-4-6", "ok")


def _tool_search(result: list[dict[str, Any]], turns: int = 30) -> dict[str, Any]:
    """A Claude Code session (its ``advanced-tool-use`` beta) that loaded two tools
    by ``ToolSearch`` right after the task, then went on for ``turns`` tool turns."""
    body = claude_code_request(turns, output_chars=3_000)
    body["max_tokens"] = 4_096
    call = {
        "type": "tool_use",
        "id": "toolu_search",
        "name": "ToolSearch",
        "input": {"query": "select:WebFetch,NotebookEdit"},
    }
    body["messages"][1:1] = [
        {"role": "assistant", "content": [{"type": "text", "text": "Loading tools."}, call]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_search", "content": result}],
        },
    ]
    return body


def _found(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """Every block of type ``kind``, also inside tool results."""
    out = []
    for message in body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else ():
            inner = block.get("content") if block.get("type") == "tool_result" else None
            for each in [block, *(inner if isinstance(inner, list) else ())]:
                if isinstance(each, dict) and each.get("type") == kind:
                    out.append(each)
    return out


def _compacted(body: dict[str, Any], window: int) -> tuple[Any, dict[str, Any]]:
    mapped = ANTHROPIC.to_engine(body)
    profile = Profile(context_window=window, summarizer="extractive")
    result = asyncio.run(compact(mapped.request, profile, counter=COUNTER))
    return result, ANTHROPIC.from_engine(body, mapped, result.messages)


def test_tool_references_ride_along_after_the_summary_of_their_span() -> None:
    body = _tool_search(copy.deepcopy(REFERENCES))
    result, out = _compacted(body, 16_384)
    assert result.stage in ("condensed", "truncated"), result.notes
    assert result.summary is not None
    assert _found(out, "tool_reference") == REFERENCES
    # The call and its result ride whole, after the summary, as the client sent them.
    at = next(i for i, m in enumerate(out["messages"]) if m is body["messages"][1])
    assert out["messages"][at + 1] is body["messages"][2]
    assert pairing_problems(out["messages"]) == []


def test_a_block_of_a_type_that_does_not_exist_yet_rides_along_too() -> None:
    invented = {"type": "hologram_20990101", "payload": {"frames": [1, 2, 3]}}
    body = _tool_search([{"type": "text", "text": "two tools"}, invented])
    result, out = _compacted(body, 16_384)
    assert result.summary is not None, result.notes
    assert _found(out, "hologram_20990101") == [invented]


def test_a_brief_of_a_result_keeps_the_tool_references_beside_it() -> None:
    listing = "\n".join(f"tool {i}: loaded with its schema and examples" for i in range(200))
    body = _tool_search([{"type": "text", "text": listing}, *copy.deepcopy(REFERENCES)])
    result, out = _compacted(body, 20_000)
    assert result.stage in ("pruned", "condensed"), result.notes
    (answer,) = (m for m in out["messages"] if _found({"messages": [m]}, "tool_reference"))
    inner = answer["content"][0]["content"]
    assert inner[0]["type"] == "text" and len(inner[0]["text"]) < len(listing)
    assert inner[1:] == REFERENCES


def test_a_condensed_tool_search_reaches_the_upstream_with_its_references() -> None:
    body = _tool_search(copy.deepcopy(REFERENCES))
    transport = RecordingTransport()
    transport.script(json_reply(ANSWER))
    settings = settings_for(
        compaction={"summarizer": "extractive"},
        models={body["model"]: {"context_window": 16_384, "precompute_share": 0}},
    )
    with running(settings, transport) as proxy:
        reply = proxy.http.post(
            "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}
        )
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-compaction-stage"] in ("condensed", "truncated")
    (sent,) = [a.json() for a in transport.asked("/messages")]
    assert len(sent["messages"]) < len(body["messages"])
    assert _found(sent, "tool_reference") == REFERENCES
    assert pairing_problems(sent["messages"]) == []
