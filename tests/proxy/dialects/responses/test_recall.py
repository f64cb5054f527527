"""proxy.dialects.responses.recall: the recall tool, its calls and a stream over rounds.

The streams are the API's typed event sequence as the scripted upstream
writes it (``responses.upstream._events``), framed and numbered as the API
sends them, fed to the reader in chunks cut anywhere.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from compaction.chat.recall import RECALL_TOOL_NAME
from proxy.dialects import sse
from proxy.dialects.recall import RecallCall, RecallStream, RecallSurface, Usage
from proxy.dialects.responses.recall import RECALL_TOOL, RESPONSES_RECALL, ResponsesRecallStream
from tests.proxy.dialects.responses.shapes import codex_request
from tests.proxy.dialects.responses.upstream import _events, _response
from tests.proxy.dialects.responses.upstream import _message as message

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def reasoning(tag: str) -> dict[str, Any]:
    return {
        "id": f"rs_{tag}",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": f"Thinking about {tag}."}],
        "encrypted_content": f"gAAAAB{tag * 30}",
    }


def call(tag: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"fc_{tag}",
        "type": "function_call",
        "status": "completed",
        "call_id": f"call_{tag}",
        "name": name,
        "arguments": orjson.dumps(arguments).decode(),
    }


def recall(tag: str, ref: str = "rabcdefghijkl") -> dict[str, Any]:
    return call(tag, RECALL_TOOL_NAME, {"ref": ref, "start_line": 1})


def shell(tag: str) -> dict[str, Any]:
    return call(tag, "shell", {"command": ["bash", "-lc", "pytest -q"]})


def answer_of(output: list[dict[str, Any]], prompt: int = 1_000) -> dict[str, Any]:
    return _response(codex_request(turns=1), output, prompt)


def frames(events: list[dict[str, Any]], crlf: bool = False) -> list[bytes]:
    """Each event as the API frames it: named, numbered from 0."""
    out = []
    for number, event in enumerate(events):
        framed = sse.json_frame({**event, "sequence_number": number}, event["type"])
        out.append(framed.replace(b"\n", b"\r\n") if crlf else framed)
    return out


def stream_of(answer: dict[str, Any], crlf: bool = False) -> list[bytes]:
    return frames(_events(answer), crlf)


def read(frame: bytes) -> dict[str, Any]:
    """The data of one event as the client reads it, checked against the SDK's types."""
    name, data = frame.split(b"\n", 1)
    event = EVENTS.validate_json(data.removeprefix(b"data: ").rstrip(b"\n"))
    assert name == b"event: " + event.type.encode()
    parsed: dict[str, Any] = orjson.loads(data.removeprefix(b"data: "))
    return parsed


def events_in(relayed: bytes) -> list[dict[str, Any]]:
    parts = relayed.split(b"\n\n")
    assert parts[-1] == b""
    return [read(part + b"\n\n") for part in parts[:-1]]


def feed_all(reader: RecallStream, chunks: list[bytes]) -> bytes:
    return b"".join(reader.feed(chunk) for chunk in chunks) + reader.end()


# --- the tool --------------------------------------------------------------------


def test_the_surface_is_a_recall_surface_over_the_input_list() -> None:
    surface: RecallSurface = RESPONSES_RECALL
    assert surface.items_key == "input"


def test_the_tool_is_appended_last_in_the_same_bytes_for_every_request() -> None:
    first, second = codex_request(turns=2, seed=1), codex_request(turns=5, seed=2)
    before = copy.deepcopy(first)
    with_first, with_second = RESPONSES_RECALL.with_tool(first), RESPONSES_RECALL.with_tool(second)
    assert with_first is not None and with_second is not None
    assert first == before  # the client's body is not edited
    assert with_first["tools"][:-1] == first["tools"]
    assert with_first["tools"][-1] is RECALL_TOOL
    assert orjson.dumps(with_first["tools"][-1]) == orjson.dumps(with_second["tools"][-1])
    assert RECALL_TOOL["type"] == "function" and RECALL_TOOL["name"] == RECALL_TOOL_NAME
    # Codex's own settings go through as it sent them.
    assert {k: v for k, v in with_first.items() if k != "tools"} == {
        k: v for k, v in first.items() if k != "tools"
    }


