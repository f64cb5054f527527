"""proxy.dialects.chat.recall: the recall tool in Chat's shape, its calls read back, the
follow-up request, and a chunk stream continued over rounds.

The streams are built from chunks shaped as OpenAI writes them (every chunk with
``"usage": null`` when the client asked for usage, the first delta of a tool call with
its ``id``, ``type`` and name, then pieces of its arguments), and what a client makes of
the relayed bytes is read with the ``openai`` SDK's own SSE decoder and stream
accumulator.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import openai._streaming
import orjson
import pytest
from openai.lib.streaming.chat._completions import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from compaction.chat.recall import RECALL_TOOL_NAME
from proxy.dialects.chat.recall import CHAT_RECALL, RECALL_TOOL, ChatRecallStream
from proxy.dialects.recall import RecallCall, RecallStream, RecallSurface, Usage

FIRST_ID = "chatcmpl-AaFirst"
USAGE_1 = {
    "prompt_tokens": 1200,
    "completion_tokens": 30,
    "total_tokens": 1230,
    "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
}
USAGE_2 = {
    "prompt_tokens": 1500,
    "completion_tokens": 12,
    "total_tokens": 1512,
    "prompt_tokens_details": {"cached_tokens": 1152, "audio_tokens": 0},
}


def _chunk(
    delta: dict[str, Any],
    finish: str | None = None,
    *,
    chunk_id: str = FIRST_ID,
    end: bytes = b"\n\n",
) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return _framed_chunk([choice], None, chunk_id, end)


def _usage_chunk(usage: dict[str, Any], *, chunk_id: str = FIRST_ID) -> bytes:
    return _framed_chunk([], usage, chunk_id, b"\n\n")


def _framed_chunk(
    choices: list[dict[str, Any]], usage: dict[str, Any] | None, chunk_id: str, end: bytes
) -> bytes:
    event = {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": 1764625310,
        "model": "gpt-4o-2024-08-06",
        "service_tier": "default",
        "system_fingerprint": "fp_07871e2ad8",
        "choices": choices,
        "usage": usage,
    }
    return b"data: " + orjson.dumps(event) + end


DONE = b"data: [DONE]\n\n"


def _role(chunk_id: str = FIRST_ID) -> bytes:
    return _chunk({"role": "assistant", "content": "", "refusal": None}, chunk_id=chunk_id)


def _text(text: str, chunk_id: str = FIRST_ID) -> bytes:
    return _chunk({"content": text}, chunk_id=chunk_id)


def _call_start(index: int, call_id: str, name: str, chunk_id: str = FIRST_ID) -> bytes:
    entry = {
        "index": index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": ""},
    }
    return _chunk({"tool_calls": [entry]}, chunk_id=chunk_id)


def _arguments(index: int, piece: str, chunk_id: str = FIRST_ID) -> bytes:
    return _chunk(
        {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, chunk_id=chunk_id
    )


def _recall_round(usage: dict[str, Any] | None = USAGE_1) -> list[bytes]:
    """A round that says a few words, then calls compaction_recall."""
    events = [
        _role(),
        _text("Let me read "),
        _text("that output again."),
        _call_start(0, "call_R1", RECALL_TOOL_NAME),
        _arguments(0, '{"ref": "r2b4c'),
        _arguments(0, '6d7e2f3g", "start_line"'),
        _arguments(0, ": 120}"),
        _chunk({}, "tool_calls"),
    ]
    if usage is not None:
        events.append(_usage_chunk(usage))
    return [*events, DONE]


def _relay(events: Iterable[bytes], chunks: Iterable[bytes] | None = None) -> bytes:
    """What a fresh stream relays for ``chunks`` (the events' bytes as they are, by default)."""
    stream = CHAT_RECALL.stream()
    out = b"".join(stream.feed(chunk) for chunk in (chunks if chunks is not None else events))
    return out + stream.end()


def _client_reads(relayed: bytes) -> Any:
    """The completion the ``openai`` SDK puts together from a relayed stream."""
    state = ChatCompletionStreamState()
    for sse in openai._streaming.SSEDecoder().iter_bytes(iter([relayed])):
        if sse.data.startswith("[DONE]"):
            break
        state.handle_chunk(ChatCompletionChunk.model_validate(orjson.loads(sse.data)))
    return state.get_final_completion()


def _data(relayed: bytes) -> list[Any]:
    events = [e for e in relayed.split(b"\n\n") if e]
    return [e[6:] if e == b"data: [DONE]" else orjson.loads(e[6:]) for e in events]


# ---- with_tool ----------------------------------------------------------------------------


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell_command",
            "description": "Runs a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def test_the_recall_tool_goes_after_the_requests_own_tools_in_the_same_bytes_every_time() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
    }
    before = copy.deepcopy(body)

    first = CHAT_RECALL.with_tool(body)
    second = CHAT_RECALL.with_tool(copy.deepcopy(body))

    assert first is not None and second is not None
    assert first["tools"] == [*TOOLS, RECALL_TOOL]
    assert first["tools"][-1]["function"]["name"] == RECALL_TOOL_NAME
    assert orjson.dumps(first) == orjson.dumps(second)
    assert first["tool_choice"] == "auto" and first["parallel_tool_calls"] is False
    assert body == before


