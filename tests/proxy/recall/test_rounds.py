"""Recall through real servers: a scripted model reads back a pruned file, in all three APIs.

The proxy runs on loopback in front of :class:`~tests.proxy.recall_upstream.RecallUpstream`,
a model that calls ``compaction_recall`` for the first ``[ref: …]`` it finds and
answers ``RECALLED: <the line holding "needle">`` once it has the tool's
result. The clients are the real SDKs (``openai`` for Chat Completions and
Responses, ``anthropic`` for Messages), streamed and not: what they parse is
what a user's program would.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from config import load_settings
from proxy.app import create_app
from proxy.edge.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.recall import RecallFailed, RecallLimit
from tests.proxy.recall_upstream import PREAMBLE, TOOL, RecallUpstream
from tests.proxy.servers import serve_in_thread

MODEL = "scripted-model"
NEEDLE = "line 207: value_207 = compute(207)  # the needle"
FILE = "\n".join(
    NEEDLE if i == 207 else f"line {i}: value_{i} = compute({i})" for i in range(1, 401)
)
READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
_REF = re.compile(r"\[ref: (r[a-z0-9]+)\]")


# --- one conversation, in each API ---------------------------------------------------


def chat_request(final: str | None = None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix app.py"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "app.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": FILE},
        {"role": "assistant", "content": "I read app.py."},
        {"role": "user", "content": "Now change the needle line."},
    ]
    if final is not None:
        messages += [
            {"role": "assistant", "content": final},
            {"role": "user", "content": "Thanks."},
        ]
    return {
        "model": MODEL,
        "messages": messages,
        "tools": [
            {"type": "function", "function": {"name": "read_file", "parameters": READ_SCHEMA}}
        ],
    }


def anthropic_request(final: str | None = None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix app.py"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_a",
                    "name": "read_file",
                    "input": {"path": "app.py"},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": FILE}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "I read app.py."}]},
        {"role": "user", "content": "Now change the needle line."},
    ]
    if final is not None:
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": final}]},
            {"role": "user", "content": "Thanks."},
        ]
    return {
        "model": MODEL,
        "max_tokens": 1024,
        "system": "You are a coding agent.",
        "messages": messages,
        "tools": [{"name": "read_file", "input_schema": READ_SCHEMA}],
    }


def responses_request(final: str | None = None) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix app.py"},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "read_file",
            "arguments": '{"path": "app.py"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": FILE},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "I read app.py."}],
        },
        {"role": "user", "content": "Now change the needle line."},
    ]
    if final is not None:
        items += [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": final}],
            },
            {"role": "user", "content": "Thanks."},
        ]
    return {
        "model": MODEL,
        "instructions": "You are a coding agent.",
        "input": items,
        "tools": [{"type": "function", "name": "read_file", "parameters": READ_SCHEMA}],
    }


@dataclass(frozen=True)
class Api:
    name: str
    request: Callable[..., dict[str, Any]]
    items: str  #: the request's conversation list
    #: (base URL, key, request, stream) → the answer's text, as the SDK read it
    ask: Callable[[str, str, dict[str, Any], bool], str]

    def tools(self, body: dict[str, Any]) -> list[str]:
        return [t.get("name") or (t.get("function") or {}).get("name") for t in body["tools"]]


def _ask_chat(url: str, key: str, body: dict[str, Any], stream: bool) -> str:
    with openai.OpenAI(base_url=url, api_key=key, max_retries=0) as client:
        if not stream:
            answer = client.chat.completions.create(**body)
            choice = answer.choices[0]
            assert not choice.message.tool_calls and choice.finish_reason == "stop"
            return choice.message.content or ""
        text, finishes = [], []
        for chunk in client.chat.completions.create(**body, stream=True):
            for choice in chunk.choices:
                assert not choice.delta.tool_calls, "the client saw a tool call"
                text.append(choice.delta.content or "")
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
    assert finishes == ["stop"]
    return "".join(text)


def _ask_anthropic(url: str, key: str, body: dict[str, Any], stream: bool) -> str:
    base = url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=base, api_key=key, max_retries=0) as client:
        if not stream:
            message = client.messages.create(**body)
        else:
            with client.messages.stream(**body) as events:
                message = events.get_final_message()
    assert [b.type for b in message.content if b.type != "text"] == []
    assert message.stop_reason == "end_turn"
    return "".join(b.text for b in message.content if b.type == "text")


def _ask_responses(url: str, key: str, body: dict[str, Any], stream: bool) -> str:
    with openai.OpenAI(base_url=url, api_key=key, max_retries=0) as client:
        if not stream:
            response = client.responses.create(**body)
        else:
            with client.responses.stream(**body) as events:
                response = events.get_final_response()
    assert [item.type for item in response.output if item.type != "message"] == []
    return response.output_text


PATHS = {"chat": "chat/completions", "anthropic": "messages", "responses": "responses"}
APIS = [
    Api("chat", chat_request, "messages", _ask_chat),
    Api("anthropic", anthropic_request, "messages", _ask_anthropic),
    Api("responses", responses_request, "input", _ask_responses),
]


@contextmanager
def proxy_for(upstream: RecallUpstream, **compaction: Any) -> Iterator[str]:
    """The proxy on loopback in front of ``upstream``; yields its /v1 URL. The
    conversation above is compacted (a 2,000-token trigger and a 300-token tail prune the file)."""
    with serve_in_thread(upstream.app()) as base:
        settings = load_settings(
            None,
            store={"url": "memory://"},
            upstream={"base_url": base + "/v1", "anthropic_base_url": base + "/v1"},
            compaction={
                "threshold": 2000,
                "keep_recent_tokens": 300,
                "summarizer": "extractive",
                **compaction,
            },
        )
        with serve_in_thread(create_app(settings)) as url:
            yield url + "/v1"


def _ref_in(body: dict[str, Any], items: str) -> str:
    found = _REF.search(orjson.dumps(body[items]).decode())
    assert found is not None, "no ref in what the proxy sent"
    return found.group(1)


def _events(url: str, key: str) -> list[dict[str, Any]]:
    """The caller's events, as the events endpoint gives them; a recall's is
    written after the answer went out, so it is waited for (bounded)."""
    for _ in range(100):
        answer = httpx.get(f"{url}/compaction/events", headers={"authorization": f"Bearer {key}"})
        found: list[dict[str, Any]] = answer.json()["data"]
        if any(event["type"] == "context.recalled" for event in found):
            return found
        time.sleep(0.05)
    return found


def _text(item: Any) -> str:
    return orjson.dumps(item).decode()


# --- the tests ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_a_recalled_file_reaches_the_model_and_the_client_gets_one_ordinary_answer(
    api: Api, stream: bool
) -> None:
    upstream = RecallUpstream()
    with proxy_for(upstream) as url:
        text = api.ask(url, "sk-alice", api.request(), stream)
        metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
        events = _events(url, "sk-alice")
    assert text.endswith(f"RECALLED: {NEEDLE}")
    if stream and api.name != "responses":  # the model's text before its call was streamed
        assert text.startswith(PREAMBLE)
    first, second = (body for _, body in upstream.turns())
    assert len(upstream.turns()) == 2
    # The tool is added last, in the same bytes both times.
    assert api.tools(first)[-1] == TOOL and api.tools(second)[-1] == TOOL
    assert _text(first["tools"]) == _text(second["tools"])
    # The second round extends the first: what was sent, then the exchange.
    sent = first[api.items]
    assert second[api.items][: len(sent)] == sent
    exchange = second[api.items][len(sent) :]
    assert NEEDLE in _text(exchange[-1]) and TOOL in _text(exchange)
    assert FILE not in _text(first[api.items])  # the file went as a brief
    assert f'compaction_proxy_recalls_total{{api="{api.name}",outcome="answered"}} 1.0' in metrics
    (recalled,) = [event for event in events if event["type"] == "context.recalled"]
    assert recalled["notes"] == ["answered: 1"] and recalled["reason"] == "recall"


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_the_next_turn_carries_the_exchange_where_it_was_so_the_bytes_extend_what_was_sent(
    api: Api,
) -> None:
    upstream = RecallUpstream()
    with proxy_for(upstream) as url:
        final = api.ask(url, "sk-alice", api.request(), False)
        recalling = upstream.turns()[-1][1][api.items]  # the round the model answered
        upstream.received.clear()
        again = api.ask(url, "sk-alice", api.request(final=final), False)
    assert again == "NO RECALL"  # it had what it recalled, and asked for nothing
    ((_, turn),) = upstream.turns()
    sent = turn[api.items]
    # What the answered round sent — the conversation, the model's call and
    # the tool's answer — comes first, item for item; then the client's
    # final answer and its new message.
    assert sent[: len(recalling)] == recalling
    assert NEEDLE in _text(recalling[-1])
    assert final in _text(sent[len(recalling)]) and "Thanks." in _text(sent[-1])


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_a_ref_of_another_caller_is_not_found_like_a_ref_that_never_existed(api: Api) -> None:
    upstream = RecallUpstream()
    with proxy_for(upstream) as url:
        api.ask(url, "sk-bob", api.request(), False)
        bobs = _ref_in(upstream.turns()[0][1], api.items)
        upstream.received.clear()
        upstream.ref = bobs  # Alice's model asks for Bob's ref
        theirs = api.ask(url, "sk-alice", api.request(), False)
        alices = _ref_in(upstream.turns()[0][1], api.items)
        upstream.received.clear()
        upstream.ref = "rzzzzzzzzzzzz"
        unknown = api.ask(url, "sk-alice", api.request(), False)
    assert alices != bobs  # the same file has another ref for another caller
    assert NEEDLE not in theirs
    assert theirs.replace(bobs, "R") == unknown.replace("rzzzzzzzzzzzz", "R")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_the_round_limit_holds_and_the_last_round_offers_the_clients_tools_alone(
    api: Api, stream: bool
) -> None:
    upstream = RecallUpstream(always=True)
    with proxy_for(upstream, recall_rounds=2) as url:
        text = api.ask(url, "sk-alice", api.request(), stream)
    turns = [body for _, body in upstream.turns()]
    assert len(turns) == 3  # the first round, then two answered
    assert [api.tools(body) for body in turns] == [["read_file", TOOL]] * 2 + [["read_file"]]
    assert [body.get("tool_choice") for body in turns] == [None, None, None]
    assert text.endswith(f"RECALLED: {NEEDLE}")


def _client_calls(text: str) -> list[str]:
    """The names of the tools an answer (JSON, or a stream's events) calls."""
    names = re.findall(r'"name":"([a-z_]+)"', text)
    return [name for name in names if name != "scripted-model"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_after_the_last_recall_round_the_model_may_still_call_the_clients_own_tools(
    api: Api, stream: bool
) -> None:
    # A tool_choice of none on the last round forbade the client's tools too:
    # an agent that recalled to the limit ended its work with a text answer.
    upstream = RecallUpstream(always=True, client_tool="read_file")
    with proxy_for(upstream, recall_rounds=2) as url:
        answer = httpx.post(
            f"{url}/{PATHS[api.name]}",
            json={**api.request(), "stream": stream},
            headers={"authorization": "Bearer sk-alice", "x-api-key": "sk-alice"},
            timeout=30,
        )
    assert answer.status_code == 200
    assert len(upstream.turns()) == 3
    assert "read_file" in _client_calls(answer.text)
    assert TOOL not in answer.text and "recall_limit" not in answer.text


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_no_tool_is_added_to_a_request_that_declares_none_or_for_a_model_with_recall_off(
    api: Api,
) -> None:
    upstream = RecallUpstream()
    bare = {k: v for k, v in api.request().items() if k != "tools"}
    with proxy_for(upstream) as url:
        assert api.ask(url, "sk-alice", bare, False) == "NO RECALL"
    with proxy_for(upstream, recall=False) as url:
        assert api.ask(url, "sk-alice", api.request(), False) == "NO RECALL"
    first, second = (body for _, body in upstream.received)
    assert "tools" not in first
    assert api.tools(second) == ["read_file"]
    assert _REF.search(_text(second)) is None  # and its briefs carry no ref


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_a_calling_turn_too_long_for_the_recall_room_is_refused_not_sent_over_the_limit(
    api: Api,
) -> None:
    upstream = RecallUpstream(turn_text=" ".join(f"word{i}" for i in range(3000)))
    with proxy_for(upstream, recall_max_tokens=1000) as url:
        answer = httpx.post(
            f"{url}/{PATHS[api.name]}",
            json=api.request(),
            headers={"authorization": "Bearer sk-alice", "x-api-key": "sk-alice"},
            timeout=30,
        )
    assert answer.status_code == 502
    assert "no room" in answer.text and TOOL not in answer.text
    assert len(upstream.turns()) == 1  # nothing was sent past the room


def test_a_responses_stream_past_the_round_limit_ends_as_a_failed_response() -> None:
    """A model that goes on recalling when told to call no tool: the stream ends
    with the error event, code recall_limit (what a whole answer's 502 says), and
    response.failed — the event a client waiting for the Response's end reads
    as a failure, not as a stream cut short to retry."""
    api = next(api for api in APIS if api.name == "responses")
    upstream = RecallUpstream(always=True, stubborn=True)
    with proxy_for(upstream, recall_rounds=1) as url:
        answer = httpx.post(
            f"{url}/{PATHS[api.name]}",
            json={**api.request(), "stream": True},
            headers={"authorization": "Bearer sk-alice"},
            timeout=30,
        )
    events = [
        orjson.loads(line[len("data: ") :])
        for line in answer.text.splitlines()
        if line.startswith("data: ")
    ]
    error, failed = events[-2], events[-1]
    assert error["type"] == "error" and error["code"] == "recall_limit"
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "recall_limit"


def _no_null_content(body: dict[str, Any], items: str) -> dict[str, Any]:
    """``body`` as a client of a server that refuses ``"content": null`` writes
    it: ``""`` beside tool calls."""
    turns = [
        {**item, "content": ""} if item.get("content", "") is None else item for item in body[items]
    ]
    return {**body, items: turns}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_recall_passes_a_server_that_refuses_null_content_whole_and_streamed(
    api: Api, stream: bool
) -> None:
    # llama-cpp-python's schema refuses "content": null beside tool calls; a
    # streamed calling turn that wrote "" alone must go back as "", too.
    upstream = RecallUpstream(refuses_null=True, preamble=False)
    with proxy_for(upstream) as url:
        text = api.ask(url, "sk-alice", _no_null_content(api.request(), api.items), stream)
    assert text.endswith(f"RECALLED: {NEEDLE}")
    assert len(upstream.turns()) == 2


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_a_refused_follow_up_reaches_the_client_as_an_error_that_names_no_hidden_tool_or_ref(
    api: Api, stream: bool
) -> None:
    upstream = RecallUpstream(refuses_followups=True)
    with proxy_for(upstream) as url:
        answer = httpx.post(
            f"{url}/{PATHS[api.name]}",
            json={**api.request(), "stream": stream},
            headers={"authorization": "Bearer sk-alice", "x-api-key": "sk-alice"},
            timeout=30,
        )
    ref = _ref_in(upstream.turns()[0][1], api.items)
    assert len(upstream.turns()) == 2  # the follow-up was asked, and refused
    assert answer.status_code == (200 if stream else 502)
    assert "refused a follow-up request (500)" in answer.text
    assert TOOL not in answer.text and ref not in answer.text


def test_the_docs_name_the_error_codes_recall_really_sends() -> None:
    text = Path(__file__).parents[3].joinpath("docs", "recall.md").read_text()
    section = text.split("## When recall cannot finish", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE))
    sent = {RecallLimit.code, RecallFailed.code, UpstreamUnreachable.code, UpstreamTimeout.code}
    assert named == {*sent, "upstream_dropped"}


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_a_recall_round_whose_stream_closes_before_its_end_is_an_upstream_error(
    api: Api,
) -> None:
    # The round after the recall streams its answer and closes with no
    # [DONE], message_stop or response.completed: not a whole answer.
    upstream = RecallUpstream(cut_answers=True)
    with proxy_for(upstream) as url:
        answer = httpx.post(
            f"{url}/{PATHS[api.name]}",
            json={**api.request(), "stream": True},
            headers={"authorization": "Bearer sk-alice", "x-api-key": "sk-alice"},
            timeout=30,
        )
        metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
    assert len(upstream.turns()) == 2
    assert "value_207 = compute(207)" in answer.text  # what came was relayed
    assert "ended the stream before its end" in answer.text
    assert 'compaction_proxy_upstream_errors_total{kind="cut"} 1.0' in metrics
