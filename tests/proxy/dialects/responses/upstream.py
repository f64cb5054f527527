"""A scripted OpenAI Responses upstream for end-to-end tests, and the API's pairing rules.

:func:`pairing_errors` enforces what the Responses API refuses in ``input``,
with its wording: an output whose call is not earlier ("No tool call found for
function call output with call_id …"), a call with no output ("No tool output
found for function call …"), and a ``function_call`` sent without the
``reasoning`` item that was produced with it ("Item 'fc_…' of type
'function_call' was provided without its required 'reasoning' item: 'rs_…'.").

:class:`ResponsesUpstream` answers ``POST /v1/responses`` like the API does
for Codex and the Agents SDK: a reasoning item (with ``encrypted_content``)
and a function call per turn until ``tool_turns`` outputs came back, then a
message; the real typed SSE sequence when ``stream`` is true; the API's
overflow error past ``window`` (o200k count of the input's text); a fixed
summary, naming something from its input, to a request with no tools (the
proxy's summarizer). It records every request.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from compaction import TokenCounter

CALL_TYPES = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "computer_call",
    }
)
OUTPUT_TYPES = frozenset(f"{kind}_output" for kind in CALL_TYPES)
OVERFLOW_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
SUMMARY = (
    "## Goal\n- Finish the task the user gave.\n\n## Progress\n- Ran the tools; last seen: {seen}"
)
#: Fields whose text the model reads (what the window is counted on).
_TEXT_KEYS = ("text", "content", "arguments", "input", "output", "name", "refusal")


def _is_user(item: Mapping[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type") in (None, "message")


def pairing_errors(
    items: Iterable[Any], required_reasoning: Mapping[str, str] | None = None
) -> list[str]:
    """Every way ``items`` break the Responses API's pairing rules; empty when valid.

    ``required_reasoning`` maps a function call's item id to the id of the
    reasoning item the API produced with it (the upstream knows; a test can
    read it off the original request with :func:`reasoning_of`).
    """
    items = [item for item in items if isinstance(item, dict)]
    errors: list[str] = []
    calls: dict[str, int] = {}
    answered: dict[str, int] = {}
    for index, item in enumerate(items):
        kind = item.get("type")
        call_id = item.get("call_id")
        if kind in CALL_TYPES and isinstance(call_id, str):
            if call_id in calls:
                errors.append(f"Duplicate item found with call_id {call_id}.")
            calls[call_id] = index
        elif kind in OUTPUT_TYPES:
            if call_id is None and kind == "local_shell_call_output":
                call_id = item.get("id")
            if call_id not in calls:
                errors.append(
                    f"No tool call found for function call output with call_id {call_id}."
                )
            elif call_id in answered:
                errors.append(f"Duplicate tool output for call_id {call_id}.")
            else:
                answered[call_id] = index
    # An output may come after other items, a user message too: Codex sent the
    # image of a view_image call as a user message between the outputs of
    # parallel calls, and the API answered it.
    user_at = [i for i, item in enumerate(items) if _is_user(item)]
    for call_id in calls:
        if call_id not in answered:
            errors.append(f"No tool output found for function call {call_id}.")
    present = {item.get("id"): i for i, item in enumerate(items) if item.get("id")}
    for call_item, reasoning in (required_reasoning or {}).items():
        at = present.get(call_item)
        if at is None:
            continue
        before = present.get(reasoning)
        if before is None or before > at or any(before < u < at for u in user_at):
            errors.append(
                f"Item '{call_item}' of type 'function_call' was provided without its "
                f"required 'reasoning' item: '{reasoning}'."
            )
    return errors


def reasoning_of(items: Iterable[Any]) -> dict[str, str]:
    """Function-call item id → the reasoning item just before it in its model turn."""
    found: dict[str, str] = {}
    last: str | None = None
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "reasoning":
            last = item.get("id") if isinstance(item.get("id"), str) else None
        elif kind == "function_call" and isinstance(item.get("id"), str):
            if last is not None:
                found[item["id"]] = last
        elif kind in OUTPUT_TYPES or _is_user(item):
            last = None
    return found


def input_tokens(body: Mapping[str, Any], counter: TokenCounter) -> int:
    """The upstream's count: o200k over the instructions, every text the model
    reads in ``input`` (not ``encrypted_content``), and the tool schemas."""
    texts: list[str] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        texts.append(instructions)
    items = body.get("input")
    if isinstance(items, str):
        texts.append(items)
    elif isinstance(items, list):
        for item in items:
            texts.extend(_texts(item))
    total = sum(counter.count_text(t) for t in texts) + 4 * len(items or ())
    if body.get("tools"):
        total += counter.count_text(orjson.dumps(body["tools"]).decode())
    return total


def _texts(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in _TEXT_KEYS and isinstance(inner, str):
                yield inner
            elif key != "encrypted_content":
                yield from _texts(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _texts(inner)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int = 0
    input_tokens: int = 0

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class ResponsesUpstream:
    #: Input tokens above which the API's overflow error answers; ``None``: no limit.
    window: int | None = None
    #: How an overflow of a streamed request is told: "http" (a 400 before the
    #: stream) or "event" (HTTP 200, ``response.failed`` with the error, as Codex
    #: expects it; the openai SDK's strict ``ResponseError.code`` literal lacks
    #: this code, its lenient parsing reads it).
    overflow_style: str = "http"
    #: Function calls answered before the model replies with a message.
    tool_turns: int = 3
    #: What the summarizer answers; ``{seen}`` becomes a piece of its input.
    summary_text: str = SUMMARY
    #: Stop on the calls issued, not the outputs seen: through a compacting
    #: proxy the input holds fewer outputs than the session produced, and an
    #: agent would call tools for ever.
    count_issued: bool = False
    #: The arguments of the ``step``-th call (Codex's ``exec_command`` wants ``cmd``).
    arguments: Callable[[int], dict[str, Any]] = lambda step: {"command": f"cat part{step}.txt"}
    counter: TokenCounter = field(default_factory=lambda: TokenCounter("gpt-4o"))
    received: list[Received] = field(default_factory=list)
    #: Function-call item id → the reasoning item id issued with it.
    issued: dict[str, str] = field(default_factory=dict)

    @property
    def turn_requests(self) -> list[Received]:
        return [r for r in self.received if not _is_summary_request(r.json())]

    @property
    def summary_requests(self) -> list[Received]:
        return [r for r in self.received if _is_summary_request(r.json())]

    def app(self) -> ASGIApp:
        return Starlette(routes=[Route("/v1/responses", self._responses, methods=["POST"])])

    async def _responses(self, request: Request) -> Response:
        received = Received(request.url.path, dict(request.headers), await request.body())
        self.received.append(received)
        response = self._answer(received)
        received.status = response.status_code
        return response

    def _answer(self, received: Received) -> Response:
        body = received.json()
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items or []
        problems = pairing_errors(items, self.issued)
        if problems:
            return _error(400, problems[0], "input", None)
        prompt = received.input_tokens = input_tokens(body, self.counter)
        if _is_summary_request(body):
            text = self.summary_text.replace("{seen}", _seen(items))
            return self._reply(body, [_message(len(self.received), text)], prompt)
        if self.window is not None and prompt > self.window:
            if body.get("stream") is True and self.overflow_style == "event":
                return _stream(_failed_events(body))
            return _error(400, OVERFLOW_MESSAGE, "input", "context_length_exceeded")
        outputs = sum(1 for i in items if isinstance(i, dict) and i.get("type") in OUTPUT_TYPES)
        if self.count_issued:
            outputs = max(outputs, len(self.issued))
        if outputs >= self.tool_turns:
            output = [_message(len(self.received), f"Done after {outputs} tool calls.")]
        else:
            output = self._tool_call(body, outputs)
        return self._reply(body, output, prompt)

    def _tool_call(self, body: dict[str, Any], step: int) -> list[dict[str, Any]]:
        number = len(self.received)
        names = [t.get("name") for t in body.get("tools") or () if t.get("type") == "function"]
        reasoning_id, call_item = f"rs_{number:04d}", f"fc_{number:04d}"
        self.issued[call_item] = reasoning_id
        return [
            {
                "id": reasoning_id,
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": f"Step {step}: look further."}],
                "encrypted_content": f"gAAAAB{'x' * 200}{number:04d}",
            },
            {
                "id": call_item,
                "type": "function_call",
                "status": "completed",
                "call_id": f"call_{number:04d}",
                "name": names[0] if names and isinstance(names[0], str) else "shell",
                "arguments": orjson.dumps(self.arguments(step)).decode(),
            },
        ]

    def _reply(self, body: dict[str, Any], output: list[dict[str, Any]], prompt: int) -> Response:
        response = _response(body, output, prompt)
        if body.get("stream") is True:
            return _stream(_events(response))
        return JSONResponse(response)


def _is_summary_request(body: Any) -> bool:
    """The proxy's summarizer asks without tools and without streaming."""
    return isinstance(body, dict) and not body.get("tools") and body.get("stream") is not True