@pytest.mark.parametrize(
    "tools",
    [
        None,
        [],
        "run_shell_command",
        [RECALL_TOOL],
        [*TOOLS, {"type": "function", "function": {"name": RECALL_TOOL_NAME}}],
    ],
    ids=["no tools", "an empty list", "not a list", "only ours", "ours already declared"],
)
def test_no_tool_is_added_to_a_request_without_tools_or_one_that_already_declares_it(
    tools: Any,
) -> None:
    body: dict[str, Any] = {"model": "gpt-4o", "messages": []}
    if tools is not None:
        body["tools"] = tools
    assert CHAT_RECALL.with_tool(body) is None


def test_the_last_round_drops_the_recall_tool_and_keeps_the_clients_tools_and_choice() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [],
        "tools": [*TOOLS, RECALL_TOOL],
        "tool_choice": "auto",
    }
    before = copy.deepcopy(body)

    last = CHAT_RECALL.without_tool(body)

    assert last == {**before, "tools": TOOLS}
    assert body == before


# ---- calls, usage, final --------------------------------------------------------------------


def _completion(
    answer_id: str, message: dict[str, Any], usage: dict[str, Any] | None, **fields: Any
) -> dict[str, Any]:
    """A whole answer of one choice that ends calling tools, with ``fields`` at its top."""
    answer: dict[str, Any] = {
        "id": answer_id,
        "object": "chat.completion",
        "created": 1764625310,
        "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        **fields,
    }
    if usage is not None:
        answer["usage"] = usage
    return answer


def _answer(
    tool_calls: list[dict[str, Any]], usage: dict[str, Any] | None = USAGE_2
) -> dict[str, Any]:
    """An answer as the API gives it, null and empty fields included."""
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": tool_calls,
        "refusal": None,
        "annotations": [],
    }
    answer = _completion("chatcmpl-whole", message, usage, system_fingerprint="fp_07871e2ad8")
    answer["choices"][0]["logprobs"] = None
    return answer


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_the_recall_calls_of_an_answer_are_read_in_order_and_the_clients_own_left_out() -> None:
    answer = _answer(
        [
            _call("call_A", RECALL_TOOL_NAME, '{"ref": "raaaaaaaaaaaa"}'),
            _call("call_B", "run_shell_command", '{"command": "ls"}'),
            _call("call_C", RECALL_TOOL_NAME, '{"ref": "rbbbbbbbbbbbb", "end_line": 9}'),
        ]
    )
    assert CHAT_RECALL.calls(answer) == [
        RecallCall("call_A", '{"ref": "raaaaaaaaaaaa"}'),
        RecallCall("call_C", '{"ref": "rbbbbbbbbbbbb", "end_line": 9}'),
    ]


@pytest.mark.parametrize(
    "answer",
    [
        None,
        "text",
        {},
        {"choices": None},
        {"choices": []},
        {"choices": ["x"]},
        {"choices": [{"message": None}]},
        {"choices": [{"message": {"tool_calls": "x"}}]},
        {"choices": [{"message": {"tool_calls": [None, 3, {"function": None}]}}]},
        {"choices": [{"message": {"content": "plain text"}}]},
    ],
)
def test_an_answer_of_an_odd_shape_has_no_recall_calls(answer: Any) -> None:
    assert CHAT_RECALL.calls(answer) == []


def test_a_rounds_usage_is_its_prompt_and_completion_tokens() -> None:
    assert CHAT_RECALL.usage(_answer([], USAGE_2)) == Usage(prompt=1500, output=12)
    assert CHAT_RECALL.usage(_answer([], None)) == Usage()
    assert CHAT_RECALL.usage(_answer([], {"prompt_tokens": "many"})) == Usage()


