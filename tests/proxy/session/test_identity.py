"""A conversation's checkpoints are its own task's: another task of the same
caller is never given its summary, and a client rewriting its system prompt
between requests keeps it — in each API the proxy compacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from compaction import SUMMARY_MARKER, TokenCounter, read_conversation
from compaction.types import Message
from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.base import Dialect
from proxy.dialects.responses import RESPONSES
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.servers import FakeUpstream
from tests.synthetic import agent_session

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures"
QWEN_REQUEST = FIXTURES / "clients" / "qwen-code-request.json"
MODELS = {"small": {"context_window": 8_192}, "qwen*": {"context_window": 49_152}}


def _post(proxy: InProcessProxy, body: dict[str, Any]) -> httpx.Response:
    return proxy.http.post(
        f"{proxy.url}/chat/completions", json=body, headers={"authorization": "Bearer sk-alice"}
    )


def _summaries(body: dict[str, Any]) -> list[str]:
    texts = [
        message["content"] for message in body["messages"] if isinstance(message["content"], str)
    ]
    return [text for text in texts if text.startswith(SUMMARY_MARKER)]


def test_another_task_of_the_same_caller_is_not_given_the_first_tasks_summary(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    proxy = start_app(models=MODELS, compaction={"summarizer": "extractive"})
    parser = agent_session(seed=71, steps=80, task="Fix the parser's header handling.")
    # The same first steps, word for word, but another task.
    readme = [parser[0], {"role": "user", "content": "Write the README's install section."}]
    readme += parser[2:]
    first = _post(proxy, {"model": "small", "messages": parser})
    assert first.headers["x-compaction-stage"] in ("condensed", "truncated")
    parser_summaries = _summaries(fake_upstream.chat_requests[-1].json())
    assert parser_summaries and "parser's header handling" in parser_summaries[0]

    second = _post(proxy, {"model": "small", "messages": readme})
    assert second.headers["x-compaction-stage"] != "reused"
    assert second.headers.get("x-compaction-id") != first.headers["x-compaction-id"]
    forwarded = fake_upstream.chat_requests[-1].json()
    assert "Write the README's install section." in forwarded["messages"][1]["content"]
    assert parser_summaries[0] not in _summaries(forwarded)
    assert "parser's header handling" not in fake_upstream.chat_requests[-1].body.decode()
    # Each task then goes on over its own checkpoint.
    more = {"role": "user", "content": "and now?"}
    again = _post(proxy, {"model": "small", "messages": [*parser, more]})
    assert again.headers["x-compaction-id"] == first.headers["x-compaction-id"]


def _qwen() -> dict[str, Any]:
    if not QWEN_REQUEST.is_file():
        pytest.skip(
            f"{QWEN_REQUEST} is absent (a standalone clone): the qwen-code request body "
            "lives in ../shared/fixtures/clients beside development checkouts"
        )
    body: dict[str, Any] = json.loads(QWEN_REQUEST.read_text())
    return body


def test_a_qwen_code_session_keeps_its_checkpoint_when_its_system_prompt_changes(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    """qwen-code writes the agent's memory files into its system prompt: saving
    a memory mid-session rewrites the system prompt of every later request."""
    base = _qwen()
    proxy = start_app(models=MODELS, compaction={"summarizer": "extractive"})
    empty = "Your MEMORY.md is currently empty."
    assert empty in base["messages"][0]["content"]
    head = base["messages"][:3]  # the system prompt, the context reminder, "Got it."
    steps = agent_session(seed=72, steps=70, output_chars=6_000)[2:]
    request = {k: base[k] for k in ("model", "max_tokens", "stream_options", "tools")}
    request["model"] = "qwen3-coder"
    first = _post(proxy, {**request, "messages": [*head, *steps]})
    assert first.headers["x-compaction-stage"] in ("condensed", "truncated")

    saved = base["messages"][0]["content"].replace(
        empty, "- [Tests](feedback/tests.md) — run pytest -x before every commit"
    )
    later = [{**head[0], "content": saved}, *head[1:], *steps]
    later.append({"role": "user", "content": [{"type": "text", "text": "Go on."}]})
    second = _post(proxy, {**request, "messages": later})
    assert second.headers["x-compaction-stage"] == "reused"
    assert second.headers["x-compaction-id"] == first.headers["x-compaction-id"]
    forwarded = fake_upstream.chat_requests[-1].json()["messages"]
    assert forwarded[0]["content"] == saved  # today's system prompt, over the kept summary


# --- the other APIs, as their dialects map them to the engine ----------------


def _chain(dialect: Dialect, body: dict[str, Any]) -> list[str]:
    reading = dialect.read(orjson.dumps(body))
    messages: list[Message] = reading.messages
    conversation = read_conversation(
        reading.body, messages, TokenCounter("gpt-4o"), 2, scope=b"alice"
    )
    assert conversation.chain
    return conversation.chain


def _responses(instructions: str, task: str, environment: str) -> dict[str, Any]:
    """A Codex-shaped request: instructions, a developer message, the environment,
    the task, then the same shell steps."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": environment},
        {"type": "message", "role": "user", "content": task},
    ]
    for step in range(4):
        call = f"call_{step}"
        items += [
            {"type": "function_call", "call_id": call, "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": call, "output": f"output {step}"},
        ]
    return {"model": "gpt-5", "instructions": instructions, "input": items, "store": False}


def test_a_responses_conversation_keeps_its_chain_when_its_instructions_change() -> None:
    monday = _responses("You are Codex. Today: Monday.", "Fix the bug.", "cwd: /repo, Monday")
    tuesday = _responses("You are Codex. Today: Tuesday.", "Fix the bug.", "cwd: /repo, Tuesday")
    assert _chain(RESPONSES, monday) == _chain(RESPONSES, tuesday)
    other = _responses("You are Codex. Today: Monday.", "Write docs.", "cwd: /repo, Monday")
    assert not set(_chain(RESPONSES, monday)) & set(_chain(RESPONSES, other))


def _anthropic(system: str, task: str, *, cached: bool) -> dict[str, Any]:
    """A Claude Code-shaped request: the task's blocks (a reminder first), the
    cache marker on the first message only while it is the newest."""
    first: dict[str, Any] = {"type": "text", "text": task}
    if cached:
        first["cache_control"] = {"type": "ephemeral"}
    reminder = {"type": "text", "text": "<system-reminder>CLAUDE.md: be brief</system-reminder>"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": [reminder, first]}]
    for step in range(4):
        call = f"toolu_{step}"
        use = {"type": "tool_use", "id": call, "name": "Bash", "input": {"command": "ls"}}
        result = {"type": "tool_result", "tool_use_id": call, "content": f"output {step}"}
        messages += [
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
    model = "claude-sonnet-4-5"
    return {"model": model, "max_tokens": 1024, "system": system, "messages": messages}


def test_an_anthropic_conversation_keeps_its_chain_as_system_and_cache_marks_move() -> None:
    now = _anthropic("You are Claude Code. gitStatus: clean", "Fix the bug.", cached=True)
    later = _anthropic("You are Claude Code. gitStatus: M app.py", "Fix the bug.", cached=False)
    assert _chain(ANTHROPIC, now) == _chain(ANTHROPIC, later)
    other = _anthropic("You are Claude Code. gitStatus: clean", "Write docs.", cached=True)
    assert not set(_chain(ANTHROPIC, now)) & set(_chain(ANTHROPIC, other))
