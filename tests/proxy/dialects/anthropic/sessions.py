"""Anthropic Messages requests for tests: Claude Code-shaped sessions, random
conversations (hypothesis) and chat-format conversations converted.

``claude_code_request`` writes down what Claude Code 2.1 was seen to send:
``system`` as text blocks with ``cache_control``, 25 tools, ``max_tokens:
64000``, ``thinking: {"type": "adaptive"}``, ``context_management`` with a
``clear_thinking_20251015`` edit, ``metadata``, ``stream: true``, user text
blocks with ``cache_control``, ``system``-role messages inside ``messages``
(beta ``mid-conversation-system-2026-04-07``), and tool turns whose assistant
messages carry a signed ``thinking`` block.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from hypothesis import strategies as st

Body = dict[str, Any]

#: Claude Code's tool names (2.1), each given a small schema below.
TOOL_NAMES = (
    "Task TaskOutput Bash Glob Grep ExitPlanMode Read Edit Write NotebookEdit WebFetch "
    "TodoWrite WebSearch KillShell AskUserQuestion Skill EnterPlanMode LSP BashOutput "
    "SlashCommand ListMcpResources ReadMcpResource mcp__ide__getDiagnostics "
    "mcp__ide__executeCode Monitor"
).split()
_WORDS = (
    "token budget context window request upstream summary tool result file path error "
    "function module test assert config proxy stream chunk header retry limit cache"
).split()
_PATHS = ["src/app.py", "src/server/routes.py", "tests/test_app.py", "README.md", "lib/util.js"]
CACHE = {"type": "ephemeral"}


def signature(thinking: str) -> str:
    """The signature the scripted upstream gives a thinking text (and checks it by)."""
    return "sig_" + hashlib.sha256(thinking.encode()).hexdigest()


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": signature(text)}


def tools() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "description": f"The {name} tool. " + " ".join(_WORDS[: 5 + i % 7]),
            "input_schema": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "path": {"type": "string"}},
                "additionalProperties": False,
                "$schema": "http://json-schema.org/draft-07/schema#",
            },
        }
        for i, name in enumerate(TOOL_NAMES)
    ]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def claude_code_request(turns: int = 40, seed: int = 0, output_chars: int = 3_000) -> Body:
    """A Claude Code 2.1 request after ``turns`` tool turns, ending on tool results."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "<system-reminder>\nAs you answer, use the context "
                    "below.\n# claudeMd\nRun pytest -q before finishing.\n</system-reminder>",
                },
                {
                    "type": "text",
                    "text": "Fix the failing test in tests/test_app.py.",
                    "cache_control": CACHE,
                },
            ],
        }
    ]
    for turn in range(turns):
        path = rng.choice(_PATHS)
        name = rng.choice(["Read", "Bash", "Edit", "Grep"])
        call_id = f"toolu_{turn:02d}{hashlib.md5(str(seed).encode()).hexdigest()[:18]}"
        arguments = {"command": f"pytest -q {path}"} if name == "Bash" else {"path": path}
        blocks: list[dict[str, Any]] = [thinking_block(f"Turn {turn}: " + _text(rng, 60))]
        if rng.random() < 0.6:
            blocks.append({"type": "text", "text": _text(rng, rng.randint(5, 80))})
        blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
        messages.append({"role": "assistant", "content": blocks})
        output = "\n".join(
            f"{i}: {_text(rng, 8)}" for i in range(rng.randint(1, output_chars // 50))
        )
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id, "content": output}
        if rng.random() < 0.2:
            result["is_error"] = True
        answer: list[dict[str, Any]] = [result]
        if rng.random() < 0.3:
            answer.append(
                {"type": "text", "text": "<system-reminder>Todo list updated.</system-reminder>"}
            )
        messages.append({"role": "user", "content": answer})
        if turn % 10 == 5 and turn < turns - 1:
            messages.append(
                {"role": "system", "content": f"Turn {turn}: the clock says 12:{turn:02d}."}
            )
    messages[-1]["content"][-1]["cache_control"] = CACHE
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64_000,
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {
                "type": "text",
                "text": "You are an interactive CLI tool that helps users with software "
                "engineering tasks. " + _text(rng, 400),
                "cache_control": CACHE,
            },
        ],
        "tools": tools(),
        "messages": messages,
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "user_abc_account_def_session_0123"},
        "stream": True,
    }


# --- chat format → Anthropic ---------------------------------------------------


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content or []:
        if isinstance(part, dict) and isinstance(part.get("text"), str) and part["text"]:
            blocks.append({"type": "text", "text": part["text"]})
        elif isinstance(part, dict) and part.get("type") == "image_url":
            blocks.append(_IMAGE)
    return blocks


_IMAGE = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
}


