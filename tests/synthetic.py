"""Synthetic agent sessions: the project's own fixtures, for tests and benchmarks.

``agent_session`` builds a realistic coding-agent conversation (system prompt,
task, tool calls reading, editing and running things with large outputs,
assistant reasoning, the odd user follow-up). ``conversations`` is the
hypothesis strategy behind the property tests: random mixes of text, tool
groups with several calls, images, huge single messages and earlier summaries.
"""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
from hypothesis import strategies as st

from compaction.chat.own import SUMMARY_MARKER, recorded

Message = dict[str, Any]

_WORDS = (
    "token budget context window request upstream summary tool result file path error "
    "function module test assert config proxy stream chunk header retry limit cache"
).split()
_PATHS = ["src/app.py", "src/server/routes.py", "tests/test_app.py", "README.md", "lib/util.js"]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One entry of an assistant message's ``tool_calls``."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def agent_session(
    seed: int = 0, steps: int = 40, output_chars: int = 4_000, task: str | None = None
) -> list[Message]:
    """A coding-agent conversation of ``steps`` tool-using steps."""
    rng = random.Random(seed)
    messages: list[Message] = [
        {"role": "system", "content": "You are a coding agent. Use the tools to do the task."},
        {"role": "user", "content": task or "Fix the failing test in tests/test_app.py."},
    ]
    for step in range(steps):
        path = rng.choice(_PATHS)
        kind = rng.choice(["read_file", "bash", "edit_file", "bash"])
        if kind == "read_file":
            args: dict[str, Any] = {"path": path}
            output = "\n".join(f"{i}: {_text(rng, 8)}" for i in range(output_chars // 60))
        elif kind == "edit_file":
            args = {"path": path, "old": _text(rng, 30), "new": _text(rng, 40)}
            output = f"Edited {path}."
        else:
            args = {"command": rng.choice(["pytest -q", "ls -R", "git diff", f"cat {path}"])}
            failed = rng.random() < 0.3
            body = "\n".join(_text(rng, 10) for _ in range(output_chars // 70))
            tail = "\nE   AssertionError: expected 3 got 4" if failed else ""
            output = f"<returncode>{int(failed)}</returncode>\n<output>\n{body}{tail}\n</output>"
        call_id = f"call_{seed}_{step}"
        messages.append(
            {
                "role": "assistant",
                "content": f"Step {step}: {_text(rng, rng.randint(5, 60))}",
                "tool_calls": [tool_call(call_id, kind, args)],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        if rng.random() < 0.08:
            messages.append({"role": "user", "content": f"Also: {_text(rng, 12)}"})
    messages.append({"role": "assistant", "content": "The fix is in place and tests pass."})
    return messages


# --- hypothesis ------------------------------------------------------------

_text_st = st.text(
    alphabet=st.sampled_from("abcdefghij klmnop\nqrst.,:/_-0123456789"), min_size=0, max_size=400
)


@st.composite
def _big_text(draw: st.DrawFn) -> str:
    size = draw(st.sampled_from([600, 2_500, 12_000, 60_000]))
    word = draw(st.sampled_from(["lorem ", "x", "line of output\n", '{"k": 1} ']))
    return (word * (size // len(word) + 1))[:size]


_any_text = st.one_of(_text_st, _text_st, _text_st, _big_text())


@st.composite
def _tool_group(draw: st.DrawFn, index: int) -> list[Message]:
    n = draw(st.integers(1, 3))
    calls, results = [], []
    for k in range(n):
        call_id = f"c{index}_{k}"
        name = draw(st.sampled_from(["read_file", "bash", "write_file", "search", "mystery"]))
        arg = draw(st.one_of(_text_st, _big_text()))
        key = {"read_file": "path", "write_file": "path", "bash": "command"}.get(name, "query")
        calls.append(tool_call(call_id, name, {key: arg, "extra": draw(_text_st)}))
        results.append({"role": "tool", "tool_call_id": call_id, "content": draw(_any_text)})
    content = draw(st.one_of(st.none(), _text_st))
    return [{"role": "assistant", "content": content, "tool_calls": calls}, *results]


@st.composite
def _item(draw: st.DrawFn, index: int) -> list[Message]:
    kind = draw(st.sampled_from(["user", "assistant", "tool", "tool", "tool", "image", "summary"]))
    if kind == "tool":
        return draw(_tool_group(index))
    if kind == "image":
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        return [{"role": "user", "content": [{"type": "text", "text": draw(_text_st)}, image]}]
    if kind == "summary":
        return [
            recorded({"role": "user", "content": f"{SUMMARY_MARKER}\n## Goal\n{draw(_text_st)}"})
        ]
    return [{"role": kind, "content": draw(_any_text)}]


@st.composite
def conversations(draw: st.DrawFn, max_items: int = 30) -> list[Message]:
    """A valid conversation: system prompt, task, then random groups."""
    messages: list[Message] = [
        {"role": "system", "content": draw(_text_st)},
        {"role": "user", "content": draw(_text_st)},
    ]
    for index in range(draw(st.integers(0, max_items))):
        messages.extend(draw(_item(index)))
    return messages


def shell_step(rng: random.Random, i: int) -> list[Message]:
    """One step of an agent loop as a client resends it: a shell call and its output
    (a few hundred tokens), and every 25th step a word from the user."""
    call_id = f"call_{i}"
    command = rng.choice(["pytest -q", "git diff", f"cat src/mod{i % 7}.py", "ls -R src"])
    output = "\n".join(f"line {k}: " + "x" * rng.randint(20, 90) for k in range(rng.randint(5, 60)))
    turn: list[Message] = [
        {
            "role": "assistant",
            "content": f"Step {i}: checking {command}.",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": orjson.dumps({"command": command}).decode(),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]
    if i % 25 == 24:
        turn.append({"role": "user", "content": f"Progress check {i}: keep going."})
    return turn


def qwen_shell_turn(turn: int, error_line: str) -> list[Message]:
    """One qwen-code step: the user's ask, a ``run_shell_command`` call, its
    output as qwen-code frames it (a bulk of passing tests, then
    ``error_line``, then its trailer), and the assistant's note."""
    command = f"python -m pytest -x tests/test_step{turn}.py"
    call_id = f"call_{turn:04d}"
    passing = "\n".join(
        f"tests/test_step{turn}.py::test_case_{k} PASSED [{k * 4:>3}%]" for k in range(25)
    )
    output = (
        f"Command: {command}\nDirectory: (root)\nOutput: {passing}\n"
        f"tests/test_step{turn}.py::test_last FAILED\n{error_line}\n"
        f"Error: (none)\nExit Code: 1\nSignal: (none)"
    )
    arguments = {"command": command, "description": f"run step {turn}", "is_background": False}
    return [
        {"role": "user", "content": f"Step {turn}: run the tests and fix what fails."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call(call_id, "run_shell_command", arguments)],
        },
        {"role": "tool", "tool_call_id": call_id, "content": output},
        {"role": "assistant", "content": f"Step {turn} still fails; I'll look at the parser."},
    ]
