"""Anthropic Messages' recall surface: the tool it adds, the calls and follow-up
it reads and writes, and a stream relayed over several upstream answers — fed
as the API writes its events (split at every byte where it matters) and read
back by the ``anthropic`` SDK's own stream reader."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import anthropic
import httpx2
import orjson
import pytest

from compaction.chat.recall import RECALL_TOOL_DESCRIPTION, RECALL_TOOL_NAME, RECALL_TOOL_PARAMETERS
from proxy.dialects.anthropic import recall as anthropic_recall
from proxy.dialects.anthropic.recall import ANTHROPIC_RECALL, RECALL_TOOL, AnthropicRecallStream
from proxy.dialects.recall import RecallCall, Usage
from tests.proxy.dialects.anthropic.sessions import CACHE, claude_code_request, thinking_block
from tests.proxy.dialects.anthropic.upstream import AnthropicUpstream

RECALL_INPUT = {"ref": "rabcdefghijkl", "start_line": 3}


# --- the API's events ---------------------------------------------------------------


def _event(kind: str, data: dict[str, Any], end: bytes = b"\n") -> bytes:
    return b"event: " + kind.encode() + end + b"data: " + orjson.dumps(data) + end + end


def _start(message_id: str = "msg_01", input_tokens: int = 900) -> bytes:
    usage = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4000,
        "output_tokens": 1,
    }
    message = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return _event("message_start", {"type": "message_start", "message": message})


def _block(index: int, block: dict[str, Any]) -> list[bytes]:
    """A whole block's events: its start, its deltas in two pieces, its stop."""
    kind = block["type"]
    if kind == "text":
        empty: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in _halves(block["text"])]
    elif kind == "thinking":
        empty = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": p} for p in _halves(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "redacted_thinking":
        empty, deltas = block, []
    else:
        empty = {**block, "input": {}}
        deltas = [
            {"type": "input_json_delta", "partial_json": p}
            for p in _halves(orjson.dumps(block["input"]).decode() if block["input"] else "")
        ]
    start = {"type": "content_block_start", "index": index, "content_block": empty}
    return [
        _event("content_block_start", start),
        *(
            _event(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}
            )
            for d in deltas
        ),
        _event("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [text[:middle], text[middle:]]


def _end(stop_reason: str, output_tokens: int, **usage: int) -> list[bytes]:
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {**usage, "output_tokens": output_tokens},
    }
    return [_event("message_delta", delta), _event("message_stop", {"type": "message_stop"})]


def _answer(
    blocks: list[dict[str, Any]],
    stop_reason: str,
    output_tokens: int = 30,
    *,
    message_id: str = "msg_01",
    input_tokens: int = 900,
    **usage: int,
) -> list[bytes]:
    """A round's stream, event by event, as the API sends it."""
    events = [_start(message_id, input_tokens), _event("ping", {"type": "ping"})]
    for index, block in enumerate(blocks):
        events += _block(index, block)
    return events + _end(stop_reason, output_tokens, **usage)


def _recall(call_id: str = "toolu_recall1", tool_input: Any = None) -> dict[str, Any]:
    given = RECALL_INPUT if tool_input is None else tool_input
    return {"type": "tool_use", "id": call_id, "name": RECALL_TOOL_NAME, "input": given}


def _bash(call_id: str = "toolu_bash1") -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": "ls -la"}}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _relay(chunks: Iterable[bytes]) -> tuple[bytes, Any]:
    stream = ANTHROPIC_RECALL.stream()
    out = b"".join(stream.feed(chunk) for chunk in chunks) + stream.end()
    return out, stream


def _kinds(raw: bytes) -> list[str]:
    return [e.event or "" for e in anthropic._streaming.SSEDecoder().iter_bytes(iter([raw]))]


def _datas(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e.data) for e in anthropic._streaming.SSEDecoder().iter_bytes(iter([raw]))]


def _sdk_final(raw: bytes) -> Any:
    """The message the ``anthropic`` SDK puts together from the client's stream."""
    client = anthropic.Anthropic(
        api_key="k",
        base_url="http://upstream",
        http_client=httpx2.Client(
            transport=httpx2.MockTransport(
                lambda request: httpx2.Response(
                    200, content=raw, headers={"content-type": "text/event-stream"}
                )
            )
        ),
    )
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "go"}]
    ) as stream:
        return stream.get_final_message()


# --- with_tool ----------------------------------------------------------------------


