"""What a conversation recalled, put back on its next turns (proxy.recall.memory)."""

from __future__ import annotations

from typing import Any

from proxy.recall.memory import RecallMemory

QUESTION = {"role": "user", "content": [{"type": "text", "text": "Fix app.py"}]}
CALL = {
    "role": "assistant",
    "content": [
        {"type": "thinking", "thinking": "I need the file.", "signature": "sig1"},
        {"type": "text", "text": "Let me look at the original."},
        {"type": "tool_use", "id": "toolu_1", "name": "compaction_recall", "input": {"ref": "r1"}},
    ],
}
RESULT = {
    "role": "user",
    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "line 207"}],
}


def _remembered(owner: str = "alice") -> RecallMemory:
    memory = RecallMemory()
    memory.remember(owner, [QUESTION], [CALL, RESULT])
    return memory


def test_an_exchange_goes_back_after_the_items_it_followed_and_before_the_answer() -> None:
    answer = {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}
    new = {"role": "user", "content": "Thanks."}
    restored = _remembered().restore("alice", [QUESTION, answer, new])
    assert restored.items == [QUESTION, CALL, RESULT, answer, new]
    assert restored.added == [CALL, RESULT]


def test_another_owner_or_another_conversation_gets_nothing_back() -> None:
    answer = {"role": "assistant", "content": "Done."}
    memory = _remembered()
    assert memory.restore("bob", [QUESTION, answer]).items == [QUESTION, answer]
    other = {"role": "user", "content": "Something else"}
    assert memory.restore("alice", [other, answer]).items == [other, answer]


def test_an_exchange_is_not_put_at_the_end_where_no_answer_follows_it() -> None:
    assert _remembered().restore("alice", [QUESTION]).items == [QUESTION]


def test_moved_cache_breakpoints_do_not_hide_the_place() -> None:
    marked = {
        "role": "user",
        "content": [{"type": "text", "text": "Fix app.py", "cache_control": {"type": "ephemeral"}}],
    }
    answer = {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}
    restored = _remembered().restore("alice", [marked, answer])
    assert restored.items == [marked, CALL, RESULT, answer]


def test_the_part_of_the_calling_turn_the_client_kept_is_sent_once() -> None:
    # The stream showed the client the thinking and the first words before the
    # call; it stored them at the start of its one assistant message.
    merged = {
        "role": "assistant",
        "content": [
            CALL["content"][0],
            {**CALL["content"][1], "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Changed line 207."},
        ],
    }
    restored = _remembered().restore("alice", [QUESTION, merged])
    assert restored.items[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Changed line 207."}],
    }


def test_a_chat_answer_loses_only_the_words_the_exchange_already_holds() -> None:
    memory = RecallMemory()
    question = {"role": "user", "content": "Fix app.py"}
    call = {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "c1"}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "line 207"}
    memory.remember("alice", [question], [call, result])
    answer = {"role": "assistant", "content": "Let me look.Changed it."}
    restored = memory.restore("alice", [question, answer])
    assert restored.items == [
        question,
        call,
        result,
        {"role": "assistant", "content": "Changed it."},
    ]


def test_items_the_client_kept_from_the_calling_turn_are_not_sent_twice() -> None:
    memory = RecallMemory()
    question: dict[str, Any] = {"role": "user", "content": "Fix app.py"}
    reasoning = {"type": "reasoning", "id": "rs_5", "encrypted_content": "x"}
    call = {"type": "function_call", "id": "fc_5", "call_id": "c5", "name": "compaction_recall"}
    output = {"type": "function_call_output", "call_id": "c5", "output": "line 207"}
    memory.remember("alice", [question], [reasoning, call, output])
    # The client re-serialized the reasoning it was streamed; same id.
    kept = {"id": "rs_5", "type": "reasoning", "encrypted_content": "x", "content": None}
    answer = {"type": "message", "id": "msg_6", "role": "assistant", "content": []}
    restored = memory.restore("alice", [question, kept, answer])
    assert restored.items == [question, reasoning, call, output, answer]


def test_memory_keeps_the_newest_exchanges_per_owner_and_the_most_recent_owners() -> None:
    memory = RecallMemory(owners=2, per_owner=2)
    for n in range(3):
        memory.remember("alice", [{"role": "user", "content": f"q{n}"}], [CALL, RESULT])
    assert len(memory) == 2
    memory.remember("bob", [QUESTION], [CALL, RESULT])
    memory.remember("carol", [QUESTION], [CALL, RESULT])
    answer = {"role": "assistant", "content": "Done."}
    assert memory.restore("alice", [{"role": "user", "content": "q2"}, answer]).added == []
    assert memory.restore("carol", [QUESTION, answer]).added == [CALL, RESULT]