def test_the_final_answer_adds_the_earlier_rounds_usage_and_keeps_the_last_rounds_details() -> None:
    answer = _answer([], USAGE_2)
    before = copy.deepcopy(answer)

    final = CHAT_RECALL.final(answer, Usage(prompt=1200, output=30))

    assert final["usage"] == {
        "prompt_tokens": 2700,
        "completion_tokens": 42,
        "total_tokens": 2742,
        "prompt_tokens_details": {"cached_tokens": 1152, "audio_tokens": 0},
    }
    assert {k: v for k, v in final.items() if k != "usage"} == {
        k: v for k, v in before.items() if k != "usage"
    }
    assert answer == before


def test_a_final_answer_without_usage_stays_without() -> None:
    answer = _answer([], None)
    assert CHAT_RECALL.final(answer, Usage(prompt=5, output=5)) == answer


# ---- followup -------------------------------------------------------------------------------


def test_the_followup_repeats_the_models_turn_with_only_its_recall_calls_then_one_result_each() -> (
    None
):
    sent: dict[str, Any] = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "fix the test"}],
        "tools": [*TOOLS, RECALL_TOOL],
        "stream": True,
    }
    answer = _answer(
        [
            _call("call_A", RECALL_TOOL_NAME, '{"ref": "raaaaaaaaaaaa"}'),
            _call("call_B", "run_shell_command", '{"command": "ls"}'),
        ]
    )
    answer["choices"][0]["message"]["content"] = "Reading it back first."
    sent_before, answer_before = copy.deepcopy(sent), copy.deepcopy(answer)
    call = RecallCall("call_A", '{"ref": "raaaaaaaaaaaa"}')

    body, items = CHAT_RECALL.followup(sent, answer, [(call, "line 1\nline 2")])

    assert items == [
        {
            "role": "assistant",
            "content": "Reading it back first.",
            "tool_calls": [_call("call_A", RECALL_TOOL_NAME, '{"ref": "raaaaaaaaaaaa"}')],
            "annotations": [],
        },
        {"role": "tool", "tool_call_id": "call_A", "content": "line 1\nline 2"},
    ]
    assert body == {**sent_before, "messages": [*sent_before["messages"], *items]}
    assert sent == sent_before and answer == answer_before


def _turn_of_calls(**content: Any) -> dict[str, Any]:
    return {"role": "assistant", **content, "tool_calls": [_call("c0", "read_file", "{}")]}


@pytest.mark.parametrize(
    ("earlier", "written"),
    [
        ([], {"content": ""}),  # no turn of calls to copy: the string every server takes
        ([_turn_of_calls(content=None)], {"content": None}),
        ([_turn_of_calls(content="")], {"content": ""}),
        ([_turn_of_calls(content="Reading.")], {"content": ""}),
        ([_turn_of_calls()], {}),
        ([_turn_of_calls(content=None), _turn_of_calls()], {}),  # the latest one
    ],
    ids=["none", "null", "empty", "text", "absent", "latest"],
)
def test_a_followup_writes_a_turn_without_text_as_the_requests_own_turns_of_calls_do(
    earlier: list[dict[str, Any]], written: dict[str, Any]
) -> None:
    # The API writes null, which llama-cpp-python's schema refuses; the
    # upstream just took the request's own shape, so the follow-up copies it.
    answer = _answer([_call("call_A", RECALL_TOOL_NAME, "{}")])
    call = RecallCall("call_A", "{}")
    sent = {"messages": [{"role": "user", "content": "go"}, *earlier]}
    _, items = CHAT_RECALL.followup(sent, answer, [(call, "No content found.")])
    assert {k: v for k, v in items[0].items() if k == "content"} == written
    assert "refusal" not in items[0]


# ---- the stream: text only ------------------------------------------------------------------


def _text_stream(end: bytes = b"\n\n") -> list[bytes]:
    return [
        _chunk({"role": "assistant", "content": "", "refusal": None}, end=end),
        _chunk({"content": "Hello"}, end=end),
        _chunk({"content": " — wörld"}, end=end),
        _chunk({}, "stop", end=end),
        b"data: [DONE]" + end,
    ]


@pytest.mark.parametrize("end", [b"\n\n", b"\r\n\r\n"], ids=["LF", "CRLF"])
def test_a_text_stream_is_relayed_byte_for_byte_whatever_its_chunks(end: bytes) -> None:
    events = _text_stream(end)
    whole = b"".join(events)
    for cut in range(len(whole) + 1):
        assert _relay(events, [whole[:cut], whole[cut:]]) == whole, cut
    assert _relay(events, [whole[i : i + 1] for i in range(len(whole))]) == whole


