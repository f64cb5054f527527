"""A system or developer message after the head, in each dialect: an instruction
the proxy forwards verbatim however the conversation around it is compacted."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Any

import orjson

from compaction import SUMMARY_MARKER, Profile, TokenCounter, compact, message_text
from compaction.budget.calibrated import calibrated_budget
from compaction.conversation.reading import read_conversation
from compaction.stages.decide import decide
from compaction.stages.execute import execute
from compaction.stages.results import new_checkpoint
from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.anthropic.pairing import keep_system_placement
from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.dialects.responses import RESPONSES
from tests.proxy.dialects.anthropic.sessions import claude_code_request
from tests.proxy.dialects.responses.shapes import codex_request
from tests.proxy.dialects.responses.upstream import pairing_errors
from tests.synthetic import agent_session

COUNTER = TokenCounter("gpt-4o")
PROFILE = Profile(context_window=16_384, summarizer="extractive")


def _forwarded(dialect: Dialect, body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """``body`` compacted on ``/compact`` (which always condenses) and rebuilt."""
    snapshot = copy.deepcopy(body)
    mapped = dialect.to_engine(body)
    result = asyncio.run(compact(mapped.request, PROFILE, reason="manual", counter=COUNTER))
    assert body == snapshot, "the request was mutated"
    assert result.stage == "condensed", result.notes
    return dialect.from_engine(body, mapped, result.messages), result


def _is_summary_text(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    content = item.get("content")
    if isinstance(content, list):
        return message_text({"content": content}).startswith(SUMMARY_MARKER)
    return isinstance(content, str) and content.startswith(SUMMARY_MARKER)


def test_a_chat_system_message_mid_conversation_follows_the_summary_verbatim() -> None:
    messages = agent_session(steps=30)
    agents = {"role": "system", "content": "Available agent types: general, explore, plan."}
    messages.insert(4, agents)
    out, _ = _forwarded(CHAT, {"model": "gpt-4o", "messages": messages})
    sent = out["messages"]
    at = next(i for i, m in enumerate(sent) if _is_summary_text(m))
    assert sent[at + 1] is agents
    assert sum(m is agents for m in sent) == 1


def test_a_chat_user_message_between_tool_results_loses_no_result() -> None:
    messages = agent_session(steps=30)
    call = messages[-3]
    assert call.get("tool_calls") and messages[-2]["role"] == "tool"
    second = {**call["tool_calls"][0], "id": "call_second"}
    messages[-3] = {**call, "tool_calls": [*call["tool_calls"], second]}
    late = {"role": "tool", "tool_call_id": "call_second", "content": "second result"}
    messages[-1:-1] = [{"role": "user", "content": "see the screenshot"}, late]
    mapped = CHAT.to_engine({"model": "gpt-4o", "messages": messages})
    result = asyncio.run(compact(mapped.request, PROFILE, reason="manual", counter=COUNTER))
    # No repair: the result after the user message answers the call before it.
    assert not any("repaired" in note for note in result.notes)
    assert any(m is late for m in result.messages)


def test_a_responses_developer_item_mid_input_follows_the_summary_as_the_clients_item() -> None:
    body = codex_request(turns=30)
    items = body["input"]
    developer = {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "Collaboration mode: plan."}],
    }
    items.insert(6, developer)
    out, _ = _forwarded(RESPONSES, body)
    sent = out["input"]
    at = next(i for i, item in enumerate(sent) if _is_summary_text(item))
    assert sent[at + 1] is developer
    assert pairing_errors(sent) == []


def test_a_responses_checkpoint_read_back_from_a_store_forwards_the_same_items() -> None:
    """The checkpoint's replacement carries the pinned item: applied to the next
    request (after a round trip through JSON, as a store keeps it) it forwards
    the same bytes as the compaction did, the item still the client's own."""
    body = codex_request(turns=30)
    developer = {"type": "message", "role": "developer", "content": "Use British spelling."}
    body["input"].insert(6, developer)
    mapped = RESPONSES.to_engine(body)
    conversation = read_conversation(mapped.request, mapped.messages, COUNTER, 2)
    budget = calibrated_budget(PROFILE)
    decision = decide(conversation, PROFILE, budget, reason="manual")
    result = asyncio.run(execute(conversation, decision))
    first = RESPONSES.from_engine(body, mapped, result.messages)
    made = new_checkpoint(conversation, result, id="c", created_at=0.0, progress_ok=True)
    assert made is not None
    stored = tuple(orjson.loads(orjson.dumps(list(made.replacement))))
    made = dataclasses.replace(made, replacement=stored)

    new_item = {"type": "message", "role": "user", "content": "and then?"}
    later = {**body, "input": [*body["input"], new_item]}
    mapped = RESPONSES.to_engine(later)
    again = read_conversation(mapped.request, mapped.messages, COUNTER, 2)
    applied = decide(again, PROFILE, budget, stored={made.end_hash: made})
    assert applied.checkpoint is made and applied.action == "forward"
    sent = RESPONSES.from_engine(later, mapped, applied.messages)["input"]
    assert orjson.dumps(sent) == orjson.dumps([*first["input"], new_item])
    assert any(item is developer for item in sent)


