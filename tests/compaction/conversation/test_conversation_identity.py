"""What identifies a conversation's checkpoints: its caller's scope and its task.

The chain a checkpoint is found by starts after the head; it is seeded with
the scope and with the head's task, so two tasks of one caller that go on
alike never share a hash, while a system prompt rewritten between requests
(a date, the environment) keeps every hash.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction.conversation.checkpoints import chain_hashes
from compaction.conversation.reading import Conversation, read_conversation
from compaction.tokens.counter import TokenCounter
from compaction.types import Message
from tests.conftest import system, user
from tests.synthetic import agent_session, conversations

SCOPE = b"alice\x1fgpt-4o\x1fchat"


def _read(
    messages: list[Message],
    counter: TokenCounter | None = None,
    *,
    previous: Conversation | None = None,
    scope: bytes = SCOPE,
) -> Conversation:
    counter = counter or TokenCounter("gpt-4o")
    return read_conversation(
        {"messages": messages}, messages, counter, 2, scope=scope, previous=previous
    )


def _with_task(messages: list[Message], task: str) -> list[Message]:
    """The same conversation given another task (its first user message)."""
    assert messages[1]["role"] == "user"
    return [messages[0], {**messages[1], "content": task}, *messages[2:]]


def _with_system(messages: list[Message], prompt: str) -> list[Message]:
    assert messages[0]["role"] == "system"
    return [{**messages[0], "content": prompt}, *messages[1:]]


def test_two_tasks_of_one_caller_that_go_on_alike_share_no_hash() -> None:
    fix = agent_session(seed=5, steps=12, task="Fix the failing parser test.")
    docs = _with_task(fix, "Write the README's install section.")
    counter = TokenCounter("gpt-4o")  # one caller's counter: its memo of links too
    a, b = _read(fix, counter), _read(docs, counter)
    assert a.head == b.head == 2 and len(a.chain) == len(fix) - 2
    assert not set(a.chain) & set(b.chain)
    assert _read(fix, counter).chain == a.chain  # and one task's chain stays its own


def test_a_rewritten_system_prompt_keeps_every_hash() -> None:
    monday = agent_session(seed=6, steps=12)
    tuesday = _with_system(monday, "You are a coding agent. Today is Tuesday; git status: clean.")
    counter = TokenCounter("gpt-4o")
    assert _read(monday, counter).chain == _read(tuesday, counter).chain
    assert _read(monday).chain == _read(tuesday).chain  # cold memo, the same hashes


def test_a_developer_message_in_the_head_is_not_the_task() -> None:
    messages = [
        system("instructions of today"),
        {"role": "developer", "content": "sandbox: read-only, date 2026-11-30"},
        user("task"),
        *agent_session(seed=7, steps=4)[2:],
    ]
    later = [messages[0], {**messages[1], "content": "sandbox: write, 2026-12-01"}, *messages[2:]]
    assert _read(messages).head == 2  # the leading instructions alone are the head here
    assert _read(messages).chain == _read(later).chain


def test_whatever_the_head_holds_of_the_task_two_tasks_share_no_hash() -> None:
    messages = agent_session(seed=8, steps=6)
    other = _with_task(messages, "another task")
    for head in range(1, len(messages)):  # the task the first link, or in the seed
        assert not set(chain_hashes(messages, head)) & set(chain_hashes(other, head))


def test_another_scope_with_the_same_task_shares_no_hash() -> None:
    messages = agent_session(seed=9, steps=6)
    alice, bob = _read(messages, scope=b"alice"), _read(messages, scope=b"bob")
    assert not set(alice.chain) & set(bob.chain)


def test_a_conversation_read_on_its_previous_reading_has_the_full_readings_chain() -> None:
    messages = agent_session(seed=10, steps=10)
    counter = TokenCounter("gpt-4o")
    for known in (2, 3, 7, len(messages) - 1):  # the head alone, then more
        previous = _read(messages[:known], counter)
        grown = [*previous.messages, *messages[known:]]
        assert _read(grown, counter, previous=previous).chain == _read(copy.deepcopy(grown)).chain


def test_a_previous_reading_of_another_task_is_not_reused() -> None:
    messages = agent_session(seed=11, steps=6)
    counter = TokenCounter("gpt-4o")
    previous = _read(messages[:4], counter)
    other = _with_task([*previous.messages, *messages[4:]], "another task")
    assert _read(other, counter, previous=previous).chain == _read(other).chain


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(max_items=12), st.text(min_size=1, max_size=40))
def test_any_conversation_given_another_task_shares_no_hash(
    messages: list[Message], suffix: str
) -> None:
    other = _with_task(messages, f"{messages[1]['content']} (and {suffix})")
    a, b = _read(messages), _read(other)
    assert a.head == b.head
    assert not set(a.chain) & set(b.chain)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(max_items=12), st.text(max_size=40), st.integers(0, 40))
def test_any_conversation_keeps_its_hashes_under_another_system_prompt_and_when_read_in_steps(
    messages: list[Message], prompt: str, split: int
) -> None:
    counter = TokenCounter("gpt-4o")
    full = _read(messages, counter)
    assert _read(_with_system(messages, prompt), counter).chain == full.chain
    known = min(max(split, 1), len(messages))
    previous = _read(messages[:known], counter)
    grown = [*previous.messages, *messages[known:]]
    assert _read(grown, counter, previous=previous).chain == full.chain
