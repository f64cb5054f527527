"""A scripted model that recalls what the proxy removed, in all three APIs, on loopback.

:class:`RecallUpstream` is a Starlette app (serve it with
:func:`tests.proxy.servers.serve_in_thread`) answering
``/v1/chat/completions``, ``/v1/messages`` and ``/v1/responses`` as a model
that needs a line it can no longer see:

* a request offered ``compaction_recall`` whose text holds a ``[ref: …]``
  gets a call to it for that ref (or for ``ref``, when the test sets one),
  after a little text in a stream ("Let me look at the original.");
* a conversation that already holds a call to it asks for nothing more;
* a request whose last turn is that tool's result gets a text answer,
  ``RECALLED: <the first line of the result holding "needle">`` (or
  ``RECALLED: <its first line>``);
* with ``always`` set it calls the tool on every request that offers it and
  whose ``tool_choice`` allows tools, to test the proxy's round limit
  (``stubborn``: even when neither is so); with ``client_tool`` set, a
  request that no longer offers it gets a call to that client tool;
* anything else gets ``NO RECALL``.

It can also be a server with a stricter request schema: ``refuses_null``
answers a request whose conversation holds a ``"content": null`` with a 500,
as llama-cpp-python does (its schema takes a string or no key); and
``refuses_followups`` answers every request that holds a call to the tool
with a 500. Either 500 quotes what it refused, as a validation error does.

Answers are the APIs' real shapes, JSON or the real event sequence, with
``usage``. Every request is recorded (:attr:`received`, parsed).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

TOOL = "compaction_recall"
_REF = re.compile(rb"\[ref: (r[a-z0-9]+)\]")
PREAMBLE = "Let me look at the original."
#: The events that end a stream, in each API.
_LAST = re.compile(rb"\[DONE\]|message_stop|response\.completed")


@dataclass
class RecallUpstream:
    #: A ref to ask for instead of the first found (another owner's, an unknown one).
    ref: str | None = None
    #: Call the tool whenever the request lets the model call tools.
    always: bool = False
    #: ... and even when it says to call none (a model that does not listen).
    stubborn: bool = False
    #: What the model writes in the turn that calls the tool (whole answers).
    turn_text: str | None = None
    #: Once the tool is no longer offered, go on working with this client tool
    #: (a call with ``{"path": "app.py"}``) instead of answering in text.
    client_tool: str | None = None
    #: Stream a little text before the call; without it, the calling turn
    #: streams its content as ``""`` alone (Chat Completions).
    preamble: bool = True
    #: Refuse a conversation that holds ``"content": null`` (a 500, quoting it).
    refuses_null: bool = False
    #: Refuse a conversation that holds a call to the tool (a 500, quoting it).
    refuses_followups: bool = False
    #: End a streamed text answer before its API's last event (a server that
    #: closed the stream early: no ``[DONE]``, ``message_stop`` or ``response.completed``).
    cut_answers: bool = False
    #: Every request, parsed, in order, with its API ("chat", "anthropic", "responses").
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: The raw bytes of each request, in the same order.
    raw: list[bytes] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/messages", self._anthropic, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
            ]
        )

    # --- what the model decides -------------------------------------------------

    def _decide(self, conversation: bytes, offered: bool, allowed: bool, result: str | None) -> Any:
        """``("call", ref)``, ``("client", tool)`` or ``("text", text)``."""
        allowed = allowed or self.stubborn
        offered = offered or self.stubborn
        if result is not None and self.client_tool and allowed and not offered:
            return "client", self.client_tool
        if result is not None and not (self.always and allowed and offered):
            lines = result.splitlines() or [""]
            line = next((x for x in lines if "needle" in x), lines[0])
            return "text", f"RECALLED: {line}"
        if offered and allowed:
            found = _REF.search(conversation)  # not the tools' bytes
            ref = self.ref or (found.group(1).decode() if found else None)
            # A model that has recalled before in this conversation has the
            # original in front of it, and asks for nothing more.
            if ref is not None and (self.always or TOOL.encode() not in conversation):
                return "call", ref
        return "text", "NO RECALL"

    async def _read(self, request: Request, api: str) -> dict[str, Any]:
        raw = await request.body()
        body: dict[str, Any] = orjson.loads(raw)
        self.received.append((api, body))
        self.raw.append(raw)
        return body

    def _refusal(self, body: dict[str, Any]) -> Response | None:
        """A 500 quoting what a stricter schema refuses, or ``None``."""
        conversation = body.get("messages", body.get("input"))
        items = conversation if isinstance(conversation, list) else []
        nulls = [
            item for item in items if isinstance(item, dict) and item.get("content", "") is None
        ]
        refused = nulls if self.refuses_null else []
        if self.refuses_followups and TOOL.encode() in orjson.dumps(items):
            refused = items
        if not refused:
            return None
        message = f"1 validation error: input_value={orjson.dumps(refused).decode()}"
        return JSONResponse({"error": {"message": message, "type": "internal_server_error"}}, 500)

    # --- Chat Completions ---------------------------------------------------------

    async def _chat(self, request: Request) -> Response:
        body = await self._read(request, "chat")
        refusal = self._refusal(body)
        if refusal is not None:
            return refusal
        tools = body.get("tools") or []
        offered = any((t.get("function") or {}).get("name") == TOOL for t in tools)
        allowed = body.get("tool_choice") != "none"
        messages = body.get("messages") or []
        result = None
        if messages and messages[-1].get("role") == "tool":
            result = str(messages[-1].get("content"))
        kind, value = self._decide(orjson.dumps(messages), offered, allowed, result)
        n = len(self.received)
        usage = {"prompt_tokens": 100 * n, "completion_tokens": 10, "total_tokens": 100 * n + 10}
        if kind != "text":
            name, arguments = _called(kind, value)
            call = {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
            }
            message: dict[str, Any] = {
                "role": "assistant",
                "content": self.turn_text,
                "tool_calls": [call],
            }
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": value}, "stop"
        if not body.get("stream"):
            answer = {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": 1,
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            }
            return JSONResponse(answer)
        include_usage = (body.get("stream_options") or {}).get("include_usage") is True
        return self._streamed(
            kind,
            _chat_events(
                n,
                body.get("model"),
                kind,
                value,
                message,
                finish,
                usage,
                include_usage,
                self.preamble,
            ),
        )

    # --- Anthropic Messages ---------------------------------------------------------

    async def _anthropic(self, request: Request) -> Response:
        body = await self._read(request, "anthropic")
        refusal = self._refusal(body)
        if refusal is not None:
            return refusal
        offered = any(t.get("name") == TOOL for t in body.get("tools") or [])
        allowed = (body.get("tool_choice") or {}).get("type") != "none"
        messages = body.get("messages") or []
        result = None
        last = messages[-1] if messages else {}
        if last.get("role") == "user" and isinstance(last.get("content"), list):
            results = [b for b in last["content"] if b.get("type") == "tool_result"]
            if results:
                content = results[-1].get("content")
                if isinstance(content, list):
                    content = "".join(b.get("text", "") for b in content)
                result = str(content)
        kind, value = self._decide(orjson.dumps(messages), offered, allowed, result)
        n = len(self.received)
        usage = {"input_tokens": 100 * n, "output_tokens": 10}
        if kind != "text":
            name, arguments = _called(kind, value)
            blocks: list[dict[str, Any]] = [
                {"type": "text", "text": self.turn_text or PREAMBLE},
                {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": arguments},
            ]
            stop = "tool_use"
        else:
            blocks, stop = [{"type": "text", "text": value}], "end_turn"
        message = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return JSONResponse(message)
        return self._streamed(kind, _anthropic_events(message))

    # --- Responses ---------------------------------------------------------------------

    async def _responses(self, request: Request) -> Response:
        body = await self._read(request, "responses")
        refusal = self._refusal(body)
        if refusal is not None:
            return refusal
        tools = body.get("tools") or []
        offered = any(t.get("name") == TOOL for t in tools)
        allowed = body.get("tool_choice") != "none"
        items = body.get("input")
        result = None
        if isinstance(items, list) and items and items[-1].get("type") == "function_call_output":
            result = str(items[-1].get("output"))
        kind, value = self._decide(orjson.dumps(items), offered, allowed, result)
        n = len(self.received)
        usage = {"input_tokens": 100 * n, "output_tokens": 10, "total_tokens": 100 * n + 10}
        if kind != "text":
            name, arguments = _called(kind, value)
            output: list[dict[str, Any]] = [
                *([_message_item(f"msg_{n}_0", self.turn_text)] if self.turn_text else []),
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": name,
                    "arguments": orjson.dumps(arguments).decode(),
                    "status": "completed",
                },
            ]
        else:
            output = [_message_item(f"msg_{n}", value)]
        response = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": body.get("model"),
            "output": output,
            "usage": usage,
        }
        if not body.get("stream"):
            return JSONResponse(response)
        return self._streamed(kind, _responses_events(response))

    def _streamed(self, kind: str, events: Iterator[bytes]) -> StreamingResponse:
        if self.cut_answers and kind == "text":
            events = itertools.takewhile(lambda event: not _LAST.search(event), events)
        return StreamingResponse(events, media_type="text/event-stream")

    # --- reading what was asked ---------------------------------------------------

    def turns(self) -> list[tuple[str, dict[str, Any]]]:
        """The requests of the conversation (not the summarizer's: they offer no tools)."""
        return [(api, body) for api, body in self.received if body.get("tools")]


def _called(kind: str, value: str) -> tuple[str, dict[str, Any]]:
    """The tool a ``"call"`` or ``"client"`` decision calls, and its arguments."""
    return (TOOL, {"ref": value}) if kind == "call" else (value, {"path": "app.py"})


def _message_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _frame(payload: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


def _chat_events(
    n: int,
    model: Any,
    kind: str,
    value: str,
    message: dict[str, Any],
    finish: str,
    usage: dict[str, Any],
    include_usage: bool,
    preamble: bool = True,
) -> Iterator[bytes]:
    def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": reason}
        return _frame(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": model,
                "choices": [choice],
            }
        )

    yield chunk({"role": "assistant", "content": ""})
    if kind != "text":
        if preamble:
            yield chunk({"content": PREAMBLE})
        call = message["tool_calls"][0]
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                ]
            }
        )
        arguments = call["function"]["arguments"]
        for part in (arguments[:5], arguments[5:]):
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
    else:
        for part in (value[:4], value[4:]):
            yield chunk({"content": part})
    yield chunk({}, finish)
    if include_usage:
        yield _frame(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": model,
                "choices": [],
                "usage": usage,
            }
        )
    yield b"data: [DONE]\n\n"