@pytest.mark.parametrize(
    "change",
    [
        {"tools": []},
        {"tools": None},
        {"tool_choice": "none"},
        {"tools": [*codex_request()["tools"], RECALL_TOOL]},
    ],
    ids=["empty-tools", "no-tools", "tool-choice-none", "already-declared"],
)
def test_no_tool_is_added_where_the_model_could_not_or_already_can_call_it(
    change: dict[str, Any],
) -> None:
    assert RESPONSES_RECALL.with_tool({**codex_request(turns=1), **change}) is None


def test_the_recall_calls_of_an_answer_are_read_in_order_and_no_other_call() -> None:
    answer = answer_of([reasoning("a"), recall("1", "rfirst0000000"), shell("2"), recall("3")])
    assert RESPONSES_RECALL.calls(answer) == [
        RecallCall("call_1", '{"ref":"rfirst0000000","start_line":1}'),
        RecallCall("call_3", '{"ref":"rabcdefghijkl","start_line":1}'),
    ]
    assert RESPONSES_RECALL.calls(answer_of([message(1, "Done.")])) == []


def test_the_last_round_drops_the_recall_tool_and_keeps_the_clients_tools_and_choice() -> None:
    request = codex_request(turns=1)
    body = RESPONSES_RECALL.with_tool(request)
    assert body is not None
    last = RESPONSES_RECALL.without_tool(body)
    assert last == {**body, "tools": request["tools"]}
    assert last["tool_choice"] == "auto" and body["tools"][-1] == RECALL_TOOL


# --- the follow-up ---------------------------------------------------------------


def test_the_followup_sends_back_the_models_turn_without_client_calls_and_the_outputs() -> None:
    sent = codex_request(turns=2)
    before = copy.deepcopy(sent)
    patch = {
        "type": "custom_tool_call",
        "id": "ctc_1",
        "status": "completed",
        "call_id": "call_patch",
        "name": "apply_patch",
        "input": "*** Begin Patch\n*** End Patch",
    }
    turn = [reasoning("a"), message(1, "Let me read it back."), recall("r"), shell("s"), patch]
    answer = answer_of(turn)
    results = [(RecallCall("call_r", "{}"), "line 1\nline 2")]
    body, exchange = RESPONSES_RECALL.followup(sent, answer, results)
    output = {"type": "function_call_output", "call_id": "call_r", "output": "line 1\nline 2"}
    # Reasoning (with its encrypted content), text and the recall call, as the API
    # returned them (ids and status too); the client's calls are not the model's to
    # send back here: the client never saw them.
    assert exchange == [turn[0], turn[1], turn[2], output]
    assert body["input"] == [*sent["input"], *exchange]
    assert {k: v for k, v in body.items() if k != "input"} == {
        k: v for k, v in sent.items() if k != "input"
    }
    assert sent == before


def test_a_string_input_is_followed_up_as_the_user_message_it_stands_for() -> None:
    sent = {"model": "gpt-5", "input": "Fix the test.", "tools": codex_request()["tools"]}
    body, exchange = RESPONSES_RECALL.followup(
        sent, answer_of([recall("r")]), [(RecallCall("call_r", "{}"), "text")]
    )
    assert body["input"][0] == {"role": "user", "content": "Fix the test."}
    assert body["input"][1:] == exchange
    assert sent["input"] == "Fix the test."


def test_unstored_reasoning_without_its_encrypted_content_is_not_sent_back() -> None:
    bare = {"id": "rs_bare", "type": "reasoning", "summary": []}
    answer = answer_of([bare, recall("r")])
    results = [(RecallCall("call_r", "{}"), "text")]
    _, unstored = RESPONSES_RECALL.followup(codex_request(turns=1), answer, results)
    _, stored = RESPONSES_RECALL.followup(
        {**codex_request(turns=1), "store": True}, answer, results
    )
    # Unstored, the API could only look the item up by its id, and refuses it.
    assert [item.get("id") for item in unstored] == ["fc_r", None]
    assert [item.get("id") for item in stored] == ["rs_bare", "fc_r", None]


