"""Responses requests as the real clients send them, and chat conversations converted.

``codex_request`` writes down what Codex 0.171 was seen to send (``stream``,
``store: false``, ``include: ["reasoning.encrypted_content"]``,
``prompt_cache_key``, ``client_metadata``, ``parallel_tool_calls``, the whole
input on every turn; item shapes from codex-rs/protocol/src/models.rs:
``reasoning`` with ``summary`` / ``encrypted_content``, ``function_call``
with ``call_id`` and JSON ``arguments``, ``custom_tool_call`` for
``apply_patch``). ``chat_to_responses`` turns a chat-completions body (the
corpus in ``../shared/fixtures``, ``tests.synthetic``) into the same
conversation as Responses items, each assistant turn with a reasoning item.
"""

from __future__ import annotations

import json
import random
from typing import Any

from compaction import message_text
from tests.synthetic import agent_session

TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command and returns its output.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "array", "items": {"type": "string"}},
                "workdir": {"type": "string"},
                "timeout_ms": {"type": "number"},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Use the `apply_patch` tool to edit files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"},
    },
]


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _reasoning(tag: str, text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": f"rs_{tag}",
        "summary": [{"type": "summary_text", "text": text}],
        "content": None,
        "encrypted_content": "gAAAAB" + tag * 40,
    }


def codex_request(turns: int = 40, seed: int = 0, output_chars: int = 4_000) -> dict[str, Any]:
    """A Codex-shaped request: instructions, then ``turns`` reasoning + call + output turns."""
    rng = random.Random(seed)
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "<permissions instructions>sandbox"}],
        },
        _user("<environment_context>\n  <cwd>/work/app</cwd>\n</environment_context>"),
        _user("Fix the failing test in tests/test_app.py."),
    ]
    for step in range(turns):
        tag = f"{seed}x{step}"
        items.append(_reasoning(tag, f"**Inspecting** step {step}: " + "why " * rng.randint(5, 40)))
        if step % 5 == 4:
            patch = "*** Begin Patch\n*** Update File: src/app.py\n" + "+line\n" * 200
            items.append(
                {
                    "type": "custom_tool_call",
                    "status": "completed",
                    "call_id": f"call_{tag}",
                    "name": "apply_patch",
                    "input": patch + "*** End Patch",
                }
            )
            output = '{"output":"Success. Updated the following files:\\nM src/app.py\\n"}'
            items.append(
                {"type": "custom_tool_call_output", "call_id": f"call_{tag}", "output": output}
            )
            continue
        command = ["bash", "-lc", rng.choice(["pytest -q", "cat src/app.py", "rg window"])]
        items.append(
            {
                "type": "function_call",
                "name": "shell",
                "arguments": json.dumps({"command": command, "workdir": "/work/app"}),
                "call_id": f"call_{tag}",
            }
        )
        lines = "\n".join(f"{i}: " + "output text " * 5 for i in range(output_chars // 70))
        items.append(
            {
                "type": "function_call_output",
                "call_id": f"call_{tag}",
                "output": f"Exit code: {step % 2}\nWall time: 0.3 seconds\nOutput:\n{lines}",
            }
        )
        if step % 9 == 8:
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"Progress after {step} steps."}],
                }
            )
            items.append(_user(f"Also check step {step}."))
    return {
        "model": "gpt-5-codex",
        "instructions": "You are Codex, based on GPT-5. You are running as a coding agent.\n" * 20,
        "input": items,
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a7c0-5b52-7c31-9d0e-2d1c4b1f3a77",
        "client_metadata": {"originator": "codex_exec"},
        "text": {"verbosity": "medium"},
    }


def chat_to_responses(body: dict[str, Any], reasoning: bool = True) -> dict[str, Any]:
    """A chat-completions body as a Responses body: the first system message becomes
    ``instructions``, assistant turns reasoning + message + function calls."""
    messages = list(body.get("messages") or [])
    out: dict[str, Any] = {"model": body.get("model") or "gpt-4o"}
    if messages and messages[0].get("role") == "system":
        out["instructions"] = message_text(messages.pop(0))
    items: list[dict[str, Any]] = []
    for number, message in enumerate(messages):
        role = message.get("role")
        text = message_text(message)
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": text,
                }
            )
        elif role == "assistant":
            if reasoning:
                items.append(_reasoning(f"{number}", f"Thinking about turn {number}."))
            if text:
                part = {"type": "output_text", "text": text, "annotations": []}
                items.append(
                    {
                        "type": "message",
                        "id": f"msg_{number}",
                        "role": "assistant",
                        "content": [part],
                    }
                )
            for k, call in enumerate(message.get("tool_calls") or ()):
                function = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "id": f"fc_{number}_{k}",
                        "call_id": call.get("id"),
                        "name": function.get("name", ""),
                        "arguments": function.get("arguments", ""),
                        "status": "completed",
                    }
                )
        elif role in ("system", "developer"):
            items.append({"role": "developer", "content": text})
        else:
            content = message.get("content")
            if isinstance(content, list):
                parts = [
                    {"type": "input_text", "text": p["text"]}
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                    else {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
                    for p in content
                ]
                items.append({"role": "user", "content": parts})
            else:
                items.append({"role": "user", "content": text})
    out["input"] = items
    if body.get("tools"):
        out["tools"] = [
            {"type": "function", **(t.get("function") or {})}
            for t in body["tools"]
            if isinstance(t, dict)
        ]
    if body.get("max_tokens"):
        out["max_output_tokens"] = body["max_tokens"]
    return out


def synthetic_request(seed: int = 0, steps: int = 40) -> dict[str, Any]:
    return chat_to_responses({"model": "gpt-4o", "messages": agent_session(seed, steps)})
