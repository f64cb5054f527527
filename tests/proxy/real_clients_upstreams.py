"""What the real-client tests stand on besides the CLIs: scripted upstreams
and a record of the proxy's answers.

* :class:`RecordingApp` wraps the proxy's ASGI app and keeps the status and
  headers of every answer (the ``x-compaction-*`` figures the CLIs never show).
* :class:`FocusAnthropicUpstream` and :class:`FocusResponsesUpstream`: scripted
  upstreams whose summaries have the sections the proxy asks for and name the
  ``<focus>`` its summarizer prompt carried (so a test can tell which
  compaction a forwarded summary came from), and whose text answers can be
  long (a chat whose answers outgrow the verbatim tail).
* :class:`ParallelResponsesUpstream` issues two calls in one model turn.
* :class:`ToolSearchAnthropicUpstream` calls Claude Code's ``ToolSearch`` tool
  once, so the CLI answers with ``tool_reference`` blocks.
* :class:`AgentChatUpstream`: a Chat Completions model that calls a tool a
  turn (qwen-code's API).
* :func:`focus_of` and :func:`compacted_figures` read a summarizer request's
  focus and the proxy's ``/compact`` answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from compaction.summary.prompts import TURN_PREFIX_SYSTEM_PROMPT
from tests.proxy.dialects.anthropic.upstream import AnthropicUpstream, is_summary_request
from tests.proxy.dialects.anthropic.upstream import _events as anthropic_events
from tests.proxy.dialects.responses.upstream import Received as ResponsesReceived
from tests.proxy.dialects.responses.upstream import ResponsesUpstream
from tests.proxy.dialects.responses.upstream import _message as message_item
from tests.proxy.servers import SUMMARY_TEXT, TURN_PREFIX_TEXT, FakeUpstream, Received

_FOCUS = re.compile(r"<focus>\s*(.*?)\s*</focus>", re.S)
#: The proxy's answer to ``/compact`` (proxy/flow/manual.py's wording).
COMPACTED = re.compile(
    r"Context compacted: ([\d,]+) → ([\d,]+) tokens \((\d+) messages condensed\)"
)


def focus_of(body: Any) -> str | None:
    """The ``<focus>`` of a summarizer request (the ``/compact`` instructions), if
    any, as the user typed it: the prompt quotes each of its lines with ``> ``."""
    found = _FOCUS.search(json.dumps(body, ensure_ascii=False).replace("\\n", "\n"))
    if found is None:
        return None
    return "\n".join(line.removeprefix(">").strip() for line in found.group(1).splitlines())


def compacted_figures(text: str) -> tuple[int, int, int]:
    """(tokens before, tokens after, messages condensed) of the proxy's ``/compact`` reply."""
    found = COMPACTED.search(text)
    assert found is not None, f"not the proxy's /compact reply: {text!r}"
    before, after, condensed = found.groups()
    return int(before.replace(",", "")), int(after.replace(",", "")), int(condensed)


# --- the proxy's answers -------------------------------------------------------


@dataclass
class Answered:
    """One answer of the proxy: its path, status and headers (lower-cased names)."""

    path: str
    status: int
    headers: dict[str, str]

    def tokens(self) -> tuple[int, int]:
        """``x-compaction-tokens-before`` and ``-after``."""
        return (
            int(self.headers["x-compaction-tokens-before"]),
            int(self.headers["x-compaction-tokens-after"]),
        )


@dataclass
class RecordingApp:
    """An ASGI app that records the status and headers of each answer of ``app``."""

    app: ASGIApp
    answered: list[Answered] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
                self.answered.append(Answered(scope["path"], message["status"], headers))
            await send(message)

        await self.app(scope, receive, recording)

    def on(self, path: str, since: int = 0) -> list[Answered]:
        """Answers on ``path`` from the ``since``-th answer on."""
        return [a for a in self.answered[since:] if a.path == path]

    def compactions(self, path: str) -> list[Answered]:
        """Answers on ``path`` that compacted now (not forwarded as sent, not reused)."""
        return [
            a
            for a in self.answered
            if a.path.endswith(path)
            and a.headers.get("x-compaction-stage") not in (None, "none", "reused")
        ]


# --- scripted upstreams whose summaries name their focus -----------------------


@dataclass
class FocusAnthropicUpstream(AnthropicUpstream):
    """:class:`AnthropicUpstream` whose summaries end with ``Focus: <focus>``
    when the summarizer request carried one, and whose answers are ``answer``'s."""

    #: The text of the ``n``-th answer that is not a tool call (default: the base class's).
    answer: Callable[[int], str] | None = None
    _texts: int = 0

    def _answer(self, received: Any, body: dict[str, Any]) -> Response:
        calls = self._answered
        response = super()._answer(received, body)
        if (
            self.answer is None
            or response.status_code != 200
            or is_summary_request(body)
            or self._answered != calls
        ):
            return response
        message = {
            "id": f"msg_answer{len(self.received):04d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude"),
            "content": [{"type": "text", "text": self.answer(self._texts)}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": received.prompt_tokens, "output_tokens": 10},
        }
        self._texts += 1
        if body.get("stream") is True:
            return StreamingResponse(anthropic_events(message), media_type="text/event-stream")
        return JSONResponse(message)

    def _summary(self, body: dict[str, Any]) -> str:
        text = super()._summary(body)
        focus = focus_of(body)
        return f"{text}\n- Focus: {focus}" if focus else text