def test_the_recall_tool_is_the_engines_name_description_and_schema_as_a_client_tool() -> None:
    assert RECALL_TOOL == {
        "name": RECALL_TOOL_NAME,
        "description": RECALL_TOOL_DESCRIPTION,
        "input_schema": RECALL_TOOL_PARAMETERS,
    }


def test_with_tool_appends_the_same_bytes_after_the_clients_tools_and_keeps_its_breakpoint() -> (
    None
):
    body = claude_code_request(4, seed=3)
    body["tools"][-1]["cache_control"] = CACHE
    before = copy.deepcopy(body)
    first, second = ANTHROPIC_RECALL.with_tool(body), ANTHROPIC_RECALL.with_tool(body)
    assert first is not None and second is not None
    assert body == before  # the client's body is left as it was
    tools = orjson.dumps(first["tools"])
    assert tools == orjson.dumps(second["tools"])
    assert tools == orjson.dumps(body["tools"])[:-1] + b"," + orjson.dumps(RECALL_TOOL) + b"]"
    assert first["tools"][-2]["cache_control"] == CACHE
    assert "cache_control" not in first["tools"][-1]
    assert {k: v for k, v in first.items() if k != "tools"} == {
        k: v for k, v in body.items() if k != "tools"
    }


def test_with_tool_leaves_server_tools_where_the_client_put_them() -> None:
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
    body = {"model": "m", "messages": [], "tools": [search, {"name": "Read", "input_schema": {}}]}
    added = ANTHROPIC_RECALL.with_tool(body)
    assert added is not None
    assert added["tools"] == [*body["tools"], RECALL_TOOL]


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"tools": []},
        {"tools": None},
        {"tools": [{"name": "Read", "input_schema": {}}, {**RECALL_TOOL, "description": "x"}]},
        {"tools": [{"name": "Read", "input_schema": {}}], "tool_choice": {"type": "none"}},
    ],
    ids=["no tools", "empty tools", "null tools", "recall declared already", "tool_choice none"],
)
def test_with_tool_adds_nothing_where_the_model_could_not_or_need_not_be_offered_it(
    extra: dict[str, Any],
) -> None:
    assert ANTHROPIC_RECALL.with_tool({"model": "m", "messages": [], **extra}) is None


def test_the_last_round_drops_the_recall_tool_and_keeps_the_clients_tools_and_choice() -> None:
    body = ANTHROPIC_RECALL.with_tool(
        {"model": "m", "tools": [_tool("Read")], "tool_choice": {"type": "auto"}}
    )
    assert body is not None
    last = ANTHROPIC_RECALL.without_tool(body)
    assert last == {**body, "tools": [_tool("Read")]}
    assert body["tools"][-1]["name"] == RECALL_TOOL_NAME


def _tool(name: str) -> dict[str, Any]:
    return {"name": name, "description": name, "input_schema": {"type": "object"}}


# --- whole answers --------------------------------------------------------------------


def _whole(content: list[dict[str, Any]], **usage: int) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 900, "output_tokens": 30, **usage},
    }


def test_calls_are_the_recall_tool_uses_in_order_with_their_input_as_json() -> None:
    answer = _whole(
        [
            _text("Let me look."),
            _recall("toolu_a"),
            _bash(),
            _recall("toolu_b", {"ref": "rzzzzzzzzzzzz"}),
        ]
    )
    assert ANTHROPIC_RECALL.calls(answer) == [
        RecallCall("toolu_a", orjson.dumps(RECALL_INPUT).decode()),
        RecallCall("toolu_b", '{"ref":"rzzzzzzzzzzzz"}'),
    ]
    assert ANTHROPIC_RECALL.calls(_whole([_text("done")])) == []