@pytest.mark.parametrize("end", [b"\n\n", b"\r\n\r\n"], ids=["LF", "CRLF"])
def test_each_event_is_released_as_soon_as_its_blank_line_arrives(end: bytes) -> None:
    events = _text_stream(end)
    stream = CHAT_RECALL.stream()
    for event in events:
        # All but the last byte: nothing of the event yet; the last byte: all of it.
        released = b"".join(stream.feed(event[i : i + 1]) for i in range(len(event) - 1))
        assert released == b""
        assert stream.feed(event[-1:]) == event
    assert stream.end() == b""
    assert not stream.recalled and stream.dropped == 0


def test_a_stream_ended_inside_an_event_gives_the_held_part_at_the_end() -> None:
    stream = CHAT_RECALL.stream()
    assert stream.feed(_text("Hi") + b"data: [DONE]") == _text("Hi")
    assert stream.end() == b"data: [DONE]"
    assert stream.end() == b""


def test_a_garbled_event_naming_tool_calls_is_relayed_as_it_came() -> None:
    garbled = [b'data: {"tool_calls": [\n\n', b': keep-alive "tool_calls"\n\n', DONE]
    assert _relay(garbled) == b"".join(garbled)


def test_a_clients_own_tool_calls_pass_untouched() -> None:
    events = [
        _role(),
        _call_start(0, "call_1", "run_shell_command"),
        _arguments(0, '{"command": '),
        _arguments(0, '"ls"}'),
        _chunk({}, "tool_calls"),
        DONE,
    ]
    stream = CHAT_RECALL.stream()
    relayed = b"".join(stream.feed(event) for event in events) + stream.end()
    assert relayed == b"".join(events)
    assert not stream.recalled and stream.dropped == 0


# ---- the stream: a recall -------------------------------------------------------------------


def _round_answer(usage: dict[str, Any] | None = USAGE_1) -> dict[str, Any]:
    recall = _call("call_R1", RECALL_TOOL_NAME, '{"ref": "r2b4c6d7e2f3g", "start_line": 120}')
    message = {
        "role": "assistant",
        "content": "Let me read that output again.",
        "tool_calls": [recall],
    }
    return _completion(FIRST_ID, message, usage)


def test_a_recall_call_is_not_relayed_and_its_round_is_put_together_as_a_whole_answer() -> None:
    events = _recall_round()
    whole = b"".join(events)
    for cut in range(len(whole) + 1):
        stream = CHAT_RECALL.stream()
        relayed = stream.feed(whole[:cut]) + stream.feed(whole[cut:]) + stream.end()

        assert relayed == b"".join(events[:3]), cut
        assert stream.recalled and stream.dropped == 0
        assert stream.answer() == _round_answer(), cut


def test_a_recall_round_written_with_lone_carriage_returns_is_hidden_all_the_same() -> None:
    # A line may end with a "\r" alone; the splitter waits for the byte after
    # each final "\r", so every event goes out once the next one starts.
    events = [event.replace(b"\n", b"\r") for event in _recall_round()]
    stream = CHAT_RECALL.stream()

    relayed = b"".join(stream.feed(event) for event in events) + stream.end()

    assert relayed == b"".join(events[:3])
    assert stream.recalled and stream.dropped == 0
    assert stream.answer() == _round_answer()


def test_a_recall_rounds_answer_is_what_the_followup_is_built_from() -> None:
    stream = CHAT_RECALL.stream()
    for event in _recall_round():
        stream.feed(event)
    answer = stream.answer()
    calls = CHAT_RECALL.calls(answer)
    assert calls == [RecallCall("call_R1", '{"ref": "r2b4c6d7e2f3g", "start_line": 120}')]
    _, items = CHAT_RECALL.followup({"messages": []}, answer, [(calls[0], "the lines")])
    assert items[0]["content"] == "Let me read that output again."
    assert items[1] == {"role": "tool", "tool_call_id": "call_R1", "content": "the lines"}