def test_the_final_answer_adds_the_earlier_rounds_usage_and_keeps_its_details() -> None:
    answer = answer_of([message(1, "Done.")], prompt=1_000)
    usage = answer["usage"]
    final = RESPONSES_RECALL.final(answer, Usage(prompt=700, output=40))
    assert final["usage"] == {
        **usage,
        "input_tokens": 1_700,
        "output_tokens": usage["output_tokens"] + 40,
        "total_tokens": usage["total_tokens"] + 740,
    }
    assert RESPONSES_RECALL.usage(answer) == Usage(1_000, usage["output_tokens"])
    assert answer["usage"] is usage and usage["input_tokens"] == 1_000


# --- one round -------------------------------------------------------------------


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
def test_a_text_answer_is_relayed_event_by_event_in_the_upstreams_own_bytes(crlf: bool) -> None:
    events = stream_of(answer_of([reasoning("a"), message(1, "All tests pass.")]), crlf)
    reader = RESPONSES_RECALL.stream()
    assert [reader.feed(event) for event in events] == events
    assert reader.end() == b"" and not reader.recalled and reader.dropped == 0


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
def test_a_text_answer_cut_at_any_byte_is_relayed_whole_and_unchanged(crlf: bool) -> None:
    events = stream_of(answer_of([message(1, "Ok.")]), crlf)
    whole = b"".join(events)
    ends = [sum(len(e) for e in events[: n + 1]) for n in range(len(events))]
    for cut in range(len(whole) + 1):
        reader = RESPONSES_RECALL.stream()
        first = reader.feed(whole[:cut])
        # Every event wholly in the first chunk, at once, and no part of the next
        # (a last "\r" is not the end of a line before the next byte tells).
        assert first == whole[: max((end for end in ends if end <= cut), default=0)]
        assert first + reader.feed(whole[cut:]) + reader.end() == whole


def test_a_recall_call_is_hidden_and_the_round_is_read_as_its_completed_response() -> None:
    answer = answer_of([recall("r")])
    relayed = events_in(feed_all(reader := RESPONSES_RECALL.stream(), stream_of(answer)))
    assert [e["type"] for e in relayed] == ["response.created", "response.in_progress"]
    assert reader.recalled and reader.dropped == 0
    assert reader.answer() == answer
    assert RESPONSES_RECALL.calls(reader.answer()) == [
        RecallCall("call_r", '{"ref":"rabcdefghijkl","start_line":1}')
    ]


def test_reasoning_and_text_before_a_recall_call_are_relayed_and_the_rest_is_not() -> None:
    answer = answer_of([reasoning("a"), message(1, "Reading it back."), recall("r")])
    chunks = stream_of(answer)
    reader = RESPONSES_RECALL.stream()
    relayed = feed_all(reader, chunks)
    # The events up to the recall item's, each as the upstream wrote it; not the
    # recall item's, nor response.completed (which names the recall item too).
    shown = [c for c in chunks if b"fc_r" not in c]
    assert relayed == b"".join(shown)
    assert b"response.completed" not in relayed
    assert reader.recalled
    assert reader.answer()["output"] == answer["output"]


def test_a_stream_cut_at_any_byte_relays_and_reads_the_same() -> None:
    chunks = stream_of(answer_of([message(1, "Hm."), recall("r")]))
    whole = b"".join(chunks)
    reader = RESPONSES_RECALL.stream()
    expected = feed_all(reader, chunks)
    for cut in range(len(whole) + 1):
        reader = RESPONSES_RECALL.stream()
        assert feed_all(reader, [whole[:cut], whole[cut:]]) == expected
        assert reader.recalled


def test_a_recall_call_after_a_relayed_client_call_is_dropped_and_the_indices_close_up() -> None:
    output = [reasoning("a"), shell("s"), recall("r"), message(3, "Then the tests.")]
    relayed = events_in(feed_all(reader := RESPONSES_RECALL.stream(), stream_of(answer_of(output))))
    assert not reader.recalled and reader.dropped == 1
    assert all(RECALL_TOOL_NAME not in orjson.dumps(e).decode() for e in relayed)
    indices = [e["output_index"] for e in relayed if e["type"] == "response.output_item.added"]
    assert indices == [0, 1, 2]
    text = [e for e in relayed if e["type"] == "response.output_text.delta"]
    assert [e["output_index"] for e in text] == [2]
    assert [e["sequence_number"] for e in relayed] == list(range(len(relayed)))
    assert relayed[-1]["type"] == "response.completed"
    assert relayed[-1]["response"]["output"] == [output[0], output[1], output[3]]