def _seen(items: list[Any]) -> str:
    for item in reversed(items):
        for text in _texts(item):
            found = re.search(r"\S.{0,60}", text)
            if found:
                return found.group(0)
    return ""


def _error(status: int, message: str, param: str | None, code: str | None) -> Response:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return JSONResponse({"error": error}, status)


def _message(number: int, text: str) -> dict[str, Any]:
    return {
        "id": f"msg_{number:04d}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _response(body: dict[str, Any], output: list[dict[str, Any]], prompt: int) -> dict[str, Any]:
    completion = sum(len(orjson.dumps(item)) // 4 for item in output)
    return {
        "id": f"resp_{len(output)}{prompt:08d}",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model", "gpt-5"),
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": bool(body.get("store", True)),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
        "metadata": {},
    }


def _events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The API's event sequence for ``response`` (text in one delta per part)."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            pending = {**item, "status": "in_progress", "content": []}
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": pending}
            )
            for number, part in enumerate(item["content"]):
                at = {**where, "content_index": number}
                empty = {**part, "text": ""}
                events += [
                    {"type": "response.content_part.added", **at, "part": empty},
                    {
                        "type": "response.output_text.delta",
                        **at,
                        "delta": part["text"],
                        "logprobs": [],
                    },
                    {
                        "type": "response.output_text.done",
                        **at,
                        "text": part["text"],
                        "logprobs": [],
                    },
                    {"type": "response.content_part.done", **at, "part": part},
                ]
        elif item["type"] == "function_call":
            pending = {**item, "status": "in_progress", "arguments": ""}
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": pending},
                {
                    "type": "response.function_call_arguments.delta",
                    **where,
                    "delta": item["arguments"],
                },
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "arguments": item["arguments"],
                },
            ]
        else:
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": item}
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return events


def _failed_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    response = _response(body, [], 0)
    error = {"code": "context_length_exceeded", "message": OVERFLOW_MESSAGE}
    failed = {**response, "status": "failed", "error": error, "usage": None}
    started = {**response, "status": "in_progress", "usage": None}
    return [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        {"type": "response.failed", "response": failed},
    ]


def _stream(events: list[dict[str, Any]]) -> StreamingResponse:
    async def frames() -> AsyncIterator[bytes]:
        for number, event in enumerate(events):
            event = {**event, "sequence_number": number}
            yield b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream")