def _system_blocks(message: dict[str, Any]) -> list[Any]:
    content = message["content"]
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def test_anthropic_system_messages_mid_conversation_survive_where_the_api_takes_them() -> None:
    # Claude Code sends {"role": "system"} messages right after a user turn; its
    # <system-reminder> text blocks are user content, condensed with the rest.
    body = {**claude_code_request(turns=30), "max_tokens": 4_096}
    pinned = [m for m in body["messages"] if m["role"] == "system"]
    assert len(pinned) >= 2
    out, _ = _forwarded(ANTHROPIC, body)
    sent = out["messages"]
    at = next(i for i, m in enumerate(sent) if _is_summary_text(m))
    kept = [m for m in sent if m["role"] == "system"]
    # Every one's text is forwarded, in order; one that did not move is the client's.
    assert [b for m in kept for b in _system_blocks(m)] == [
        b for m in pinned for b in _system_blocks(m)
    ]
    assert all(any(m is p for p in pinned) for m in kept if len(_system_blocks(m)) == 1)
    # The API's placement rule: after a user message, before an assistant one
    # (or last), never two in a row.
    for i, message in enumerate(sent):
        if message["role"] == "system":
            assert i > at and sent[i - 1]["role"] == "user"
            assert i == len(sent) - 1 or sent[i + 1]["role"] == "assistant"


def test_system_messages_a_client_placed_where_the_api_takes_them_are_not_moved() -> None:
    body = claude_code_request(turns=30)
    assert any(m["role"] == "system" for m in body["messages"])
    assert keep_system_placement(body["messages"]) is body["messages"]


def test_system_messages_meeting_after_a_summary_are_merged_before_the_next_answer() -> None:
    summary = {"role": "user", "content": [{"type": "text", "text": SUMMARY_MARKER}]}
    first = {"role": "system", "content": "Plan mode is on."}
    second = {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    request = {"role": "user", "content": "go on"}
    answer = {"role": "assistant", "content": "ok"}
    placed = keep_system_placement([summary, first, second, request, answer])
    assert placed == [
        summary,
        request,
        {
            "role": "system",
            "content": [{"type": "text", "text": "Plan mode is on."}, second["content"][0]],
        },
        answer,
    ]


def test_system_messages_after_a_summary_that_meet_no_answer_stay_where_they_are() -> None:
    summary = {"role": "user", "content": [{"type": "text", "text": SUMMARY_MARKER}]}
    moved = {"role": "system", "content": "Plan mode is on."}
    request = {"role": "user", "content": "go on"}
    clients = {"role": "system", "content": "The clock says noon."}
    for messages in ([summary, moved, request], [summary, moved, request, clients]):
        assert keep_system_placement(messages) is messages
