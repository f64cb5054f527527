"""The Anthropic Messages dialect: the mapping both ways, the engine's invariants
on Anthropic requests (random, Claude Code-shaped and the real corpus
converted), and the wire shapes checked against the ``anthropic`` SDK."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
from anthropic.types import Message as SdkMessage
from hypothesis import HealthCheck, given, settings

from compaction import (
    CannotFitError,
    Profile,
    SummarizationError,
    TokenCounter,
    calibrated_budget,
    compact,
    decide,
    execute,
    new_checkpoint,
    read_conversation,
)
from compaction.chat.own import SUMMARY_MARKER
from proxy.dialects.anthropic import ANTHROPIC, UNCUT, pairing_problems
from proxy.dialects.base import Dialect, clean
from proxy.edge.errors import BadRequest
from tests.proxy.dialects.anthropic.sessions import (
    CACHE,
    SEEDS,
    claude_code_request,
    from_chat,
    random_request,
    thinking_block,
)
from tests.proxy.dialects.anthropic.upstream import AnthropicUpstream
from tests.proxy.servers import serve_in_thread

FIXTURES = Path(__file__).resolve().parents[5] / "shared" / "fixtures"
CORPUS = [
    path
    for path in (sorted(FIXTURES.glob("*/*.json")) if FIXTURES.is_dir() else [])
    if isinstance(orjson.loads(path.read_bytes()), dict)
]
WINDOWS = (8_192, 16_384, 32_768)
COUNTER = TokenCounter("gpt-4o")
SCRIPTED = AnthropicUpstream()


#: A plan free to fill up to prune_target (no slack, no working-set bound):
#: the tests of what pruning keeps need a request that pruning alone fits.
PRUNING: dict[str, Any] = {"plan_slack": 10, "plan_working_set": 0}


def _compact(body: dict[str, Any], window: int, **profile: Any) -> tuple[Any, dict[str, Any]]:
    mapped = ANTHROPIC.to_engine(body)
    result = asyncio.run(
        compact(
            mapped.request,
            Profile(context_window=window, summarizer="extractive", **profile),
            counter=COUNTER,
        )
    )
    return result, ANTHROPIC.from_engine(body, mapped, result.messages)


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _blocks(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [
        block
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == kind
    ]


# --- the contract ----------------------------------------------------------------


def test_it_is_a_dialect() -> None:
    dialect: Dialect = ANTHROPIC
    assert (dialect.name, dialect.path) == ("anthropic", "/messages")


def test_check_refuses_a_body_with_no_conversation() -> None:
    for body in (
        {"model": "m"},
        {"messages": "hi"},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": "x"}], "system": 3},
    ):
        with pytest.raises(BadRequest):
            ANTHROPIC.check(body)
    ANTHROPIC.check(claude_code_request(3))


# --- round trip ------------------------------------------------------------------


def _assert_round_trip(body: dict[str, Any]) -> None:
    before = copy.deepcopy(body)
    mapped = ANTHROPIC.to_engine(body)
    out = ANTHROPIC.from_engine(body, mapped, mapped.messages)
    assert out == body == before  # and the input was not mutated
    assert _same(out["messages"], body["messages"])
    assert all(out[k] is body[k] for k in body if k != "messages")


def test_round_trip_of_a_claude_code_request_forwards_the_same_objects() -> None:
    _assert_round_trip(claude_code_request(40))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SEEDS)
def test_round_trip_of_random_conversations(seed: int) -> None:
    _assert_round_trip(random_request(seed))


@pytest.mark.corpus
def test_round_trip_of_the_corpus() -> None:
    if not CORPUS:
        pytest.skip(f"no fixtures at {FIXTURES} (standalone clone)")
    for path in CORPUS:
        body = from_chat(orjson.loads(path.read_bytes()), thinking=True)
        assert pairing_problems(body["messages"]) == [], path
        _assert_round_trip(body)


def test_the_engine_sees_the_shape_of_each_item() -> None:
    body = claude_code_request(2)
    body["messages"][1]["content"].insert(0, {"type": "redacted_thinking", "data": "EmwKAhgBEgyZ"})
    body["messages"][2]["content"].append(
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iV"}}
    )
    mapped = ANTHROPIC.to_engine(body)
    roles = [m["role"] for m in mapped.messages]
    system, _, assistant, result = mapped.messages[:4]
    assert roles[:4] == ["system", "user", "assistant", "tool"]
    assert system["content"][1]["text"] == body["system"][1]["text"]
    call = assistant["tool_calls"][0]
    tool_use = body["messages"][1]["content"][-1]
    assert (
        call["id"] == tool_use["id"]
        and orjson.loads(call["function"]["arguments"]) == (tool_use["input"])
    )
    # Thinking is counted through UNCUT, never offered to the engine to cut.
    assert body["messages"][1]["content"][1]["thinking"] in assistant[UNCUT]
    assert all(p["type"] == "text" for p in assistant["content"])
    assert result["tool_call_id"] == tool_use["id"]
    # The result's other blocks (the image) are a user message after it, as chat
    # would send them: the pruner never briefs them with the result.
    beside = mapped.messages[4]
    assert beside["role"] == "user" and beside["content"][-1] == {"type": "image"}
    assert "tool_call_id" not in beside
    assert [m["role"] for m in mapped.messages[5:7]] == ["assistant", "tool"]
    assert mapped.request["max_tokens"] == 64_000 and mapped.request["tools"] is body["tools"]


# --- rebuilding changed items --------------------------------------------------------


def test_a_pruned_session_keeps_signed_blocks_markers_and_flags() -> None:
    body = claude_code_request(30, output_chars=6_000)
    body["max_tokens"] = 4_096
    # A long text and long arguments in an old assistant message.
    old = body["messages"][3]["content"]
    old.insert(1, {"type": "text", "text": "word " * 2_000, "cache_control": CACHE})
    old[-1]["input"] = {"path": "src/app.py", "content": "y" * 5_000}
    result, out = _compact(body, 200_000, threshold=18_000, keep_recent_tokens=2_000, **PRUNING)
    assert result.stage == "pruned"
    assert pairing_problems(out["messages"]) == []
    assert SCRIPTED.refusal(out) is None  # signatures intact
    ids = {id(b) for b in _blocks(body, "thinking")}
    assert all(id(b) in ids for b in _blocks(out, "thinking"))
    # The pruned results keep their id, error flag and markers.
    originals = {b["tool_use_id"]: b for b in _blocks(body, "tool_result")}
    pruned = [b for b in _blocks(out, "tool_result") if b is not originals[b["tool_use_id"]]]
    assert pruned
    for block in pruned:
        original = originals[block["tool_use_id"]]
        assert {k: v for k, v in block.items() if k != "content"} == {
            k: v for k, v in original.items() if k != "content"
        }
        assert len(block["content"]) < len(original["content"])
    rebuilt = next(m for m in out["messages"] if m.get("content") and m["content"][0] is old[0])
    assert rebuilt is not body["messages"][3]
    assert rebuilt["content"][1]["cache_control"] == CACHE
    assert len(rebuilt["content"][1]["text"]) < len(old[1]["text"])
    assert rebuilt["content"][-1]["input"]["path"] == "src/app.py"
    assert len(rebuilt["content"][-1]["input"]["content"]) < 5_000


def test_fields_the_proxy_does_not_own_survive_a_compaction() -> None:
    body = claude_code_request(40, output_chars=8_000)
    # 42k tokens, 64k of output asked for; compacted deep enough to condense.
    result, out = _compact(body, 90_000, prune_target=0.3)
    assert result.stage == "condensed", result.notes
    assert out.keys() == body.keys()
    assert all(out[k] is body[k] for k in body if k != "messages")
    assert out["messages"][0] is body["messages"][0]
    assert _same(out["messages"][-2:], body["messages"][-2:])
    summary = out["messages"][1]
    assert summary["role"] == "user" and summary["content"][0]["text"].startswith(SUMMARY_MARKER)
    assert SCRIPTED.refusal(out) is None


def test_a_result_whose_call_is_gone_becomes_text() -> None:
    body = claude_code_request(2)
    mapped = ANTHROPIC.to_engine(body)
    # An engine output without the first assistant message (never made by the
    # engine, which keeps groups whole): its results must not be orphaned.
    messages = [m for m in mapped.messages if m is not mapped.messages[2]]
    out = ANTHROPIC.from_engine(body, mapped, messages)
    assert pairing_problems(out["messages"]) == []
    text = out["messages"][1]["content"][0]["text"]
    assert text.startswith("[tool result for a tool: ")


def test_a_call_whose_result_is_gone_becomes_text() -> None:
    body = claude_code_request(2)
    mapped = ANTHROPIC.to_engine(body)
    tool_part = next(m for m in mapped.messages if m["role"] == "tool")
    out = ANTHROPIC.from_engine(body, mapped, [m for m in mapped.messages if m is not tool_part])
    assert pairing_problems(out["messages"]) == []
    assistant = out["messages"][1]
    assert assistant["content"][-1]["text"].startswith("[tool call ")
    assert assistant["content"][0] is body["messages"][1]["content"][0]  # thinking untouched


def _with_text_after_results() -> tuple[dict[str, Any], Any, dict[str, Any]]:
    body = claude_code_request(1)
    result = body["messages"][-1]["content"][0]
    result["is_error"] = True
    body["messages"][-1]["content"] = [result, {"type": "text", "text": "Also fix the docs."}]
    body["messages"].append({"role": "assistant", "content": "Sure."})
    body["messages"].append({"role": "user", "content": "Go."})
    mapped = ANTHROPIC.to_engine(body)
    tool = next(m for m in mapped.messages if m["role"] == "tool")
    return body, mapped, tool


def test_in_the_newest_message_the_blocks_beside_results_ride_on_the_last_one() -> None:
    body = claude_code_request(2)
    body["messages"][-1]["content"].append(_PNG)
    mapped = ANTHROPIC.to_engine(body)
    # One tool group, the newest: the engine keeps the results with what is beside them.
    assert mapped.messages[-1]["role"] == "tool"
    assert mapped.messages[-1]["content"][-1] == {"type": "image"}


def test_text_after_results_is_cut_in_place() -> None:
    body, mapped, tool = _with_text_after_results()
    beside = mapped.messages[mapped.messages.index(tool) + 1]
    cut = {**beside, "content": [{"type": "text", "text": "Also…"}]}
    out = ANTHROPIC.from_engine(body, mapped, [cut if m is beside else m for m in mapped.messages])
    rebuilt = out["messages"][2]["content"]
    assert rebuilt[0] is body["messages"][2]["content"][0]
    assert rebuilt[1] == {"type": "text", "text": "Also…"}
    assert pairing_problems(out["messages"]) == []


def test_a_result_condensed_away_leaves_the_text_beside_it() -> None:
    body, mapped, tool = _with_text_after_results()
    call = mapped.messages[mapped.messages.index(tool) - 1]
    summary = {"role": "user", "content": SUMMARY_MARKER + "\nthe summary"}
    kept = [summary if m is call else m for m in mapped.messages if m is not tool]
    out = ANTHROPIC.from_engine(body, mapped, kept)
    assert out["messages"][2]["content"] == [body["messages"][2]["content"][1]]
    assert pairing_problems(out["messages"]) == []


def test_a_brief_of_a_result_leaves_the_blocks_beside_it_as_they_were() -> None:
    body, mapped, tool = _with_text_after_results()
    brief = {**tool, "content": "[Read] src/app.py (3,000 chars)"}
    out = ANTHROPIC.from_engine(body, mapped, [brief if m is tool else m for m in mapped.messages])
    original = body["messages"][2]["content"]
    assert out["messages"][2]["content"] == [
        {**original[0], "content": "[Read] src/app.py (3,000 chars)"},
        original[1],
    ]
    assert out["messages"][2]["content"][1] is original[1]
    assert out["messages"][2]["content"][0]["is_error"] is True


_PDF = {
    "type": "document",
    "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"},
}
_PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iV"}}


def test_the_users_blocks_beside_a_pruned_result_reach_the_upstream() -> None:
    """The user types while a tool runs: their text (with its marker), an image and
    a document sit beside a 50k-character result that the pruner briefs."""
    body = claude_code_request(30, output_chars=6_000)
    body["max_tokens"] = 4_096
    answer = body["messages"][4]["content"]
    call = body["messages"][3]["content"][-1]
    assert answer[0]["tool_use_id"] == call["id"]
    call["name"], call["input"] = "Read", {"path": "m1.py"}
    answer[0]["content"] = "x = 1\n" * 8_485
    beside = [
        {"type": "text", "text": "USER-INSTRUCTION-1", "cache_control": CACHE},
        _PNG,
        _PDF,
        {"type": "text", "text": "<system-reminder>Todo list updated.</system-reminder>"},
    ]
    answer[1:] = beside
    result, out = _compact(body, 200_000, threshold=18_000, keep_recent_tokens=2_000, **PRUNING)
    assert result.stage == "pruned"
    sent = next(m for m in out["messages"] if m["content"][-1] is beside[-1])
    assert sent["content"][0]["content"] == "[Read] m1.py (50,910 chars)"
    assert all(a is b for a, b in zip(sent["content"][1:], beside, strict=True))
    assert len(sent["content"]) == 1 + len(beside)
    assert pairing_problems(out["messages"]) == [] and SCRIPTED.refusal(out) is None


def test_a_marker_inside_a_briefed_result_moves_to_the_brief() -> None:
    body, mapped, tool = _with_text_after_results()
    result = body["messages"][2]["content"][0]
    result["content"] = [{"type": "text", "text": "x" * 900}, {**_PNG, "cache_control": CACHE}]
    mapped = ANTHROPIC.to_engine(body)
    tool = next(m for m in mapped.messages if m["role"] == "tool")
    brief = {**tool, "content": "[Read] src/app.py (900 chars, 1 image)"}
    out = ANTHROPIC.from_engine(body, mapped, [brief if m is tool else m for m in mapped.messages])
    assert out["messages"][2]["content"][0]["content"] == [
        {"type": "text", "text": "[Read] src/app.py (900 chars, 1 image)", "cache_control": CACHE}
    ]


def test_a_marker_on_a_condensed_block_moves_to_the_summary() -> None:
    body = claude_code_request(40, output_chars=8_000)
    marked = body["messages"][6]["content"]
    marked[-1] = {**marked[-1], "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    markers = sum(
        1
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if "cache_control" in b
    )
    result, out = _compact(body, 90_000, prune_target=0.3)  # deep enough to condense
    assert result.stage == "condensed", result.notes
    assert not any(m is body["messages"][6] for m in out["messages"])
    summary = out["messages"][1]["content"][0]
    assert summary["text"].startswith(SUMMARY_MARKER)
    assert summary["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    sent = sum(
        1
        for m in out["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if "cache_control" in b
    )
    assert sent <= markers


def test_a_block_written_as_text_keeps_its_marker() -> None:
    body = claude_code_request(2)
    body["messages"][2]["content"][0]["cache_control"] = CACHE
    mapped = ANTHROPIC.to_engine(body)
    messages = [m for m in mapped.messages if m is not mapped.messages[2]]
    out = ANTHROPIC.from_engine(body, mapped, messages)
    block = out["messages"][1]["content"][0]
    assert block["text"].startswith("[tool result for a tool: ")
    assert block["cache_control"] == CACHE


def test_the_summary_becomes_a_user_message_of_one_text_block() -> None:
    body = claude_code_request(1)
    mapped = ANTHROPIC.to_engine(body)
    summary = {"role": "user", "content": SUMMARY_MARKER + "\nthe summary"}
    out = ANTHROPIC.from_engine(body, mapped, [*mapped.messages[:2], summary, *mapped.messages[2:]])
    assert out["messages"][1] == {
        "role": "user",
        "content": [{"type": "text", "text": SUMMARY_MARKER + "\nthe summary"}],
    }
    assert out["system"] is body["system"]


# --- API compaction blocks --------------------------------------------------------------


def test_nothing_before_an_api_compaction_block_is_seen_or_changed() -> None:
    body = claude_code_request(30, output_chars=6_000)
    body["max_tokens"] = 4_096
    compaction_at = 22
    assert body["messages"][compaction_at]["role"] == "assistant"
    body["messages"][compaction_at]["content"].insert(
        0, {"type": "compaction", "content": "Summary of the work so far."}
    )
    # A failed compaction (content null) is a no-op for the API: not a boundary.
    body["messages"][32]["content"].insert(0, {"type": "compaction", "content": None})
    mapped = ANTHROPIC.to_engine(body)
    assert len(mapped.items) == 1 + len(body["messages"]) - compaction_at
    result, out = _compact(body, 16_384)
    assert result.stage != "none"
    assert _same(out["messages"][: compaction_at + 1], body["messages"][: compaction_at + 1])
    assert pairing_problems(out["messages"]) == []
    assert ANTHROPIC.untouchable(body) is None


# --- engine invariants --------------------------------------------------------------------


def _assert_invariants(body: dict[str, Any], window: int) -> None:
    try:
        result, out = _compact(body, window)
    except CannotFitError as exc:
        assert exc.part in ("head", "newest group"), exc
        return
    assert pairing_problems(out["messages"]) == []
    assert SCRIPTED.refusal(out) is None
    assert all(out[k] is body[k] for k in body if k != "messages")
    messages, original = out["messages"], body["messages"]
    assert messages[0] is original[0]
    if result.stage != "truncated":
        newest = 2 if ANTHROPIC.to_engine(body).messages[-1]["role"] == "tool" else 1
        assert _same(messages[-newest:], original[-newest:])
    if result.stage == "none":
        assert _same(messages, original)
    # What is forwarded, mapped again, is within the limit the engine worked to
    # (counted without the origin tags, which are never sent).
    again = ANTHROPIC.to_engine(out)
    forwarded = {**again.request, "messages": [clean(m) for m in again.messages]}
    assert COUNTER.count_request(forwarded) <= result.input_limit, result.notes


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SEEDS)
def test_compacted_random_conversations_keep_the_invariants(seed: int) -> None:
    body = random_request(seed)
    for window in WINDOWS:
        _assert_invariants(body, window)


def test_a_claude_code_session_keeps_the_invariants() -> None:
    body = claude_code_request(40, output_chars=6_000)
    body["max_tokens"] = 2_048
    for window in WINDOWS:
        _assert_invariants(body, window)


@pytest.mark.corpus
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_corpus_in_anthropic_form_keeps_the_invariants(path: Path) -> None:
    body = from_chat(orjson.loads(path.read_bytes()), thinking=True)
    for window in WINDOWS:
        _assert_invariants(body, window)


# --- wire shapes -----------------------------------------------------------------------


def _sdk(handler: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="k",
        base_url="http://upstream",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


def test_manual_reply_is_a_message_the_sdk_reads() -> None:
    reply = ANTHROPIC.manual_reply("claude-x", "Context compacted: 9 → 3 tokens.")
    message = SdkMessage.model_validate(reply)
    assert message.content[0].text == "Context compacted: 9 → 3 tokens."  # type: ignore[union-attr]
    assert (message.stop_reason, message.role, message.model) == (
        "end_turn",
        "assistant",
        "claude-x",
    )
    assert reply["id"].startswith("msg_") and reply["stop_sequence"] is None
    assert reply["usage"] == {"input_tokens": 0, "output_tokens": 0}


def test_manual_events_are_the_stream_the_sdk_reads() -> None:
    text = "Context compacted: 9 → 3 tokens."
    raw = b"".join(ANTHROPIC.manual_events("claude-x", text))
    frames = [f for f in raw.split(b"\n\n") if f]
    kinds = [f.split(b"\n")[0].removeprefix(b"event: ").decode() for f in frames]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    for frame, kind in zip(frames, kinds, strict=True):
        assert orjson.loads(frame.split(b"\ndata: ", 1)[1])["type"] == kind
    client = _sdk(
        lambda request: httpx2.Response(
            200, content=raw, headers={"content-type": "text/event-stream"}
        )
    )
    with client.messages.stream(
        model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "/compact"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"


def test_summary_request_is_a_plain_messages_request() -> None:
    request = ANTHROPIC.summary_request(
        "claude-x",
        [
            {"role": "system", "content": "Summarize."},
            {"role": "user", "content": [{"type": "text", "text": "the transcript"}]},
        ],
        512,
    )
    assert request == {
        "model": "claude-x",
        "max_tokens": 512,
        "system": "Summarize.",
        "messages": [{"role": "user", "content": "the transcript"}],
    }
    sent: list[dict[str, Any]] = []

    def handler(http: httpx2.Request) -> httpx2.Response:
        sent.append(orjson.loads(http.content))
        reply = {**ANTHROPIC.manual_reply("claude-x", "## Goal\nA."), "stop_reason": "end_turn"}
        return httpx2.Response(200, json=reply)

    reply = _sdk(handler).messages.create(**request)  # the SDK accepts it as it is
    assert sent == [request]
    assert ANTHROPIC.summary_text(reply.model_dump()) == "## Goal\nA."


def test_summary_text_joins_text_blocks_and_refuses_the_rest() -> None:
    reply = ANTHROPIC.manual_reply("m", "x")
    reply["content"] = [{"type": "text", "text": "## Goal\n"}, {"type": "text", "text": "- a"}]
    assert ANTHROPIC.summary_text(reply) == "## Goal\n- a"
    for content in (
        [],
        [{"type": "text", "text": "  "}],
        [{"type": "text", "text": "a"}, {"type": "tool_use", "id": "t", "name": "n", "input": {}}],
    ):
        with pytest.raises(SummarizationError):
            ANTHROPIC.summary_text({**reply, "content": content})
    for bad in (None, "text", {"type": "error", "error": {"type": "overloaded_error"}}):
        with pytest.raises(SummarizationError):
            ANTHROPIC.summary_text(bad)


# --- the scripted upstream ------------------------------------------------------------


def test_the_scripted_upstream_runs_a_client_loop_and_enforces_the_api() -> None:
    upstream = AnthropicUpstream(window=3_000, tool_turns=3)
    with (
        serve_in_thread(upstream.app()) as url,
        anthropic.Anthropic(api_key="k", base_url=url, max_retries=0) as client,
    ):
        full = claude_code_request(1)
        body = {k: full[k] for k in ("model", "system", "tools", "thinking", "metadata")}
        body["max_tokens"] = 1_000
        body["extra_body"] = {"context_management": full["context_management"]}
        messages = full["messages"]
        for _ in range(4):
            with client.messages.stream(**{**body, "messages": messages}) as stream:
                reply = stream.get_final_message()
            messages = [
                *messages,
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in reply.content],
                },
            ]
            if reply.stop_reason != "tool_use":
                break
            use = reply.content[-1]
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}],
                }  # type: ignore[union-attr]
            )
        assert reply.stop_reason == "end_turn" and len(upstream.message_requests) == 4
        # The API's refusals, in its words.
        with pytest.raises(anthropic.BadRequestError, match="tool_use` ids were found without"):
            client.messages.create(
                **{**body, "messages": messages[:-2] + messages[-1:] + messages[-2:-1]}
            )
        signed = copy.deepcopy(messages)
        signed[1]["content"][0]["thinking"] += " (edited)"
        with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
            client.messages.create(**{**body, "messages": signed})
        huge = [*messages[:-1], {"role": "user", "content": "x " * 4_000}]
        with pytest.raises(
            anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 3000 maximum"
        ):
            client.messages.create(**{**body, "messages": huge})
        count = client.messages.count_tokens(model="m", messages=messages)
        assert count.input_tokens == upstream.prompt_tokens({"messages": messages})
        summary = client.messages.create(
            **ANTHROPIC.summary_request(
                "m",
                [
                    {
                        "role": "system",
                        "content": "You are a summarizer\n## Goal ## Critical Context",
                    },
                    {"role": "user", "content": "We edited src/app.py today."},
                ],
                100,
            )
        )
        text = ANTHROPIC.summary_text(summary.model_dump())
        assert "## Goal" in text and "`src/app.py`" in text
        assert len(upstream.summary_requests) == 1


def test_pairing_problems_use_the_api_words() -> None:
    use = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "n", "input": {}}],
    }
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
    }
    text_first = {"role": "user", "content": [{"type": "text", "text": "hi"}, result["content"][0]]}
    assert pairing_problems([{"role": "user", "content": "q"}, use, result]) == []
    assert "immediately after: t1" in pairing_problems([use])[0]
    assert "unexpected `tool_use_id`" in pairing_problems([result])[0]
    # The results must open the next message.
    assert "immediately after: t1" in pairing_problems([use, text_first])[0]
    assert thinking_block("a")["signature"] != thinking_block("b")["signature"]


def test_a_checkpoint_made_when_the_text_rode_on_the_results_applies_to_the_next_request() -> None:
    """The newest message maps its blocks beside results onto its last result;
    on the next request the same message maps them to a user message of their
    own. It was in the tail, never in the span the checkpoint covers, so the
    checkpoint still applies and the message is forwarded as the client sent it."""
    body = claude_code_request(40, output_chars=8_000)
    body["messages"][-1]["content"].append({"type": "text", "text": "USER-INSTRUCTION-2"})
    profile = Profile(context_window=90_000, summarizer="extractive", prune_target=0.3)
    budget = calibrated_budget(profile, body["max_tokens"])
    mapped = ANTHROPIC.to_engine(body)
    first = read_conversation(mapped.request, mapped.messages, COUNTER, profile.head_count)
    result = asyncio.run(execute(first, decide(first, profile, budget)))
    assert result.stage == "condensed"
    made = new_checkpoint(first, result, id="c", created_at=0.0, progress_ok=True)
    assert made is not None
    later = {
        **body,
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "And then?"},
        ],
    }
    mapped = ANTHROPIC.to_engine(later)
    again = read_conversation(mapped.request, mapped.messages, COUNTER, profile.head_count)
    decision = decide(again, profile, budget, stored={made.end_hash: made})
    assert decision.checkpoint is made
    out = ANTHROPIC.from_engine(later, mapped, asyncio.run(execute(again, decision)).messages)
    assert any(m is body["messages"][-1] for m in out["messages"])
