"""Reading a growing conversation incrementally gives what a full reading gives."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction import TokenCounter
from compaction.chat.typed import EXAMPLE_CLOSER, EXAMPLE_SCAN
from compaction.conversation.incremental import (
    MIN_READING_BYTES,
    READINGS_PER_OWNER,
    ReadingCache,
    continue_body,
    reading_of,
)
from compaction.conversation.reading import Conversation, continues, read_conversation
from compaction.conversation.reading import read_conversation_async as read_async

COUNTER = TokenCounter("gpt-4o")
IDS = ["a", "b", "c"]


@st.composite
def message(draw: st.DrawFn) -> dict[str, Any]:
    """Any message, pairing fields included, so calls and results pair up, lag
    behind, repeat or go missing across the point where a request ends."""
    kinds = ["user", "assistant", "call", "tool", "system", "legacy", "fn", "context", "ack"]
    kind = draw(st.sampled_from(kinds))
    text = draw(
        st.sampled_from(["ok", "go on", "the test ] failed", "x" * 300, "", EXAMPLE_CLOSER])
    )
    if kind == "context":  # a client's own context, which the head runs through
        return {"role": "user", "content": "<environment_context>cwd</environment_context>"}
    if kind == "ack":
        return {"role": "assistant", "content": "Ok."}
    if kind == "call":
        ids = draw(st.lists(st.sampled_from(IDS), min_size=0, max_size=3))
        function = {"name": "f", "arguments": "{}"}
        calls = [{"id": i, "type": "function", "function": function} for i in ids]
        return {"role": "assistant", "content": None, "tool_calls": calls}
    if kind == "tool":
        return {"role": "tool", "tool_call_id": draw(st.sampled_from(IDS)), "content": text}
    if kind == "legacy":
        return {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "f", "arguments": "{}"},
        }
    if kind == "fn":
        return {"role": "function", "name": "f", "content": text}
    return {"role": kind, "content": text}


messages_ = st.lists(message(), min_size=0, max_size=14)


def _same(incremental: Conversation, full: Conversation) -> None:
    assert incremental.messages == full.messages
    assert incremental.keys == full.keys
    assert incremental.counts == full.counts
    assert incremental.overhead == full.overhead
    assert incremental.groups == full.groups
    assert incremental.problems == full.problems
    assert incremental.head == full.head
    assert incremental.chain == full.chain
    assert incremental.session == full.session
    assert incremental.message_tokens == full.message_tokens == sum(full.counts)
    assert incremental.tokens == full.tokens
    assert incremental.echoes == full.echoes
    assert incremental.context == full.context


def _step(draw: st.DrawFn, messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    action = draw(st.sampled_from(["grow", "grow", "grow", "same", "edit", "rewind"]))
    if action == "grow":
        return action, [*messages, *draw(messages_)]
    if action == "same":
        return action, [*messages]
    if action == "rewind" or not messages:
        return "rewind", messages[: draw(st.integers(0, len(messages)))]
    at = draw(st.integers(0, len(messages) - 1))
    edited = [*messages[:at], draw(message()), *messages[at + 1 :]]
    return action, edited


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), head_count=st.integers(0, 3), scope=st.sampled_from([b"", b"s1"]))
def test_a_conversation_read_against_its_previous_request_equals_one_read_in_full(
    data: st.DataObject, head_count: int, scope: bytes
) -> None:
    request = {"model": "gpt-4o", "tools": [{"type": "function", "function": {"name": "f"}}]}
    messages = data.draw(messages_)
    previous = read_conversation(request, messages, COUNTER, head_count, scope=scope)
    for _ in range(data.draw(st.integers(1, 6))):
        action, messages = _step(data.draw, messages)
        full = read_conversation(request, messages, COUNTER, head_count, scope=scope)
        incremental = read_conversation(
            request, messages, COUNTER, head_count, scope=scope, previous=previous
        )
        awaited = asyncio.run(
            read_async(request, messages, COUNTER, head_count, scope=scope, previous=previous)
        )
        _same(incremental, full)
        _same(awaited, full)
        if action in ("grow", "same") and previous.messages:
            assert continues(previous, messages, COUNTER, head_count, scope) == len(
                previous.messages
            )
        previous = incremental


class _Watched(dict[str, Any]):
    """A message that counts how often it is read."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.reads += 1
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.reads += 1
        return super().__getitem__(key)