def test_events_of_a_recall_item_named_only_by_item_id_are_hidden_too() -> None:
    output = [shell("s"), recall("r")]
    events = _events(answer_of(output))
    for event in events:
        if event.get("item_id") == "fc_r":
            del event["output_index"]
    relayed = feed_all(reader := RESPONSES_RECALL.stream(), frames(events))
    assert reader.dropped == 1 and b"fc_r" not in relayed


def test_a_round_that_ends_incomplete_is_read_from_the_items_it_finished() -> None:
    answer = answer_of([reasoning("a"), recall("r")])
    events = _events(answer)
    incomplete = {**answer, "status": "incomplete", "output": []}
    events[-1] = {"type": "response.incomplete", "response": incomplete}
    reader = RESPONSES_RECALL.stream()
    feed_all(reader, frames(events))
    assert reader.recalled
    read_back = reader.answer()
    assert read_back["status"] == "incomplete"
    assert read_back["output"] == answer["output"]


def test_a_partial_event_held_at_the_end_of_the_round_is_given_back() -> None:
    chunks = stream_of(answer_of([message(1, "Cut.")]))
    whole = b"".join(chunks)
    reader = RESPONSES_RECALL.stream()
    relayed = reader.feed(whole[:-5])
    assert relayed == b"".join(chunks[:-1])
    assert relayed + reader.end() == whole[:-5]


# --- rounds ----------------------------------------------------------------------


def test_the_next_round_continues_the_clients_one_stream() -> None:
    first = answer_of([reasoning("a"), message(1, "Reading back."), recall("r")], prompt=1_000)
    second = answer_of([reasoning("b"), message(2, "The test now passes.")], prompt=1_300)
    reader = RESPONSES_RECALL.stream()
    relayed = feed_all(reader, stream_of(first))
    assert reader.recalled
    reader.next_round()
    # A background request is queued first: that too is the start of a stream.
    queued = {"type": "response.queued", "response": {**second, "status": "queued"}}
    relayed += feed_all(reader, frames([queued, *_events(second)]))
    assert not reader.recalled

    events = events_in(relayed)
    types = [e["type"] for e in events]
    assert types.count("response.created") == 1 and types.count("response.in_progress") == 1
    assert "response.queued" not in types
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["id"]) for e in added] == [
        (0, "rs_a"),
        (1, "msg_0001"),
        (2, "rs_b"),
        (3, "msg_0002"),
    ]
    deltas = [e["output_index"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == [1, 3]
    completed = events[-1]
    assert types.count("response.completed") == 1 and completed["type"] == "response.completed"
    response = completed["response"]
    assert response["output"] == [*first["output"][:2], *second["output"]]
    # The client's SDK holds every lifecycle event to the id it read first.
    assert response["id"] == first["id"] == events[0]["response"]["id"] != second["id"]
    assert response["usage"] == {
        **second["usage"],
        "input_tokens": 2_300,
        "output_tokens": first["usage"]["output_tokens"] + second["usage"]["output_tokens"],
        "total_tokens": first["usage"]["total_tokens"] + second["usage"]["total_tokens"],
    }


def test_a_third_round_starts_after_everything_relayed_before_it() -> None:
    rounds = [
        answer_of([recall("r1")]),
        answer_of([message(2, "One more."), recall("r2")]),
        answer_of([shell("s")]),
    ]
    reader = RESPONSES_RECALL.stream()
    relayed = b""
    for number, answer in enumerate(rounds):
        if number:
            reader.next_round()
        relayed += feed_all(reader, stream_of(answer))
    events = events_in(relayed)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [(e["output_index"], e["item"]["id"]) for e in events if "item" in e]
    assert added == [(0, "msg_0002"), (0, "msg_0002"), (1, "fc_s"), (1, "fc_s")]
    response = events[-1]["response"]
    assert [item["id"] for item in response["output"]] == ["msg_0002", "fc_s"]
    prompts = sum(answer["usage"]["input_tokens"] for answer in rounds)
    assert response["usage"]["input_tokens"] == prompts


def _two_rounds(cuts: list[int] | None) -> bytes:
    """The client's stream over a dropped-free recall and its answer, each round's
    bytes cut at ``cuts`` (``None``: fed event by event)."""
    first = answer_of([reasoning("a"), message(1, "Reading back."), recall("r")])
    second = answer_of([message(2, "Done."), shell("s"), recall("late")])
    reader = RESPONSES_RECALL.stream()
    relayed = b""
    for number, answer in enumerate((first, second)):
        if number:
            reader.next_round()
        events = stream_of(answer, crlf=number == 1)
        if cuts is None:
            chunks = events
        else:
            whole = b"".join(events)
            at = sorted({cut % (len(whole) + 1) for cut in cuts})
            chunks = [whole[a:b] for a, b in zip([0, *at], [*at, len(whole)], strict=True)]
        relayed += feed_all(reader, chunks)
    assert reader.dropped == 1
    return relayed


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=12))
def test_rounds_cut_into_any_chunks_relay_the_same_stream(cuts: list[int]) -> None:
    assert _two_rounds(cuts) == _two_rounds(None)


