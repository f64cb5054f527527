"""Scripted models for the real-client recall tests: an agent that reads a file,
keeps working until the proxy prunes that read, recalls it, and edits the file.

:class:`RecallingAnthropicUpstream` (Claude Code's Messages API) and
:class:`RecallingResponsesUpstream` (Codex's Responses API) play the same
:class:`Task`, deciding each answer from the request in front of them, as a
model does:

1. no read of the task's file yet: read it with the client's own tool
   (Claude Code's ``Read``, Codex's ``exec_command`` with ``cat``);
2. ``compaction_recall`` offered and the read's result now a brief with a
   ``[ref: …]``: call ``compaction_recall`` with that ref (alone);
3. otherwise read the next of the task's notes (work that grows the
   conversation until the proxy prunes), and when none is left, say so
   (:data:`NEVER_OFFERED`: the test then fails on the missing edit);
4. the request ends with the recall's result: edit the file with the client's
   own tool (Claude Code's ``Edit`` with ``old_string`` taken from the recalled
   text; Codex's ``apply_patch`` through ``exec_command``), the changed line
   built from what was recalled, never from what the test knows;
5. the request ends with the edit's result: a closing text, :data:`FINISHED`.

Each keeps the base upstream's rules (pairing, thinking signatures, required
reasoning items, the summarizer's answers) and records every request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import JSONResponse, Response, StreamingResponse

from tests.proxy.dialects.anthropic.sessions import signature
from tests.proxy.dialects.anthropic.upstream import (
    AnthropicUpstream,
    error_body,
    is_summary_request,
)
from tests.proxy.dialects.anthropic.upstream import _events as anthropic_events
from tests.proxy.dialects.responses.upstream import (
    OUTPUT_TYPES,
    Received,
    ResponsesUpstream,
    _is_summary_request,
    _message,
    input_tokens,
    pairing_errors,
)

TOOL = "compaction_recall"
FINISHED = "The timeout is raised to 60 seconds."
NEVER_OFFERED = "compaction_recall was never offered."
_REF = re.compile(r"\[ref: (r[a-z0-9]+)\]")
#: Claude Code's Read prefixes each line with its number and a tab.
_LINE_NUMBER = re.compile(r"^\s*\d+\t")


@dataclass(frozen=True)
class Task:
    #: The file to read and edit (absolute for Claude Code, relative for Codex).
    path: str
    #: What marks the line to change, and the change (``old`` → ``new`` in it).
    marker: str
    old: str
    new: str
    #: Files read while working, one per answer, until the proxy offers recall.
    notes: tuple[str, ...]


def recalled_line(text: str, marker: str) -> str | None:
    """The line of ``text`` holding ``marker``, as it is in the file (a read's
    line-number prefix removed)."""
    for line in text.splitlines():
        if marker in line:
            return _LINE_NUMBER.sub("", line, count=1)
    return None


def brief_ref(text: str) -> str | None:
    found = _REF.search(text)
    return found.group(1) if found else None


# --- Claude Code: Anthropic Messages ------------------------------------------------


def _result_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return content if isinstance(content, str) else ""


def _anthropic_results(messages: list[Any]) -> dict[str, str]:
    """tool_use_id → the text of its result, over the whole conversation."""
    found: dict[str, str] = {}
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                found[block.get("tool_use_id", "")] = _result_text(block.get("content"))
    return found


def _last_result(messages: list[Any]) -> tuple[str, str] | None:
    """(tool_use_id, text) of the last tool result of the request's last message."""
    last = messages[-1] if messages else {}
    content = last.get("content") if last.get("role") == "user" else None
    results = [b for b in content or () if isinstance(b, dict) and b.get("type") == "tool_result"]
    if not results:
        return None
    return results[-1].get("tool_use_id", ""), _result_text(results[-1].get("content"))