def test_a_continued_reading_does_not_read_the_earlier_messages_again() -> None:
    """The client's context and the system texts of a conversation are found
    once: its next request reads its new messages and its last group, not
    every message again (a growing session resends hundreds of them)."""
    system = _Watched(role="system", content="You are an agent. " * 20)
    turns = [
        _Watched(role="user" if i % 2 == 0 else "assistant", content=f"step {i}") for i in range(60)
    ]
    watched = [system, *turns]
    messages: list[dict[str, Any]] = list(watched)
    previous = read_conversation({}, messages, COUNTER, 2)
    for message in watched:
        message.reads = 0
    grown = [*messages, {"role": "user", "content": "and now?"}]
    incremental = read_conversation({}, grown, COUNTER, 2, previous=previous)
    middle = watched[EXAMPLE_SCAN + 4 : -4]
    assert [m.reads for m in middle] == [0] * len(middle)
    _same(incremental, read_conversation({}, grown, COUNTER, 2))


class _Copies(list[dict[str, Any]]):
    """A message list that notes every slice taken of it and every walk over it."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        super().__init__(messages)
        self.slices: list[int] = []
        self.walks = 0

    def __getitem__(self, index: Any) -> Any:
        found = super().__getitem__(index)
        if isinstance(index, slice):
            self.slices.append(len(found))
        return found

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.walks += 1
        return super().__iter__()


def test_a_continued_reading_compares_the_history_once_and_copies_only_what_is_new() -> None:
    """Whether the previous request continues into this one is asked once per
    reading, without a copy of the history to ask it."""
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i}"} for i in range(60)
    ]
    previous = read_conversation({}, history, COUNTER, 2)
    grown = _Copies([*history, {"role": "user", "content": "next"}])
    incremental = asyncio.run(read_async({}, grown, COUNTER, 2, previous=previous))
    assert grown.walks == 1
    assert all(length < 10 for length in grown.slices), grown.slices
    _same(incremental, read_conversation({}, list(grown), COUNTER, 2))


class _Unwalkable(list[int]):
    def __iter__(self) -> Iterator[int]:
        raise AssertionError("every count was read again")


def test_a_readings_size_is_carried_not_summed_again_over_every_count() -> None:
    """A request's size is its previous request's and its new messages': the
    counts of a long history are not all read again to know it."""
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}"} for i in range(40)
    ]
    previous = read_conversation({}, history, COUNTER, 2)
    grown = [*history, {"role": "user", "content": "more"}]
    incremental = read_conversation({}, grown, COUNTER, 2, previous=previous)
    full = read_conversation({}, grown, COUNTER, 2)
    unwalkable = dataclasses.replace(incremental, counts=_Unwalkable(incremental.counts))
    assert unwalkable.tokens == full.tokens


def test_a_new_system_text_finds_the_context_again() -> None:
    """An echo that arrives later can make an earlier user message context."""
    echo = "Follow the house rules. " * 12
    messages = [
        {"role": "system", "content": "short"},
        {"role": "user", "content": f"<environment_context>a</environment_context>\n\n{echo}"},
        *[{"role": "assistant" if i % 2 else "user", "content": f"m{i}"} for i in range(30)],
    ]
    previous = read_conversation({}, messages, COUNTER, 0)
    grown = [*messages, {"role": "system", "content": echo}]
    incremental = read_conversation({}, grown, COUNTER, 0, previous=previous)
    full = read_conversation({}, grown, COUNTER, 0)
    assert full.context != previous.context
    _same(incremental, full)


def test_a_previous_reading_with_another_scope_or_head_count_is_not_reused() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    previous = read_conversation({}, messages, COUNTER, 1, scope=b"one")
    grown = [*messages, {"role": "user", "content": "c"}]
    assert continues(previous, grown, COUNTER, 1, b"one") == 2
    assert continues(previous, grown, COUNTER, 1, b"two") == 0
    assert continues(previous, grown, COUNTER, 2, b"one") == 0
    assert continues(previous, grown, TokenCounter("gpt-4"), 1, b"one") == 0
    # equal messages that are not the same objects were parsed from other bytes
    assert continues(previous, [dict(m) for m in grown], COUNTER, 1, b"one") == 0


# --- bodies -----------------------------------------------------------------

TRAILING = {
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": 'brackets ] and "],\\"x\\":1}" inside a string',
                "parameters": {"type": "object", "required": ["cmd"], "properties": {}},
            },
        }
    ],
    "stream": True,
    "metadata": {"note": "]}"},
}


def _dump(body: dict[str, Any], style: str) -> bytes:
    if style == "orjson":
        return orjson.dumps(body)
    if style == "indent":
        return json.dumps(body, indent=2).encode()
    return json.dumps(body, ensure_ascii=False).encode()  # ", " and ": " separators


@st.composite
def bodies(draw: st.DrawFn) -> tuple[list[str], list[str], str]:
    keys = list(TRAILING)
    before = draw(st.lists(st.sampled_from(keys), unique=True))
    after = [key for key in keys if key not in before and draw(st.booleans())]
    return before, after, draw(st.sampled_from(["orjson", "indent", "spaced"]))


def _body(before: list[str], after: list[str], messages: list[Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "gpt-4o"}
    body.update({key: TRAILING[key] for key in before})
    body["messages"] = messages
    body.update({key: TRAILING[key] for key in after})
    return body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), layout=bodies())
def test_a_body_read_as_its_previous_bytes_plus_a_tail_equals_its_full_parse(
    data: st.DataObject, layout: tuple[list[str], list[str], str]
) -> None:
    before, after, style = layout
    messages = data.draw(messages_.filter(bool))
    raw = _dump(_body(before, after, messages), style)
    reading = reading_of(raw, orjson.loads(raw))
    assert reading is not None
    for _ in range(data.draw(st.integers(1, 4))):
        action, messages = _step(data.draw, messages)
        trailing = after if data.draw(st.booleans()) else [k for k in after if k != "stream"]
        raw = _dump(_body(before, trailing, messages), style)
        full = orjson.loads(raw)
        continued = continue_body(raw, reading)
        if action in ("grow", "same"):
            assert continued is not None
        if continued is not None:
            assert continued.body == full
            assert list(continued.body) == list(full)
            assert continued.body["messages"][: continued.known] == reading.messages
            assert continued.new == full["messages"][continued.known :]
            assert orjson.loads(continued.tail)  # the tail, for the caller's own checks
        if not messages:
            break
        reading = reading_of(raw, continued.body if continued is not None else full)
        assert reading is not None


def test_many_tool_schemas_after_the_array_still_let_it_be_delimited() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"required": ["a"]}}}
    body = {"messages": [{"role": "user", "content": "a"}], "tools": [tool] * 500}
    raw = json.dumps(body, indent=1).encode()
    reading = reading_of(raw, orjson.loads(raw))
    assert reading is not None
    grown = {**body, "messages": [*body["messages"], {"role": "assistant", "content": "b"}]}
    continued = continue_body(json.dumps(grown, indent=1).encode(), reading)
    assert continued is not None and continued.body == grown


def test_a_tail_naming_a_leading_field_again_is_read_in_full() -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}]})
    reading = reading_of(raw, orjson.loads(raw))
    assert reading is not None
    again = raw[:-2] + b',{"role":"user","content":"b"}],"model":"other"}'
    assert continue_body(again, reading) is None
    grown = raw[:-2] + b',{"role":"user","content":"b"}],"stream":true}'
    continued = continue_body(grown, reading)
    assert continued is not None
    assert continued.body == orjson.loads(grown)


def test_bytes_that_differ_inside_the_prefix_or_end_early_are_read_in_full() -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "abc"}]})
    reading = reading_of(raw, orjson.loads(raw))
    assert reading is not None
    assert continue_body(raw.replace(b"abc", b"abd") + b" ", reading) is None
    assert continue_body(raw[: reading.end], reading) is None
    assert continue_body(raw[: reading.end] + b"x]}", reading) is None


def test_a_body_without_messages_has_no_reading() -> None:
    for body in ({"model": "m"}, {"messages": []}, {"messages": "text"}):
        raw = orjson.dumps(body)
        assert reading_of(raw, orjson.loads(raw)) is None


# --- the cache --------------------------------------------------------------


def _big(text: str, n: int = 1) -> tuple[bytes, dict[str, Any]]:
    filler = "x" * MIN_READING_BYTES
    messages = [{"role": "user", "content": f"{text} {filler}"}]
    messages += [{"role": "assistant", "content": f"reply {i}"} for i in range(n)]
    raw = orjson.dumps({"model": "m", "messages": messages})
    return raw, orjson.loads(raw)


def _grown(raw: bytes) -> bytes:
    return raw[:-2] + b',{"role":"user","content":"next"}]}'


def test_a_reading_is_found_by_its_owner_only() -> None:
    cache = ReadingCache()
    raw, body = _big("task")
    reading = reading_of(raw, body)
    assert reading is not None
    cache.keep("alice", "conversation", reading)
    assert cache.find("bob", _grown(raw)) is None
    found = cache.find("alice", _grown(raw))
    assert found is not None and found.body == orjson.loads(_grown(raw))
    assert (cache.figures().hits, cache.figures().misses) == (1, 1)


def test_small_bodies_are_neither_looked_up_nor_worth_remembering() -> None:
    cache = ReadingCache()
    raw = orjson.dumps({"messages": [{"role": "user", "content": "hi"}]})
    assert not cache.wants(raw)
    assert cache.find("alice", raw) is None
    assert cache.figures().misses == 0


def test_the_least_recently_used_reading_goes_first_when_the_memory_bound_is_crossed() -> None:
    readings = [reading_of(*_big(f"task {i}")) for i in range(3)]
    assert all(r is not None for r in readings)
    sizes = [r.size for r in readings if r is not None]
    cache = ReadingCache(max_bytes=sizes[0] + sizes[1] + sizes[2] // 2)
    for i, reading in enumerate(readings):
        assert reading is not None
        cache.keep("alice", f"c{i}", reading)
    figures = cache.figures()
    assert figures.readings == 2
    assert figures.bytes <= figures.limit
    first, _ = _big("task 0")
    last, _ = _big("task 2")
    assert cache.find("alice", _grown(first)) is None
    assert cache.find("alice", _grown(last)) is not None


def test_a_conversation_keeps_only_its_latest_reading() -> None:
    cache = ReadingCache()
    raw, _ = _big("task")
    grown = _grown(raw)
    for data in (raw, grown):
        reading = reading_of(data, orjson.loads(data))
        assert reading is not None
        cache.keep("alice", "conversation", reading)
    figures = cache.figures()
    assert figures.readings == 1
    found = cache.find("alice", _grown(grown))
    assert found is not None and found.known == 3


def test_an_owner_keeps_a_bounded_number_of_conversations() -> None:
    cache = ReadingCache()
    for i in range(READINGS_PER_OWNER + 3):
        reading = reading_of(*_big(f"task {i}"))
        assert reading is not None
        cache.keep("alice", f"c{i}", reading)
    assert cache.figures().readings == READINGS_PER_OWNER


@pytest.mark.parametrize("limit", [0])
def test_a_cache_of_no_bytes_reads_everything_in_full(limit: int) -> None:
    cache = ReadingCache(max_bytes=limit)
    raw, body = _big("task")
    reading = reading_of(raw, body)
    assert reading is not None
    cache.keep("alice", "conversation", reading)
    assert cache.find("alice", _grown(raw)) is None
    assert cache.figures().readings == 0