def test_followup_appends_the_turn_without_client_calls_and_one_user_message_of_results() -> None:
    sent = {
        "model": "m",
        "tools": [_tool("Bash"), RECALL_TOOL],
        "messages": [{"role": "user", "content": "fix the test"}],
    }
    before = copy.deepcopy(sent)
    thinking = thinking_block("The test output was shortened; read it back first.")
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy" + "x" * 40}
    blocks = [thinking, redacted, _text(""), _text(" \n"), _text("Reading."), _recall("toolu_a")]
    answer = _whole([*blocks, _bash(), _recall("toolu_b", {"ref": "rzzzzzzzzzzzz"})])
    a, b = ANTHROPIC_RECALL.calls(answer)
    body, exchange = ANTHROPIC_RECALL.followup(sent, answer, [(a, "line 3\nline 4"), (b, "gone")])
    assert sent == before  # what was sent is never changed
    kept = [thinking, redacted, _text("Reading."), _recall("toolu_a")]
    turn = {"role": "assistant", "content": [*kept, _recall("toolu_b", {"ref": "rzzzzzzzzzzzz"})]}
    results = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "line 3\nline 4"},
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": "gone"},
        ],
    }
    assert exchange == [turn, results]
    assert body == {**sent, "messages": [*sent["messages"], turn, results]}
    # What the API checks of it: every call paired with its result, and the
    # thinking block's signature the one it gave that text.
    assert AnthropicUpstream().refusal(body) is None


def test_followup_leaves_out_a_recall_call_given_no_result_so_every_call_stays_paired() -> None:
    sent = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    answer = _whole([_recall("toolu_a"), _recall("toolu_b")])
    first, _second = ANTHROPIC_RECALL.calls(answer)
    body, exchange = ANTHROPIC_RECALL.followup(sent, answer, [(first, "text")])
    assert exchange[0] == {"role": "assistant", "content": [_recall("toolu_a")]}
    assert AnthropicUpstream().refusal(body) is None


def test_followup_of_a_turn_of_thinking_and_recall_alone_keeps_both() -> None:
    thinking = thinking_block("Only a recall.")
    sent = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    body, exchange = ANTHROPIC_RECALL.followup(
        sent, _whole([thinking, _recall()]), [(RecallCall("toolu_recall1", "{}"), "text")]
    )
    assert exchange[0] == {"role": "assistant", "content": [thinking, _recall()]}
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]


def test_usage_is_input_and_output_tokens_and_final_adds_the_earlier_rounds_to_them() -> None:
    answer = _whole([_text("done")], cache_read_input_tokens=4000, cache_creation_input_tokens=7)
    assert ANTHROPIC_RECALL.usage(answer) == Usage(prompt=900, output=30)
    before = copy.deepcopy(answer)
    final = ANTHROPIC_RECALL.final(answer, Usage(prompt=1000, output=12))
    assert answer == before
    assert final == {
        **answer,
        "usage": {
            "input_tokens": 1900,
            "output_tokens": 42,
            "cache_read_input_tokens": 4000,
            "cache_creation_input_tokens": 7,
        },
    }


# --- streams ----------------------------------------------------------------------------