@dataclass
class RecallingAnthropicUpstream(AnthropicUpstream):
    task: Task = field(default_factory=lambda: Task("", "", "", "", ()))
    #: The ids of the calls this model issued, by what they were for.
    read_id: str = "toolu_read_task"
    recall_id: str = "toolu_recall"
    edit_id: str = "toolu_edit"
    _worked: int = 0

    def recall_results(self) -> list[str]:
        """The text of each request's final recall result (the proxy's recall rounds)."""
        found = []
        for received in self.message_requests:
            last = _last_result(received.json().get("messages") or [])
            if last is not None and last[0] == self.recall_id:
                found.append(last[1])
        return found

    def _answer(self, received: Any, body: dict[str, Any]) -> Response:
        refusal = self.refusal(body)
        if refusal is not None:
            return JSONResponse(error_body("invalid_request_error", refusal), 400)
        prompt = received.prompt_tokens = self.prompt_tokens(body)
        if is_summary_request(body) or not body.get("tools"):
            return super()._answer(received, body)
        content, stop = self._decide(body)
        thinking = body.get("thinking")
        if stop == "tool_use" and isinstance(thinking, dict) and thinking.get("type") != "disabled":
            text = f"Thinking before answer {len(self.received)}."
            content.insert(0, {"type": "thinking", "thinking": text, "signature": signature(text)})
        message = {
            "id": f"msg_recalling{len(self.received):04d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": 10},
        }
        if body.get("stream") is True:
            return StreamingResponse(anthropic_events(message), media_type="text/event-stream")
        return JSONResponse(message)

    def _decide(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        messages = body.get("messages") or []
        task = self.task
        last = _last_result(messages)
        if last is not None and last[0] == self.edit_id:
            return [{"type": "text", "text": FINISHED}], "end_turn"
        if last is not None and last[0] == self.recall_id:
            line = recalled_line(last[1], task.marker)
            if line is None:
                return [
                    {"type": "text", "text": f"The recall held no {task.marker!r}."}
                ], "end_turn"
            edit = {
                "file_path": task.path,
                "old_string": line,
                "new_string": line.replace(task.old, task.new),
            }
            return self._call(self.edit_id, "Edit", edit, "Changing the timeout.")
        results = _anthropic_results(messages)
        if self.read_id not in results:
            return self._call(self.read_id, "Read", {"file_path": task.path}, "Reading it.")
        offered = any(t.get("name") == TOOL for t in body.get("tools") or ())
        ref = brief_ref(results[self.read_id])
        if offered and ref is not None:
            return self._call(self.recall_id, TOOL, {"ref": ref}, "Let me see the original.")
        if self._worked < len(task.notes):
            self._worked += 1
            path = task.notes[self._worked - 1]
            return self._call(f"toolu_note{self._worked:02d}", "Read", {"file_path": path}, "")
        return [{"type": "text", "text": NEVER_OFFERED}], "end_turn"

    @staticmethod
    def _call(
        call_id: str, name: str, tool_input: dict[str, Any], say: str
    ) -> tuple[list[dict[str, Any]], str]:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": say}] if say else []
        blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": tool_input})
        return blocks, "tool_use"


# --- Codex: OpenAI Responses ---------------------------------------------------------


def _outputs(items: list[Any]) -> dict[str, str]:
    """call_id → the output of that call, over the whole input."""
    return {
        item.get("call_id", ""): str(item.get("output"))
        for item in items
        if isinstance(item, dict) and item.get("type") in OUTPUT_TYPES
    }


@dataclass
class RecallingResponsesUpstream(ResponsesUpstream):
    task: Task = field(default_factory=lambda: Task("", "", "", "", ()))
    read_id: str = "call_read_task"
    recall_id: str = "call_recall"
    edit_id: str = "call_edit"
    _worked: int = 0

    def recall_results(self) -> list[str]:
        """The output of each request's final recall result (the proxy's recall rounds)."""
        found = []
        for received in self.turn_requests:
            items = received.json().get("input") or []
            last = items[-1] if items else {}
            if last.get("type") in OUTPUT_TYPES and last.get("call_id") == self.recall_id:
                found.append(str(last.get("output")))
        return found

    def _answer(self, received: Received) -> Response:
        body = received.json()
        items = body.get("input")
        if isinstance(items, str) or _is_summary_request(body):
            return super()._answer(received)
        items = items or []
        problems = pairing_errors(items, self.issued)
        if problems:
            return super()._answer(received)  # the base class refuses it in the API's words
        prompt = received.input_tokens = input_tokens(body, self.counter)
        return self._reply(body, self._decide(body, items), prompt)

    def _decide(self, body: dict[str, Any], items: list[Any]) -> list[dict[str, Any]]:
        task = self.task
        number = len(self.received)
        last = items[-1] if items else {}
        last_call = last.get("call_id") if last.get("type") in OUTPUT_TYPES else None
        if last_call == self.edit_id:
            return [_message(number, FINISHED)]
        if last_call == self.recall_id:
            line = recalled_line(str(last.get("output")), task.marker)
            if line is None:
                return [_message(number, f"The recall held no {task.marker!r}.")]
            patch = "\n".join(
                [
                    "apply_patch <<'PATCH'",
                    "*** Begin Patch",
                    f"*** Update File: {task.path}",
                    "@@",
                    f"-{line}",
                    f"+{line.replace(task.old, task.new)}",
                    "*** End Patch",
                    "PATCH",
                ]
            )
            return self._call(self.edit_id, "exec_command", {"cmd": patch})
        outputs = _outputs(items)
        if self.read_id not in outputs:
            return self._call(self.read_id, "exec_command", {"cmd": f"cat {task.path}"})
        offered = any(t.get("name") == TOOL for t in body.get("tools") or ())
        ref = brief_ref(outputs[self.read_id])
        if offered and ref is not None:
            return self._call(self.recall_id, TOOL, {"ref": ref})
        if self._worked < len(task.notes):
            self._worked += 1
            cat = {"cmd": f"cat {task.notes[self._worked - 1]}"}
            return self._call(f"call_note{self._worked:02d}", "exec_command", cat)
        return [_message(number, NEVER_OFFERED)]

    def _call(self, call_id: str, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        number = len(self.received)
        reasoning_id, item_id = f"rs_{number:04d}", f"fc_{number:04d}"
        self.issued[item_id] = reasoning_id
        return [
            {
                "id": reasoning_id,
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": f"Answer {number}."}],
                "encrypted_content": f"gAAAAB{'y' * 120}{number:04d}",
            },
            {
                "id": item_id,
                "type": "function_call",
                "status": "completed",
                "call_id": call_id,
                "name": name,
                "arguments": orjson.dumps(arguments).decode(),
            },
        ]


def tool_uses(events: Iterable[dict[str, Any]]) -> list[str]:
    """The names of the tool calls in Claude Code's stream-json output."""
    names: list[str] = []
    for event in events:
        message = event.get("message") if event.get("type") == "assistant" else None
        for block in (message or {}).get("content") or ():
            if isinstance(block, dict) and block.get("type") == "tool_use":
                names.append(str(block.get("name")))
    return names


def strip_cache_marks(value: Any) -> Any:
    """``value`` without ``cache_control`` (the breakpoints a client moves each turn)."""
    if isinstance(value, dict):
        return {k: strip_cache_marks(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache_marks(v) for v in value]
    return value