def test_a_recall_after_a_relayed_client_call_is_dropped_and_the_later_calls_renumbered() -> None:
    events = [
        _role(),
        _call_start(0, "call_1", "run_shell_command"),
        _arguments(0, '{"command": "ls"}'),
        _call_start(1, "call_R", RECALL_TOOL_NAME),
        _arguments(1, '{"ref": "r2b4c6d7e2f3g"}'),
        _call_start(2, "call_2", "read_file"),
        _arguments(2, '{"path": "a.py"}'),
        _chunk({}, "tool_calls"),
        _usage_chunk(USAGE_1),
        DONE,
    ]
    stream = CHAT_RECALL.stream()
    relayed = b"".join(stream.feed(event) for event in events) + stream.end()

    assert not stream.recalled and stream.dropped == 1
    assert relayed.startswith(b"".join(events[:3]))
    assert relayed.endswith(b"".join(events[-3:]))
    assert b"call_R" not in relayed and RECALL_TOOL_NAME.encode() not in relayed
    # The recall call's two events, left with nothing to say, are not relayed at all.
    assert len(_data(relayed)) == len(events) - 2
    message = _client_reads(relayed).choices[0].message
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("call_1", "run_shell_command", '{"command": "ls"}'),
        ("call_2", "read_file", '{"path": "a.py"}'),
    ]


def test_every_call_after_a_recall_call_is_hidden_with_the_rest_of_its_round() -> None:
    events = [
        _role(),
        _call_start(0, "call_R", RECALL_TOOL_NAME),
        _arguments(0, '{"ref": "r2b4c6d7e2f3g"}'),
        _call_start(1, "call_1", "run_shell_command"),
        _arguments(1, '{"command": "ls"}'),
        _chunk({}, "tool_calls"),
        DONE,
    ]
    stream = CHAT_RECALL.stream()
    assert b"".join(stream.feed(event) for event in events) + stream.end() == _role()
    assert stream.recalled
    calls = stream.answer()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == [RECALL_TOOL_NAME, "run_shell_command"]


# ---- the stream: later rounds ---------------------------------------------------------------


def _final_round(chunk_id: str, usage: dict[str, Any] | None = USAGE_2) -> list[bytes]:
    events = [
        _role(chunk_id),
        _text("Line 120 says ", chunk_id),
        _text("`assert x == 2`.", chunk_id),
        _chunk({}, "stop", chunk_id=chunk_id),
    ]
    if usage is not None:
        events.append(_usage_chunk(usage, chunk_id=chunk_id))
    return [*events, DONE]


def _rounds(rounds: Sequence[list[bytes]]) -> tuple[bytes, Any]:
    stream = CHAT_RECALL.stream()
    relayed = b""
    for number, events in enumerate(rounds):
        if number:
            assert stream.recalled
            stream.next_round()
        relayed += b"".join(stream.feed(event) for event in events) + stream.end()
    return relayed, stream


def test_a_later_round_continues_the_first_rounds_stream_with_its_id_and_the_summed_usage() -> None:
    relayed, stream = _rounds([_recall_round(), _final_round("chatcmpl-BbSecond")])

    assert not stream.recalled
    data = _data(relayed)
    assert data[-1] == b"[DONE]" and relayed.count(b"[DONE]") == 1
    chunks = data[:-1]
    assert {chunk["id"] for chunk in chunks} == {FIRST_ID}
    # The second round's role-only delta is not relayed: one role for the stream.
    assert sum("role" in c["delta"] for chunk in chunks for c in chunk["choices"]) == 1
    assert [c["choices"][0]["delta"] if c["choices"] else None for c in chunks[3:]] == [
        {"content": "Line 120 says "},
        {"content": "`assert x == 2`."},
        {},
        None,
    ]
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 2700,
        "completion_tokens": 42,
        "total_tokens": 2742,
        "prompt_tokens_details": {"cached_tokens": 1152, "audio_tokens": 0},
    }
    completion = _client_reads(relayed)
    assert completion.id == FIRST_ID
    message = completion.choices[0].message
    assert message.role == "assistant"
    assert message.content == "Let me read that output again.Line 120 says `assert x == 2`."
    assert not message.tool_calls
    assert completion.choices[0].finish_reason == "stop"


def test_a_later_round_is_relayed_the_same_whatever_its_chunks() -> None:
    second = _final_round("chatcmpl-BbSecond")
    whole = b"".join(second)
    expected, _ = _rounds([_recall_round(), second])
    for cut in range(len(whole) + 1):
        relayed, _ = _rounds([_recall_round(), [whole[:cut], whole[cut:]]])
        assert relayed == expected, cut