@pytest.mark.parametrize("end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_a_stream_without_recall_is_relayed_byte_for_byte_one_event_at_a_time(end: bytes) -> None:
    events = [e.replace(b"\n", end) for e in _answer([_text("Hello there, all good.")], "end_turn")]
    stream = ANTHROPIC_RECALL.stream()
    for event in events:
        # Each event goes out whole as soon as its blank line arrives, not before.
        assert stream.feed(event[:-1]) == b""
        assert stream.feed(event[-1:]) == event
    assert stream.end() == b""
    assert not stream.recalled and stream.dropped == 0


@pytest.mark.parametrize("end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_a_stream_split_at_any_byte_is_released_as_its_whole_events_so_far(end: bytes) -> None:
    events = [e.replace(b"\n", end) for e in _answer([_text("Hi.")], "end_turn", 3)]
    raw = b"".join(events)
    bounds = [sum(len(e) for e in events[: i + 1]) for i in range(len(events))]
    for cut in range(len(raw) + 1):
        stream = ANTHROPIC_RECALL.stream()
        first = stream.feed(raw[:cut])
        whole = max((b for b in bounds if b <= cut), default=0)
        assert first == raw[:whole]
        assert first + stream.feed(raw[cut:]) + stream.end() == raw


def test_a_partial_event_held_at_the_end_of_the_stream_is_relayed_by_end() -> None:
    events = _answer([_text("Hi.")], "end_turn")
    stream = ANTHROPIC_RECALL.stream()
    cut = events[-1].rstrip(b"\n")
    assert stream.feed(b"".join(events[:-1]) + cut) == b"".join(events[:-1])
    assert stream.end() == cut


def _recalling_round() -> tuple[list[bytes], list[dict[str, Any]]]:
    blocks = [
        thinking_block("The log was shortened; I need lines 3 on."),
        _text("Let me read the log again."),
        _recall(),
    ]
    return _answer(blocks, "tool_use", 41, input_tokens=900), blocks


def test_a_recall_call_is_hidden_and_its_round_put_together_as_the_whole_answer() -> None:
    events, blocks = _recalling_round()
    shown = b"".join(events[:2] + events[2:11])  # start, ping, the thinking and the text
    for cut in range(len(b"".join(events)) + 1):
        raw = b"".join(events)
        out, stream = _relay([raw[:cut], raw[cut:]])
        assert out == shown
        assert stream.recalled and stream.dropped == 0
    assert RECALL_TOOL_NAME.encode() not in shown
    assert stream.answer() == {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": blocks,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 900,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 4000,
            "output_tokens": 41,
        },
    }
    assert ANTHROPIC_RECALL.calls(stream.answer()) == [
        RecallCall("toolu_recall1", orjson.dumps(RECALL_INPUT).decode())
    ]


def test_a_recall_call_streamed_with_no_input_reads_as_an_empty_object() -> None:
    _, stream = _relay(_answer([_recall(tool_input={})], "tool_use"))
    assert stream.recalled
    assert stream.answer()["content"] == [_recall(tool_input={})]


def test_an_error_event_in_a_recalled_round_is_still_relayed() -> None:
    events, _ = _recalling_round()
    error = _event(
        "error", {"type": "error", "error": {"type": "overloaded_error", "message": "x"}}
    )
    out, stream = _relay([*events[:14], error])
    assert out.endswith(error)
    assert stream.recalled


def test_a_recall_after_a_client_tool_call_is_dropped_and_later_blocks_renumbered() -> None:
    blocks = [_text("Running it."), _bash(), _recall(), _bash("toolu_bash2")]
    out, stream = _relay(_answer(blocks, "tool_use"))
    assert not stream.recalled and stream.dropped == 1
    assert RECALL_TOOL_NAME.encode() not in out
    indices = [d["index"] for d in _datas(out) if "index" in d]
    assert sorted(set(indices)) == [0, 1, 2]
    final = _sdk_final(out)
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert [b.id for b in final.content[1:]] == ["toolu_bash1", "toolu_bash2"]
    assert final.stop_reason == "tool_use"


def test_a_later_round_continues_the_clients_one_message() -> None:
    first, _ = _recalling_round()
    second = _answer(
        [_text("Line 3 says the fixture is missing."), _bash()],
        "tool_use",
        25,
        message_id="msg_02",
        input_tokens=1500,
    )
    stream = ANTHROPIC_RECALL.stream()
    out = b"".join(stream.feed(e) for e in first) + stream.end()
    assert stream.recalled
    stream.next_round()
    assert not stream.recalled
    out += b"".join(stream.feed(e) for e in second) + stream.end()
    kinds = _kinds(out)
    assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1
    assert kinds.count("message_delta") == 1
    datas = _datas(out)
    starts = [d["index"] for d in datas if d["type"] == "content_block_start"]
    assert starts == [0, 1, 2, 3]
    # Output of both rounds; the input count is the first round's, sent at the start.
    assert [d["usage"] for d in datas if d["type"] == "message_delta"] == [{"output_tokens": 66}]
    final = _sdk_final(out)
    assert final.id == "msg_01"
    assert [b.type for b in final.content] == ["thinking", "text", "text", "tool_use"]
    assert final.content[2].text == "Line 3 says the fixture is missing."
    assert final.usage.output_tokens == 66 and final.usage.input_tokens == 900


def test_a_third_round_is_offset_past_both_earlier_rounds_and_counts_their_usage() -> None:
    stream = ANTHROPIC_RECALL.stream()
    out = b""
    rounds = [
        _answer([_text("First."), _recall("toolu_r1")], "tool_use", 10, input_tokens=100),
        _answer([_recall("toolu_r2")], "tool_use", 20, message_id="msg_02", input_tokens=200),
        _answer([_text("Done.")], "end_turn", 30, message_id="msg_03", input_tokens=300),
    ]
    for i, events in enumerate(rounds):
        if i:
            stream.next_round()
        out += b"".join(stream.feed(e) for e in events) + stream.end()
    assert [d["index"] for d in _datas(out) if d["type"] == "content_block_start"] == [0, 1]
    final = _sdk_final(out)
    assert [b.text for b in final.content] == ["First.", "Done."]
    assert final.usage.output_tokens == 60


def test_a_later_rounds_message_delta_that_counts_input_gets_the_earlier_input_too() -> None:
    first, _ = _recalling_round()
    second = _answer([_text("ok")], "end_turn", 5, input_tokens=1500)
    second[-2] = _end("end_turn", 5, input_tokens=1500, cache_read_input_tokens=4000)[0]
    stream = ANTHROPIC_RECALL.stream()
    for event in first:
        stream.feed(event)
    stream.next_round()
    out = b"".join(stream.feed(e) for e in second)
    [usage] = [d["usage"] for d in _datas(out) if d["type"] == "message_delta"]
    assert usage == {"input_tokens": 2400, "cache_read_input_tokens": 4000, "output_tokens": 46}


def test_only_block_starts_are_parsed_in_a_first_round_of_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[bytes] = []
    read = anthropic_recall._read

    def counting(raw: bytes) -> Any:
        parsed.append(raw)
        return read(raw)

    monkeypatch.setattr(anthropic_recall, "_read", counting)
    pieces = [
        _text(f"piece {i} of a long answer about message_delta and ping. ") for i in range(40)
    ]
    events = _answer(pieces, "end_turn")
    out, _ = _relay(events)
    assert out == b"".join(events)
    assert len(parsed) == len(pieces)
    assert all(b'"content_block_start"' in raw for raw in parsed)


def test_the_rest_of_a_block_open_when_a_recall_starts_is_still_relayed() -> None:
    text = _block(0, _text("Checking."))
    recall = _block(1, _recall())
    # The text block's stop arrives after the recall block started.
    events = [_start(), *text[:-1], *recall[:2], text[-1], *recall[2:], *_end("tool_use", 9)]
    out, stream = _relay(events)
    assert stream.recalled
    assert out == b"".join([events[0], *text])


# --- bounds ---------------------------------------------------------------------------------

#: An event bound above every event of these streams but their long deltas.
_HELD = 200


def test_a_round_past_what_is_kept_of_it_drops_a_later_recall_call() -> None:
    events, _ = _recalling_round()
    # Everything up to the recall block fits; its start is one byte too many.
    stream = AnthropicRecallStream(max_kept_bytes=len(b"".join(events[:11])))

    out = b"".join(stream.feed(event) for event in events) + stream.end()

    assert not stream.recalled and stream.dropped == 1
    assert RECALL_TOOL_NAME.encode() not in out
    assert out == b"".join([*events[:11], *events[-2:]])
    final = _sdk_final(out)
    assert [b.type for b in final.content] == ["thinking", "text"]


def test_an_event_too_long_to_hold_is_relayed_as_it_comes_and_its_round_cannot_recall() -> None:
    blocks = [_text("x" * 600), _recall()]
    events = _answer(blocks, "tool_use")
    stream = AnthropicRecallStream(max_event_bytes=_HELD)

    out = b"".join(
        stream.feed(event[i : i + 40]) for event in events for i in range(0, len(event), 40)
    )
    out += stream.end()

    assert not stream.recalled and stream.dropped == 1
    assert out == b"".join([*events[:6], *events[-2:]])
    assert _sdk_final(out).content[0].text == "x" * 600


def test_an_event_too_long_to_hold_in_a_later_round_is_moved_to_its_blocks_place() -> None:
    first, _ = _recalling_round()
    second = _answer([_text("y" * 600)], "end_turn", 5, message_id="msg_02")
    stream = AnthropicRecallStream(max_event_bytes=_HELD)
    out = b"".join(stream.feed(e) for e in first) + stream.end()
    stream.next_round()

    out += b"".join(stream.feed(e[i : i + 40]) for e in second for i in range(0, len(e), 40))
    out += stream.end()

    final = _sdk_final(out)
    assert [b.type for b in final.content] == ["thinking", "text", "text"]
    assert final.content[2].text == "y" * 600


def test_a_long_event_of_a_dropped_recall_block_is_left_out_in_every_piece() -> None:
    blocks = [_bash(), _recall(tool_input={"ref": "r" + "z" * 600})]
    events = _answer(blocks, "tool_use")
    stream = AnthropicRecallStream(max_event_bytes=_HELD)

    out = b"".join(stream.feed(e[i : i + 40]) for e in events for i in range(0, len(e), 40))
    out += stream.end()

    assert stream.dropped == 1 and b"zzz" not in out
    assert [b.type for b in _sdk_final(out).content] == ["tool_use"]