def _input(arguments: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments)
    except (TypeError, ValueError):
        return {"arguments": str(arguments)}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def from_chat(body: Body, *, thinking: bool = False) -> Body:
    """A chat-completions request as Claude Code would send the same conversation.

    Leading system messages become ``system`` blocks, later ones ``system``-role
    messages; tool messages the ``tool_result`` blocks of one user message, which
    also takes the user message right after them (its text after the results);
    tool calls ``tool_use`` blocks (behind a signed thinking block when
    ``thinking``).
    """
    chat = body["messages"]
    i = 0
    system: list[dict[str, Any]] = []
    while i < len(chat) and chat[i].get("role") in ("system", "developer"):
        system.extend(_blocks(chat[i].get("content")))
        i += 1
    messages: list[dict[str, Any]] = []
    while i < len(chat):
        message = chat[i]
        role = message.get("role")
        if role == "assistant":
            blocks = _blocks(message.get("content"))
            calls = message.get("tool_calls") or []
            if thinking and calls:
                blocks.insert(0, thinking_block(f"Thinking before {len(messages)}."))
            for call in calls:
                function = call["function"]
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": function.get("name") or "tool",
                        "input": _input(function.get("arguments")),
                    }
                )
            messages.append(
                {"role": "assistant", "content": blocks or [{"type": "text", "text": "…"}]}
            )
            i += 1
        elif role == "tool":
            results = []
            while i < len(chat) and chat[i].get("role") == "tool":
                text = chat[i].get("content")
                content = text if isinstance(text, str) else _blocks(text)
                results.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": chat[i]["tool_call_id"],
                        "content": content,
                    }
                )
                i += 1
            if i < len(chat) and chat[i].get("role") == "user":
                results.extend(_blocks(chat[i].get("content")))
                i += 1
            messages.append({"role": "user", "content": results})
        elif role in ("system", "developer"):
            messages.append({"role": "system", "content": _blocks(message.get("content"))})
            i += 1
        else:
            messages.append({"role": "user", "content": _blocks(message.get("content")) or "…"})
            i += 1
    out: Body = {"model": "claude-sonnet-4-6", "max_tokens": 4_096, "messages": messages}
    if system:
        system[-1] = {**system[-1], "cache_control": CACHE}
        out["system"] = system
    if body.get("tools"):
        out["tools"] = [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "input_schema": t["function"].get("parameters", {"type": "object"}),
            }
            for t in body["tools"]
        ]
    return out


# --- random conversations ------------------------------------------------------


#: Seeds for :func:`random_request` (a seed, not the body: hypothesis prints what it draws).
SEEDS = st.integers(0, 2**32 - 1)


def random_request(seed: int) -> Body:
    """A random Anthropic request: text and block content, tool groups of 1–3 calls with
    results of every size (some with images, some followed by text), thinking,
    mid-conversation system messages, server-tool blocks, ending on a user turn."""
    rng = random.Random(seed)
    steps = rng.randint(0, 30)
    system: Any = rng.choice(
        [
            None,
            "You are a helpful agent.",
            [
                {
                    "type": "text",
                    "text": "You are an agent. " + "x " * 200,
                    "cache_control": CACHE,
                }
            ],
        ]
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Do the task: " + _text(rng, 20)}]
    for step in range(steps):
        kind = rng.choice(["tools", "tools", "tools", "text", "system", "server"])
        if kind == "tools":
            ids = [f"toolu_{step}_{k}" for k in range(rng.randint(1, 3))]
            blocks: list[dict[str, Any]] = []
            if rng.random() < 0.5:
                blocks.append(thinking_block(_text(rng, rng.randint(1, 300))))
            if rng.random() < 0.1:
                blocks.append({"type": "redacted_thinking", "data": "EmwKAhgBEgy" + "x" * 40})
            if rng.random() < 0.6:
                blocks.append({"type": "text", "text": _text(rng, rng.choice([5, 50, 900]))})
            for call_id in ids:
                size = rng.choice([0, 5, 50, 400, 3_000])
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call_id,
                        "name": rng.choice(TOOL_NAMES),
                        "input": {"command": _text(rng, size), "path": rng.choice(_PATHS)},
                    }
                )
            messages.append({"role": "assistant", "content": blocks})
            answer: list[dict[str, Any]] = []
            for call_id in ids:
                size = rng.choice([0, 20, 300, 2_000, 8_000])
                output: Any = "\n".join(_text(rng, 10) for _ in range(size // 60))
                if rng.random() < 0.2:
                    output = [{"type": "text", "text": output or "ok"}, _IMAGE]
                result = {"type": "tool_result", "tool_use_id": call_id, "content": output}
                if rng.random() < 0.1:
                    result["is_error"] = True
                if rng.random() < 0.1:
                    result["cache_control"] = CACHE
                answer.append(result)
            if rng.random() < 0.3:
                answer.append({"type": "text", "text": _text(rng, rng.choice([3, 300]))})
            messages.append({"role": "user", "content": answer})
        elif kind == "text":
            messages.append({"role": "assistant", "content": _text(rng, rng.choice([5, 2_000]))})
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "text", "text": _text(rng, rng.choice([5, 500]))}],
                }
            )
        elif kind == "system":
            messages.append({"role": "system", "content": "Reminder: " + _text(rng, 10)})
        else:
            server = {
                "type": "server_tool_use",
                "id": f"srvtoolu_{step}",
                "name": "web_search",
                "input": {"query": _text(rng, 3)},
            }
            found = {
                "type": "web_search_tool_result",
                "tool_use_id": f"srvtoolu_{step}",
                "content": [
                    {
                        "type": "web_search_result",
                        "url": "https://example.com",
                        "title": "Example",
                        "encrypted_content": "Eq" + "z" * 300,
                    }
                ],
            }
            messages.append(
                {
                    "role": "assistant",
                    "content": [server, found, {"type": "text", "text": "Found it."}],
                }
            )
            messages.append({"role": "user", "content": "Go on."})
    body: Body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": rng.choice([1_024, 4_096]),
        "messages": messages,
        "metadata": {"user_id": "u"},
    }
    if system is not None:
        body["system"] = system
    if rng.random() < 0.5:
        body["tools"] = tools()[:3]
    return body