# --- bounds ----------------------------------------------------------------------


def test_a_round_past_what_is_kept_of_it_drops_a_later_recall_call() -> None:
    output = [reasoning("a"), message(1, "Reading it back."), recall("r")]
    chunks = stream_of(answer_of(output))
    before = chunks[: next(i for i, c in enumerate(chunks) if b"fc_r" in c)]
    # What the round keeps: its response and its finished items; the message's
    # item.done is one byte too many.
    kept = [c for c in before if b'"response.output_item.added"' not in c and b"delta" not in c]
    kept = [c for c in kept if b"content_part" not in c and b"output_text.done" not in c]
    reader = ResponsesRecallStream(max_kept_bytes=len(b"".join(kept)) - 1)

    relayed = events_in(feed_all(reader, chunks))

    assert not reader.recalled and reader.dropped == 1
    assert all(RECALL_TOOL_NAME not in orjson.dumps(e).decode() for e in relayed)
    assert [e["sequence_number"] for e in relayed] == list(range(len(relayed)))
    assert relayed[-1]["type"] == "response.completed"
    assert relayed[-1]["response"]["output"] == output[:2]


def test_a_round_within_what_is_kept_of_it_recalls() -> None:
    output = [reasoning("a"), message(1, "Reading it back."), recall("r")]
    chunks = stream_of(answer_of(output))
    reader = ResponsesRecallStream(max_kept_bytes=len(b"".join(chunks)))
    feed_all(reader, chunks)
    assert reader.recalled and reader.answer()["output"] == output


def test_events_too_long_to_hold_go_out_in_pieces_and_their_round_cannot_recall() -> None:
    output = [message(0, "x" * 4000), recall("r")]
    chunks = stream_of(answer_of(output))
    reader = ResponsesRecallStream(max_event_bytes=3000)

    relayed = b"".join(reader.feed(c[i : i + 700]) for c in chunks for i in range(0, len(c), 700))
    relayed += reader.end()

    assert not reader.recalled and reader.dropped == 1
    shown = [c for c in chunks if b"fc_r" not in c]
    # Every event of the message as the upstream wrote it (some in pieces); the
    # recall item's events left out, and the numbers closed up behind them.
    assert relayed.startswith(b"".join(shown))
    numbers = [e["sequence_number"] for e in events_in(relayed)[:-1]]
    assert numbers == list(range(len(shown)))


def test_an_event_too_long_to_hold_in_a_recalled_round_stays_hidden_and_the_call_is_kept() -> None:
    output = [message(0, "Reading."), recall("r"), message(2, "y" * 4000)]
    chunks = stream_of(answer_of(output))
    reader = ResponsesRecallStream(max_event_bytes=3000)

    relayed = b"".join(reader.feed(c[i : i + 700]) for c in chunks for i in range(0, len(c), 700))
    relayed += reader.end()

    assert reader.recalled and b"yyy" not in relayed
    assert RESPONSES_RECALL.calls(reader.answer()) == [
        RecallCall("call_r", '{"ref":"rabcdefghijkl","start_line":1}')
    ]