def test_the_usage_of_every_hidden_round_is_added_to_the_last() -> None:
    second_round = [
        _role("chatcmpl-Mid"),
        _call_start(0, "call_R2", RECALL_TOOL_NAME, "chatcmpl-Mid"),
        _arguments(0, '{"ref": "r2b4c6d7e2f3g", "start_line": 300}', "chatcmpl-Mid"),
        _chunk({}, "tool_calls", chunk_id="chatcmpl-Mid"),
        _usage_chunk({"prompt_tokens": 1400, "completion_tokens": 20, "total_tokens": 1420}),
        DONE,
    ]
    relayed, _ = _rounds([_recall_round(), second_round, _final_round("chatcmpl-Last")])

    usage = _data(relayed)[-2]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        1200 + 1400 + 1500,
        30 + 20 + 12,
        1230 + 1420 + 1512,
    )
    assert {chunk["id"] for chunk in _data(relayed)[:-1]} == {FIRST_ID}


def test_a_later_round_that_recalls_again_hides_its_call_and_is_put_together_anew() -> None:
    second_round = [
        _chunk({"role": "assistant", "content": "More: "}, chunk_id="chatcmpl-Mid"),
        _call_start(0, "call_R2", RECALL_TOOL_NAME, "chatcmpl-Mid"),
        _arguments(0, '{"ref": "r2b4c6d7e2f3g"}', "chatcmpl-Mid"),
        _chunk({}, "tool_calls", chunk_id="chatcmpl-Mid"),
        DONE,
    ]
    relayed, stream = _rounds([_recall_round(usage=None), second_round])

    assert stream.recalled
    # The role is taken out of the delta that also carries text; the text continues.
    assert _data(relayed)[-1]["choices"][0]["delta"] == {"content": "More: "}
    answer = stream.answer()
    assert answer["choices"][0]["message"]["content"] == "More: "
    assert CHAT_RECALL.calls(answer) == [RecallCall("call_R2", '{"ref": "r2b4c6d7e2f3g"}')]
    assert "usage" not in answer


def test_a_later_round_without_usage_chunks_is_relayed_without_any() -> None:
    relayed, _ = _rounds([_recall_round(usage=None), _final_round("chatcmpl-B", usage=None)])
    assert all(chunk["usage"] is None for chunk in _data(relayed)[:-1])


# ---- bounds ---------------------------------------------------------------------------------


def test_an_event_too_long_to_hold_is_relayed_as_it_comes_and_the_round_cannot_recall() -> None:
    stream = ChatRecallStream(max_event_bytes=64)
    long_text = _text("x" * 200)
    events = [
        _role(),
        long_text,
        _call_start(0, "call_R", RECALL_TOOL_NAME),
        _arguments(0, '{"ref": "r2b4c6d7e2f3g"}'),
        _chunk({}, "tool_calls"),
        DONE,
    ]
    pieces = [long_text[i : i + 50] for i in range(0, len(long_text), 50)]
    relayed = stream.feed(events[0])
    for piece in pieces:
        out = stream.feed(piece)
        # Nothing held past the bound: every piece beyond it is let go at once.
        relayed += out
    assert relayed == events[0] + long_text
    for event in events[2:]:
        relayed += stream.feed(event)
    relayed += stream.end()

    assert not stream.recalled and stream.dropped == 1
    assert RECALL_TOOL_NAME.encode() not in relayed
    assert relayed.startswith(events[0] + long_text) and relayed.endswith(events[-2] + DONE)


def test_an_event_too_long_to_hold_in_a_hidden_round_stays_hidden_and_the_call_is_kept() -> None:
    stream = ChatRecallStream(max_event_bytes=64)
    round_ = _recall_round(usage=None)
    long_text = _text("y" * 200)
    events = [*round_[:-2], long_text, *round_[-2:]]

    relayed = b"".join(stream.feed(event) for event in events) + stream.end()

    assert relayed == b"".join(round_[:3])
    assert stream.recalled
    assert CHAT_RECALL.calls(stream.answer()) == [
        RecallCall("call_R1", '{"ref": "r2b4c6d7e2f3g", "start_line": 120}')
    ]


def test_a_round_too_long_to_repeat_drops_its_recall_call() -> None:
    events = _recall_round()
    stream = ChatRecallStream(max_kept_bytes=len(b"".join(events[:3])))

    relayed = b"".join(stream.feed(event) for event in events) + stream.end()

    assert not stream.recalled and stream.dropped == 1
    assert RECALL_TOOL_NAME.encode() not in relayed
    assert _client_reads(relayed).choices[0].message.content == "Let me read that output again."


def test_the_chat_surface_answers_the_recall_contract() -> None:
    surface: RecallSurface = CHAT_RECALL
    stream: RecallStream = surface.stream()
    assert surface.items_key == "messages"
    assert stream.feed(b"") == b"" and stream.end() == b""