def _anthropic_events(message: dict[str, Any]) -> Iterator[bytes]:
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 1}
    yield _frame({"type": "message_start", "message": start}, "message_start")
    yield _frame({"type": "ping"}, "ping")
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        else:
            opening = {**block, "input": {}}
            text = orjson.dumps(block["input"]).decode()
            deltas = [
                {"type": "input_json_delta", "partial_json": text[:4]},
                {"type": "input_json_delta", "partial_json": text[4:]},
            ]
        yield _frame(
            {"type": "content_block_start", "index": index, "content_block": opening},
            "content_block_start",
        )
        for delta in deltas:
            yield _frame(
                {"type": "content_block_delta", "index": index, "delta": delta},
                "content_block_delta",
            )
        yield _frame({"type": "content_block_stop", "index": index}, "content_block_stop")
    yield _frame(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": message["usage"]["output_tokens"]},
        },
        "message_delta",
    )
    yield _frame({"type": "message_stop"}, "message_stop")


def _responses_events(response: dict[str, Any]) -> Iterator[bytes]:
    number = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal number
        payload = {"type": kind, "sequence_number": number, **fields}
        number += 1
        return _frame(payload, kind)

    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=opening)
    yield event("response.in_progress", response=opening)
    for index, item in enumerate(response["output"]):
        if item["type"] == "function_call":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            yield event(
                "response.function_call_arguments.delta",
                output_index=index,
                item_id=item["id"],
                delta=item["arguments"],
            )
            yield event(
                "response.function_call_arguments.done",
                output_index=index,
                item_id=item["id"],
                arguments=item["arguments"],
            )
        else:
            text = item["content"][0]["text"]
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "content": [], "status": "in_progress"},
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event(
                "response.content_part.added",
                output_index=index,
                item_id=item["id"],
                content_index=0,
                part=part,
            )
            yield event(
                "response.output_text.delta",
                output_index=index,
                item_id=item["id"],
                content_index=0,
                delta=text,
            )
            yield event(
                "response.output_text.done",
                output_index=index,
                item_id=item["id"],
                content_index=0,
                text=text,
            )
            yield event(
                "response.content_part.done",
                output_index=index,
                item_id=item["id"],
                content_index=0,
                part={**part, "text": text},
            )
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=response)