@dataclass
class FocusResponsesUpstream(ResponsesUpstream):
    """:class:`ResponsesUpstream` whose summaries have the sections the proxy
    asks for (a turn prefix's to a turn-prefix request) and end with
    ``Focus: <focus>`` when the summarizer request carried one, and whose
    answers are ``answer``'s."""

    #: The text of the ``n``-th answer that is not a tool call (default: the base class's).
    answer: Callable[[int], str] | None = None
    _texts: int = 0

    def _answer(self, received: ResponsesReceived) -> Response:
        body = received.json()
        calls = len(self.issued)
        response = self._summary_or_turn(received, body)
        if (
            self.answer is None
            or response.status_code != 200
            or not body.get("tools")
            or len(self.issued) != calls
        ):
            return response
        text = self.answer(self._texts)
        self._texts += 1
        return self._reply(body, [message_item(len(self.received), text)], received.input_tokens)

    def _summary_or_turn(self, received: ResponsesReceived, body: dict[str, Any]) -> Response:
        instructions = body.get("instructions") if isinstance(body, dict) else None
        prefix = isinstance(instructions, str) and instructions.startswith(
            TURN_PREFIX_SYSTEM_PROMPT.split("\n", 1)[0]
        )
        focus = focus_of(body)
        # The summary this request gets (the base class answers with it).
        self.summary_text = (TURN_PREFIX_TEXT if prefix else SUMMARY_TEXT) + (
            f"\n- Focus: {focus}" if focus else ""
        )
        return super()._answer(received)


@dataclass
class ParallelResponsesUpstream(ResponsesUpstream):
    """:class:`ResponsesUpstream` that issues a second call beside the ``step``-th
    (parallel tool calls, as the API issues them: one reasoning item, then the
    calls), with the arguments ``beside`` gives it."""

    beside_at: int = -1
    beside: Mapping[str, Any] = field(default_factory=dict)

    def _tool_call(self, body: dict[str, Any], step: int) -> list[dict[str, Any]]:
        items = super()._tool_call(body, step)
        if step != self.beside_at:
            return items
        reasoning, call = items
        second = {
            **call,
            "id": call["id"] + "_beside",
            "call_id": call["call_id"] + "_beside",
            "arguments": json.dumps(self.beside),
        }
        self.issued[second["id"]] = reasoning["id"]
        return [reasoning, call, second]


#: Claude Code's tool that loads deferred tools (its result is ``tool_reference`` blocks).
TOOL_SEARCH = "ToolSearch"


@dataclass
class ToolSearchAnthropicUpstream(AnthropicUpstream):
    """:class:`AnthropicUpstream` whose ``search_at``-th tool call is Claude Code's
    ``ToolSearch`` selecting the deferred tools ``select`` by name, when the
    request offers that tool (Claude Code answers with a ``tool_result`` of
    ``tool_reference`` blocks, which load those tools on the real API).
    :attr:`search_id` is that call's id, ``None`` while it was not made."""

    search_at: int = 1
    select: tuple[str, ...] = ("WebFetch", "NotebookEdit")
    search_id: str | None = None

    def _tool_call(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        content = super()._tool_call(body)
        tools = body.get("tools")
        offered = {t.get("name") for t in tools if isinstance(t, dict)} if tools else set()
        if self._answered != self.search_at or TOOL_SEARCH not in offered:
            return content
        call = content[-1]
        call["name"] = TOOL_SEARCH
        call["input"] = {"query": "select:" + ",".join(self.select), "max_results": 5}
        self.search_id = call["id"]
        return content


# --- a Chat Completions agent (qwen-code) -----------------------------------------


@dataclass
class AgentChatUpstream(FakeUpstream):
    """:class:`FakeUpstream` as an agent's model: each turn request is answered
    with one tool call (``tool_call`` gives its name and arguments for the
    ``step``-th), streamed as the API streams one, until ``tool_turns`` calls
    were issued; then the fake's text answer. Its window and summaries are the
    fake's. Counting the calls issued, not the results seen, keeps an agent
    whose results the proxy compacted away from calling tools for ever."""

    tool_turns: int = 3
    tool_call: Callable[[int], tuple[str, dict[str, Any]]] = lambda step: (
        "read_file",
        {"file_path": f"part{step}.txt"},
    )
    issued: int = 0

    async def _answer(self, request: Request, received: Received, body: dict[str, Any]) -> Response:
        prompt = self.prompt_tokens(body)
        if self.issued >= self.tool_turns or self._over_window(body, prompt):
            return await super()._answer(request, received, body)
        received.prompt_tokens = prompt
        step, self.issued = self.issued, self.issued + 1
        name, arguments = self.tool_call(step)
        call = {"id": f"call_{step:04d}", "type": "function", "function": {"name": name}}
        text = json.dumps(arguments)
        usage = {"prompt_tokens": prompt, "completion_tokens": 9, "total_tokens": prompt + 9}
        if body.get("stream") is not True:
            whole = {**call, "function": {"name": name, "arguments": text}}
            message = {"role": "assistant", "content": None, "tool_calls": [whole]}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            return JSONResponse({**_chunk(body, "chat.completion", [choice]), "usage": usage})
        opened = {**call, "index": 0, "function": {"name": name, "arguments": ""}}
        rest = {"index": 0, "function": {"arguments": text}}
        chunks = [
            [{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [opened]}}],
            [{"index": 0, "delta": {"tool_calls": [rest]}}],
            [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
        ]
        events = [_chunk(body, "chat.completion.chunk", choices) for choices in chunks]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**_chunk(body, "chat.completion.chunk", []), "usage": usage})
        raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
        return Response(raw + b"data: [DONE]\n\n", media_type="text/event-stream")


def _chunk(body: dict[str, Any], kind: str, choices: list[Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-agent",
        "object": kind,
        "created": 1,
        "model": body.get("model", "fake"),
        "choices": choices,
    }
