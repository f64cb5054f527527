"""A model measured never to call the recall tool gets none of it by default:
no tool, no room held back for one, no refs in its briefs — and a
``[models."…"]`` table that sets ``recall = true`` gives it all back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest

from config import load_settings
from tests.proxy.inprocess import (
    UPSTREAM_URL,
    InProcessProxy,
    RecordingTransport,
    json_reply,
    running,
)

SMALL = "qwen2.5-coder-1.5b-instruct"  # as llama.cpp's --alias names it
OTHER = "scripted-model"
READ_FILE = {
    "type": "function",
    "function": {"name": "read_file", "parameters": {"type": "object"}},
}
FILE = "\n".join(f"line {i}: value_{i} = compute({i})" for i in range(1, 401))
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": SMALL,
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102},
}


def _request(model: str) -> dict[str, Any]:
    """A tool-using conversation whose file read the proxy must brief."""
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix app.py"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": FILE},
            {"role": "assistant", "content": "I read app.py."},
            {"role": "user", "content": "Now change line 207."},
        ],
        "tools": [READ_FILE],
    }


@contextmanager
def _proxy(models: dict[str, dict[str, Any]]) -> Iterator[InProcessProxy]:
    """The proxy, each ``[models."…"]`` table given an 8k window."""
    settings = load_settings(
        None,
        store={"url": "memory://"},
        upstream={"base_url": UPSTREAM_URL},
        compaction={"threshold": 2000, "keep_recent_tokens": 300, "summarizer": "extractive"},
        models={name: {"context_window": 8192, **table} for name, table in models.items()},
    )
    transport = RecordingTransport()
    with running(settings, transport) as proxy:
        yield proxy


def _sent(proxy: InProcessProxy, model: str) -> tuple[list[str], str, int]:
    """The tools and conversation the upstream got for ``model``, and the input
    limit the preview reports for it."""
    proxy.transport.script(json_reply({**ANSWER, "model": model}))
    auth = {"authorization": "Bearer sk-client"}
    answer = proxy.http.post(f"{proxy.url}/chat/completions", json=_request(model), headers=auth)
    assert answer.status_code == 200, answer.text
    body = orjson.loads(proxy.transport.asked("/chat/completions")[-1].body)
    names = [t["function"]["name"] for t in body["tools"]]
    preview = proxy.http.post(f"{proxy.url}/compaction/preview", json=_request(model), headers=auth)
    assert preview.status_code == 200, preview.text
    return names, orjson.dumps(body["messages"]).decode(), preview.json()["report"]["input_limit"]


def test_a_model_measured_never_to_recall_gets_no_tool_no_room_and_no_refs() -> None:
    with _proxy({SMALL: {}, OTHER: {}}) as proxy:
        tools, messages, limit = _sent(proxy, OTHER)
        assert tools == ["read_file", "compaction_recall"] and "[ref: " in messages
        small_tools, small_messages, small_limit = _sent(proxy, SMALL)
    assert "value_207" not in small_messages  # the read was briefed all the same
    assert small_tools == ["read_file"]
    assert "[ref: " not in small_messages
    assert small_limit > limit  # the tool's room goes to the conversation


@pytest.mark.parametrize("pattern", [SMALL, "qwen2.5-coder-1.5b*", "*"])
def test_a_models_table_that_turns_recall_on_gives_it_back(pattern: str) -> None:
    with _proxy({pattern: {"recall": True}}) as proxy:
        tools, messages, _ = _sent(proxy, SMALL)
    assert tools == ["read_file", "compaction_recall"] and "[ref: " in messages
