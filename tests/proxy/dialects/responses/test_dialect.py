"""proxy.dialects.responses: OpenAI Responses requests through the engine and back."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from compaction import (
    SUMMARY_MARKER,
    CannotFitError,
    Profile,
    SummarizationError,
    TokenCounter,
    compact,
    group_messages,
    head_end,
)
from proxy.dialects.base import ORIGIN, Dialect, clean
from proxy.dialects.responses import CODEX_COMPACTION_PROMPT, RESPONSES
from proxy.edge.errors import BadRequest
from tests.proxy.dialects.responses.shapes import (
    chat_to_responses,
    codex_request,
    synthetic_request,
)
from tests.proxy.dialects.responses.upstream import (
    OVERFLOW_MESSAGE,
    ResponsesUpstream,
    pairing_errors,
    reasoning_of,
)
from tests.proxy.servers import serve_in_thread
from tests.synthetic import conversations

COUNTER = TokenCounter("gpt-4o")
FIXTURES = Path(__file__).resolve().parents[5] / "shared" / "fixtures"
CORPUS = [
    path
    for path in (sorted(FIXTURES.glob("*/*.json")) if FIXTURES.is_dir() else [])
    if isinstance(orjson.loads(path.read_bytes()), dict)
]


def test_the_singleton_is_a_dialect() -> None:
    dialect: Dialect = RESPONSES
    assert (dialect.name, dialect.path) == ("responses", "/responses")


# --- the way there and back ----------------------------------------------------


@pytest.mark.parametrize("body", [codex_request(), synthetic_request()], ids=["codex", "synthetic"])
def test_unchanged_messages_give_back_the_same_body(body: dict[str, Any]) -> None:
    mapped = RESPONSES.to_engine(body)
    assert RESPONSES.from_engine(body, mapped, mapped.messages) is body
    # Equal copies (a checkpoint read back from a store) forward the same items too.
    copies = orjson.loads(orjson.dumps(mapped.messages))
    assert RESPONSES.from_engine(body, mapped, copies) is body


def test_a_model_turn_is_one_assistant_message_with_its_calls() -> None:
    body = codex_request(turns=2)
    mapped = RESPONSES.to_engine(body)
    roles = [m["role"] for m in mapped.messages]
    # instructions, developer, 2 users, then (reasoning + call) → assistant and the output → tool
    assert roles == ["system", "system", "user", "user", "assistant", "tool", "assistant", "tool"]
    turn = mapped.messages[4]
    assert [c["id"] for c in turn["tool_calls"]] == [body["input"][4]["call_id"]]
    assert turn["content"][0]["type"] == "reasoning"
    assert "Inspecting" in turn["content"][0]["summary"]
    assert all(ORIGIN in m for m in mapped.messages)


def test_a_string_input_is_one_turn_and_comes_back_as_the_string() -> None:
    body = {"model": "gpt-5", "instructions": "Be brief.", "input": "Hello"}
    mapped = RESPONSES.to_engine(body)
    assert [clean(m) for m in mapped.messages] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
    ]
    assert RESPONSES.from_engine(body, mapped, mapped.messages) is body


def test_requested_output_tools_and_format_are_counted() -> None:
    body = {
        **codex_request(turns=1),
        "max_output_tokens": 1234,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    }
    request = RESPONSES.to_engine(body).request
    assert request["max_tokens"] == 1234
    assert request["tools"] is body["tools"]
    assert request["response_format"] is body["text"]["format"]
    assert request["model"] == "gpt-5-codex"


def _engine_message(mapped: Any, item: Any) -> tuple[int, dict[str, Any]]:
    for index, message in enumerate(mapped.messages):
        origin = message[ORIGIN].rpartition(":")[0]
        found = mapped.items[origin]
        if found is item or (isinstance(found, list) and any(i is item for i in found)):
            return index, message
    raise AssertionError("item not mapped")


def test_a_pruned_output_replaces_only_the_output() -> None:
    body = codex_request(turns=3)
    mapped = RESPONSES.to_engine(body)
    item = body["input"][5]
    assert item["type"] == "function_call_output"
    index, message = _engine_message(mapped, item)
    messages = list(mapped.messages)
    messages[index] = {**message, "content": "[shell] (4,000 chars)"}
    out = RESPONSES.from_engine(body, mapped, messages)["input"]
    assert out[5] == {**item, "output": "[shell] (4,000 chars)"}
    assert all(a is b for i, (a, b) in enumerate(zip(out, body["input"], strict=True)) if i != 5)


def test_shortened_arguments_are_taken_only_when_still_json() -> None:
    body = codex_request(turns=1)
    mapped = RESPONSES.to_engine(body)
    call = body["input"][4]
    index, message = _engine_message(mapped, call)

    def with_arguments(arguments: str) -> dict[str, Any]:
        function = {**message["tool_calls"][0]["function"], "arguments": arguments}
        turn = {**message, "tool_calls": [{**message["tool_calls"][0], "function": function}]}
        messages = list(mapped.messages)
        messages[index] = turn
        return RESPONSES.from_engine(body, mapped, messages)

    assert with_arguments('{"command": ["ba…"]}')["input"][4] == {
        **call,
        "arguments": '{"command": ["ba…"]}',
    }
    # Cut text is not JSON: the call keeps its own arguments, its reasoning stays before it.
    out = with_arguments('{"command": ["bash", "-l… [40 chars cut]')["input"]
    assert out[4] is call and out[3] is body["input"][3]


def test_cut_assistant_text_replaces_the_output_text() -> None:
    body = codex_request(turns=9)
    mapped = RESPONSES.to_engine(body)
    position, item = next(
        (i, x) for i, x in enumerate(body["input"]) if x.get("role") == "assistant"
    )
    index, message = _engine_message(mapped, item)
    parts = list(message["content"])
    at = next(i for i, p in enumerate(parts) if p.get("type") == "output_text")
    parts[at] = {**parts[at], "text": "Progress … [cut]"}
    messages = list(mapped.messages)
    messages[index] = {**message, "content": parts}
    out = RESPONSES.from_engine(body, mapped, messages)["input"]
    assert out[position]["content"] == [{**item["content"][0], "text": "Progress … [cut]"}]
    assert out[position - 1] is body["input"][position - 1]  # the output before it
    assert out[position - 3] is body["input"][position - 3]  # the turn's reasoning


def test_the_summary_is_a_user_message_item() -> None:
    body = codex_request(turns=2)
    mapped = RESPONSES.to_engine(body)
    summary = {"role": "user", "content": f"{SUMMARY_MARKER}\nSummary of 4 earlier messages."}
    messages = [*mapped.messages[:3], summary, *mapped.messages[6:]]
    out = RESPONSES.from_engine(body, mapped, messages)["input"]
    assert out[2] == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": summary["content"]}],
    }
    assert out[3:] == body["input"][6:] and out[3] is body["input"][6]


def test_a_placeholder_result_becomes_an_output_of_the_calls_kind() -> None:
    body = codex_request(turns=5)  # step 4 is a custom_tool_call
    mapped = RESPONSES.to_engine(body)
    custom = next(i for i in body["input"] if i.get("type") == "custom_tool_call")
    index, _ = _engine_message(mapped, custom)
    placeholder = {"role": "tool", "tool_call_id": custom["call_id"], "content": "[none]"}
    messages = [*mapped.messages[: index + 1], placeholder]
    out = RESPONSES.from_engine(body, mapped, messages)["input"]
    assert out[-1] == {
        "type": "custom_tool_call_output",
        "call_id": custom["call_id"],
        "output": "[none]",
    }


def test_a_call_with_no_output_after_it_is_not_a_tool_call_for_the_engine() -> None:
    # The engine would invent an output for it; the API's own error is kept instead.
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call_output", "call_id": "c1", "output": "early"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"role": "user", "content": "and?"},
    ]
    mapped = RESPONSES.to_engine({"model": "gpt-5", "input": items})
    assert "tool_calls" not in mapped.messages[2]
    assert [m["role"] for m in mapped.messages] == ["user", "user", "assistant", "user"]


_IMAGE = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}],
}


def _parallel_turn(output_chars: int = 6_000, between: Any = _IMAGE) -> list[dict[str, Any]]:
    """Two parallel calls whose outputs have ``between`` between them, as Codex
    sent a view_image call's image right after that call's output."""
    text = "\n".join(f"{i}: " + "output text " * 5 for i in range(output_chars // 70))
    return [
        {"type": "reasoning", "id": "rs_p", "summary": [], "encrypted_content": "gAAAAB" * 20},
        {"type": "function_call", "call_id": "call_img", "name": "view_image", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_sh", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_img", "output": "attached " + text},
        between,
        {"type": "function_call_output", "call_id": "call_sh", "output": text},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok"}],
        },
    ]


def test_a_message_between_the_outputs_of_parallel_calls_stays_in_their_group() -> None:
    body = codex_request(turns=6)
    body["input"] = [*body["input"], *_parallel_turn()]
    mapped = RESPONSES.to_engine(body)
    groups = group_messages(mapped.messages)
    turn = next(g for g in groups if len(mapped.messages[g.start].get("tool_calls", ())) == 2)
    assert [m["role"] for m in mapped.messages[turn.start : turn.end]] == [
        "assistant",
        "tool",
        "user",
        "tool",
    ]


_DEVELOPER = {"type": "message", "role": "developer", "content": "Look at the image first."}


@pytest.mark.parametrize("between", [_IMAGE, _DEVELOPER], ids=["user", "developer"])
@pytest.mark.parametrize("window", [8_192, 12_000, 16_384, 32_768])
@pytest.mark.parametrize("reason", ["threshold", "overflow", "manual"])
def test_a_compaction_never_forwards_an_output_without_its_call(
    window: int, reason: str, between: dict[str, Any]
) -> None:
    body = codex_request(turns=6)
    body["input"] = [*body["input"], *_parallel_turn(between=between)]
    done = _compacted(body, window, reason)
    assert done is not None
    out, result = done
    assert pairing_errors(out["input"]) == [], result.notes
    if between is _DEVELOPER:  # an instruction: forwarded wherever its group went
        assert sum(item is between for item in out["input"]) == 1
    assert_invariants(body, window, reason)


# --- untouchable and refused ---------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        (
            {"input": [{"role": "user", "content": "hi"}, {"type": "compaction_trigger"}]},
            "compaction_trigger",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    _codex := {
                        "type": "message",
                        "role": "user",
                        "content": [
                            {
                                "type": "input_text",
                                "text": CODEX_COMPACTION_PROMPT + " Create a handoff summary",
                            }
                        ],
                    },
                ]
            },
            "Codex",
        ),
        ({"input": CODEX_COMPACTION_PROMPT + "\n\nInclude:"}, "Codex"),
    ],
)
def test_server_state_and_the_clients_own_compaction_are_untouchable(
    extra: dict[str, Any], reason: str
) -> None:
    found = RESPONSES.untouchable({**codex_request(turns=1), **extra})
    assert found is not None and reason in found


def test_a_usual_request_may_be_compacted() -> None:
    assert RESPONSES.untouchable(codex_request(turns=3)) is None
    assert (
        RESPONSES.untouchable({"model": "m", "input": "hi", "previous_response_id": None}) is None
    )


@pytest.mark.parametrize(
    "body",
    [{"input": 3}, {"input": [1]}, {"input": "x", "instructions": ["a"]}],
)
def test_a_body_with_no_readable_conversation_is_refused(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        RESPONSES.check(body)


def test_a_readable_body_passes_the_check() -> None:
    RESPONSES.check(codex_request(turns=1))
    RESPONSES.check({"model": "m", "input": "hi"})


# --- the engine's invariants, on the rebuilt request -------------------------------


def _compacted(
    body: dict[str, Any], window: int, reason: Any = "threshold"
) -> tuple[dict[str, Any], Any] | None:
    mapped = RESPONSES.to_engine(body)
    profile = Profile(context_window=window, summarizer="extractive")
    try:
        result = asyncio.run(compact(mapped.request, profile, reason=reason, counter=COUNTER))
    except CannotFitError:
        return None
    return RESPONSES.from_engine(body, mapped, result.messages), result


def assert_invariants(body: dict[str, Any], window: int, reason: Any = "threshold") -> None:
    snapshot = copy.deepcopy(body)
    mapped = RESPONSES.to_engine(body)
    done = _compacted(body, window, reason)
    assert body == snapshot, "the request was mutated"
    if done is None:
        return
    out, result = done
    items, rebuilt = body.get("input"), out.get("input")
    # Fields the proxy does not own are the client's own objects.
    assert {k: v for k, v in out.items() if k != "input"} == {
        k: v for k, v in body.items() if k != "input"
    }
    assert all(out[k] is body[k] for k in body if k != "input")
    if not isinstance(items, list):
        assert out is body
        return
    # No pairing problem the client did not send (the engine repairs those it did).
    required = reasoning_of(items)
    assert set(pairing_errors(rebuilt, required)) <= set(pairing_errors(items, required))
    # The head: instructions (a field) and the items of the engine's head, the same objects.
    head = head_end(mapped.messages, group_messages(mapped.messages), 2)
    head_items = _items_of(mapped, mapped.messages[:head])
    assert all(a is b for a, b in zip(rebuilt, head_items, strict=False))
    # The newest item is forwarded as it was unless the newest group had to be cut.
    if items and result.stage != "truncated":
        assert rebuilt[-1] is items[-1]
    # Every reasoning item that is forwarded is the client's, byte for byte.
    originals = {id(i) for i in items}
    for item in rebuilt:
        if item.get("type") in ("reasoning", "compaction"):
            assert id(item) in originals
    # The request as the upstream will see it fits the limit.
    again = RESPONSES.to_engine(out).request
    sent = {**again, "messages": [clean(m) for m in again["messages"]]}
    assert COUNTER.count_request(sent) <= result.input_limit, result.notes


def _items_of(mapped: Any, messages: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for message in messages:
        item = mapped.items[message[ORIGIN].rpartition(":")[0]]
        if isinstance(item, list):
            out.extend(item)
        elif isinstance(item, dict) and (not out or out[-1] is not item):
            out.append(item)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=conversations(),
    window=st.sampled_from([8_192, 16_384, 32_768]),
    reasoning=st.booleans(),
    reason=st.sampled_from(["threshold", "overflow", "manual"]),
)
def test_invariants_hold_on_random_conversations(
    messages: list[dict[str, Any]], window: int, reasoning: bool, reason: str
) -> None:
    body = chat_to_responses({"model": "gpt-4o", "messages": messages}, reasoning=reasoning)
    assert_invariants(body, window, reason)


@pytest.mark.parametrize("window", [8_192, 16_384, 32_768])
def test_invariants_hold_on_a_codex_session(window: int) -> None:
    assert_invariants(codex_request(turns=40), window)
    assert_invariants(codex_request(turns=40), window, "overflow")


@pytest.mark.corpus
@pytest.mark.skipif(not CORPUS, reason=f"no fixtures at {FIXTURES}")
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_invariants_hold_on_the_corpus(path: Path) -> None:
    body = chat_to_responses(orjson.loads(path.read_bytes()))
    for window in (8_192, 16_384, 32_768):
        assert_invariants(body, window)


def test_a_compacted_codex_session_keeps_every_field_and_its_newest_turn() -> None:
    body = codex_request(turns=40)
    done = _compacted(body, 16_384)
    assert done is not None
    out, result = done
    assert result.stage == "condensed"
    items, rebuilt = body["input"], out["input"]
    assert len(rebuilt) < len(items)
    # The engine's head: instructions, the leading developer message, and Codex's
    # environment message with the task typed after it (the head runs through a
    # client's own context to the first message a person typed).
    assert all(a is b for a, b in zip(rebuilt[:3], items[:3], strict=True))
    summary = rebuilt[3]
    assert summary["type"] == "message" and summary["role"] == "user"
    assert summary["content"][0]["text"].startswith(SUMMARY_MARKER)
    # After the last item the proxy wrote (a summary), the client's newest items, verbatim.
    originals = {id(i) for i in items}
    tail = len(rebuilt) - 1 - max(n for n, i in enumerate(rebuilt) if id(i) not in originals)
    assert tail > 0
    assert all(a is b for a, b in zip(rebuilt[-tail:], items[-tail:], strict=True))
    kept = [i for i in rebuilt if i.get("type") == "reasoning"]
    assert kept and all(any(k is i for i in items) for k in kept)
    assert pairing_errors(rebuilt, reasoning_of(items)) == []


# --- the summarizer's request and the manual answer --------------------------------


def test_the_summary_request_is_a_plain_non_streamed_response_request() -> None:
    messages = [
        {"role": "system", "content": "You summarize.", ORIGIN: "x:0"},
        {"role": "user", "content": "<conversation>…</conversation>"},
    ]
    assert RESPONSES.summary_request("gpt-5", messages, 900) == {
        "model": "gpt-5",
        "instructions": "You summarize.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "<conversation>…</conversation>"}],
            }
        ],
        "max_output_tokens": 900,
        "store": False,
        "stream": False,
    }


def test_the_summary_text_is_read_from_the_output_messages() -> None:
    reply = RESPONSES.manual_reply("gpt-5", "## Goal\nx")
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    assert (
        RESPONSES.summary_text({**reply, "output": [reasoning, *reply["output"]]}) == "## Goal\nx"
    )
    assert RESPONSES.summary_text({"output": [], "output_text": " y "}) == "y"


@pytest.mark.parametrize(
    "reply",
    [
        None,
        {"output": []},
        {"output": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]},
        {"output": [{"type": "message", "content": [{"type": "output_text", "text": "  "}]}]},
        {"error": {"message": "boom"}},
    ],
)
def test_a_reply_with_no_summary_text_is_a_summarization_error(reply: Any) -> None:
    with pytest.raises(SummarizationError):
        RESPONSES.summary_text(reply)


def test_the_manual_reply_is_a_response_the_sdk_reads() -> None:
    reply = RESPONSES.manual_reply("gpt-5", "Context compacted.")
    parsed = Response.model_validate(reply)
    assert parsed.output_text == "Context compacted."
    assert parsed.status == "completed" and parsed.id.startswith("resp_")


def test_the_manual_events_are_the_apis_typed_sequence() -> None:
    frames = b"".join(RESPONSES.manual_events("gpt-5", "Context compacted.")).split(b"\n\n")
    assert frames[-1] == b""
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    events = []
    for frame in frames[:-1]:
        name, data = frame.split(b"\n")
        event = adapter.validate_json(data.removeprefix(b"data: "))
        assert name == b"event: " + event.type.encode()
        events.append(event)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(9))
    assert events[-1].response.output_text == "Context compacted."


# --- the scripted upstream -----------------------------------------------------------


def test_the_pairing_rules_use_the_apis_wording() -> None:
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    user = {"role": "user", "content": "next"}
    assert pairing_errors([reasoning, call, output]) == []
    assert pairing_errors([output]) == [
        "No tool call found for function call output with call_id c1."
    ]
    assert pairing_errors([call, user]) == ["No tool output found for function call c1."]
    assert pairing_errors([call, user, output]) == []  # Codex's view_image image sat there
    assert pairing_errors([call, output], {"fc_1": "rs_1"}) == [
        "Item 'fc_1' of type 'function_call' was provided without its required 'reasoning' "
        "item: 'rs_1'."
    ]
    assert reasoning_of([reasoning, call, output]) == {"fc_1": "rs_1"}


def test_the_upstream_runs_an_sdk_loop_and_refuses_an_overflow() -> None:
    upstream = ResponsesUpstream(tool_turns=2)
    with (
        serve_in_thread(upstream.app()) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client,
    ):
        items: list[Any] = [{"role": "user", "content": "read the parts"}]
        tools: Any = [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]
        for _ in range(3):
            response = client.responses.create(model="gpt-5", input=items, tools=tools, store=False)
            items += [o.model_dump(exclude_none=True) for o in response.output]
            calls = [o for o in response.output if o.type == "function_call"]
            if not calls:
                break
            items += [
                {"type": "function_call_output", "call_id": c.call_id, "output": "x" * 50}
                for c in calls
            ]
        assert response.output_text == "Done after 2 tool calls."
        with client.responses.stream(model="gpt-5", input=items[:4], tools=tools) as stream:
            final = stream.get_final_response()
        assert [o.type for o in final.output] == ["reasoning", "function_call"]
        # Dropping a reasoning item its call was produced with is refused.
        with pytest.raises(openai.BadRequestError, match="required 'reasoning' item"):
            client.responses.create(model="gpt-5", input=[items[0], *items[2:]], tools=tools)
        upstream.window = 10
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="gpt-5", input=items, tools=tools)
        assert refused.value.code == "context_length_exceeded"
        assert OVERFLOW_MESSAGE in str(refused.value)
        summary = client.responses.create(model="gpt-5", input="<conversation>cat part0.txt")
        assert "cat part0.txt" in summary.output_text
    assert len(upstream.summary_requests) == 1
