"""Real HTTP servers on loopback for the integration tests.

``serve_in_thread`` runs any ASGI app under uvicorn in a background thread on
a free port. ``FakeUpstream`` is an OpenAI-compatible server that behaves like
the real ones: JSON and SSE responses in the exact wire format (with
``usage``), an enforced context window answered with a chosen provider's
error body, latency and failure injection, and a record of every request.

By default it counts a prompt as the proxy does (tiktoken, times
``count_factor``). With ``counting="chat-template"`` it counts the way an
upstream with another tokenizer and a chat template does (a Qwen or Llama
served by vLLM or llama.cpp): every message wrapped in template tokens, the
tool schemas rendered into the prompt as spaced JSON, and about 12 % more
tokens than o200k for the same text — so the proxy's own estimate is short by
10–20 %, as measured against real servers. ``error_style="llama-cpp-python"``
adds that server's worst habit: a streamed request over the window gets
HTTP 200, ``text/event-stream`` and no event at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from compaction import TokenCounter, message_text
from compaction.summary.prompts import SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT

#: Error bodies of the providers the proxy must recognize, by style; ``{w}``
#: is the window and ``{n}`` the prompt size.
OVERFLOW_ERRORS: dict[str, tuple[int, dict[str, Any]]] = {
    "openai": (
        400,
        {
            "error": {
                "message": "This model's maximum context length is {w} tokens. However, your "
                "messages resulted in {n} tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    ),
    "vllm": (
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is {w} "
            "tokens. However, you requested {n} tokens ({n} in the messages, 0 in the completion). "
            "Please reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    ),
    "llama.cpp": (
        400,
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available "
                "context size. try increasing the context size or enable context shift",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": "{n}",
                "n_ctx": "{w}",
            }
        },
    ),
    "anthropic": (
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: {n} tokens > {w} maximum",
            },
        },
    ),
    # llama-cpp-python's server: a non-streamed overflow gets this body; a
    # streamed one gets HTTP 200 and an empty event stream (see FakeUpstream).
    "llama-cpp-python": (
        400,
        {
            "error": {
                "message": "This model's maximum context length is {w} tokens. However, you "
                "requested {n} tokens ({n} in the messages, 0 in the completion). Please reduce "
                "the length of the messages or completion.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    ),
    "no-number": (
        400,
        {
            "error": {
                "message": "Your input exceeds the context window of this "
                "model. Please adjust your input and try again.",
                "type": "invalid_request_error",
                "param": "input",
                "code": "context_length_exceeded",
            }
        },
    ),
}


#: A realistic summary, with the six sections the proxy asks for (docs/compaction.md, "The stages").
#: ``parse_window_header`` appears nowhere else: a test finds this text by it.
SUMMARY_TEXT = """\
## Goal
- Make the failing test `tests/test_app.py::test_window_header` pass without changing its \
assertions.

## Constraints & Preferences
- Keep the public API of `src/app.py` unchanged.
- Run the whole suite with `pytest -q` before finishing.

## Progress
### Done
- Read `src/app.py` and `tests/test_app.py`: `parse_window_header` returns the header as a \
string.
- Ran `pytest -q`: 1 failed, 41 passed.
### In Progress
- Changing `parse_window_header` in `src/app.py` to return an `int`.
### Blocked
- None

## Key Decisions
- Convert the value where the header is parsed, not at every caller, so the other callers keep \
working.

## Next Steps
1. Finish the change in `parse_window_header`.
2. Run `pytest -q` and check that `test_window_header` passes.

## Critical Context
- The failing assertion: `AssertionError: expected 8192 got '8192'`.
- The header is `x-window`; its value is always a decimal number."""

#: What a model asked for a turn-prefix note (the condensed first steps of the
#: current turn) answers: that prompt's two headings.
TURN_PREFIX_TEXT = """\
## Done So Far
- Ran `pytest -q`: `test_window_header` fails with `AssertionError: expected 8192 got '8192'`.

## Context Needed Next
- `parse_window_header` in `src/app.py` returns the header as a string."""

#: Summarizer replies that are not summaries, as small models give them.
NOT_SUMMARIES: dict[str, str] = {
    # Answers the summarizer's instructions as if they were a chat.
    "ready": "I'm ready to help. What's the next step?",
    # Continues a customer-service dialogue as the agent instead of summarizing it.
    "agent": "Thank you for waiting. I have found your reservation ZFA04Y: the flight from JFK to "
    "SEA on May 20 can be changed to the 14:30 departure for a fare difference of $120. Would "
    "you like me to go ahead with the change?",
}

#: Chat-template counting: the text factor of a tokenizer that is not o200k,
#: the tokens a template wraps each message in (``<|im_start|>role\n`` …
#: ``<|im_end|>\n``), and those priming the reply (``<|im_start|>assistant\n``).
TEMPLATE_TEXT_FACTOR = 1.12
TEMPLATE_TOKENS_PER_MESSAGE = 5
TEMPLATE_REPLY_PRIMING = 3
#: How a Qwen-style template introduces the tool schemas in the system turn.
TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    #: The status the fake answered with (200 for an empty overflow stream).
    status: int = 0
    #: The prompt size the fake counted for a chat or summary request.
    prompt_tokens: int | None = None
    #: The fake refused it as over its window (a 400, or an empty 200 stream).
    overflowed: bool = False
    #: When it arrived (monotonic clock).
    at: float = field(default_factory=time.monotonic)

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class FakeUpstream:
    window: int | None = None
    error_style: str = "openai"
    #: Multiplies our token count: a tokenizer that counts more than tiktoken.
    count_factor: float = 1.0
    #: How prompts are counted: "o200k" (tiktoken × ``count_factor``; the window
    #: holds the prompt alone) or "chat-template" (:meth:`template_tokens`; the
    #: window holds the prompt plus the ``max_tokens`` asked for, as vLLM and
    #: llama.cpp enforce it).
    counting: str = "o200k"
    #: Chunks in a streamed answer, and the pause before each.
    chunks: int = 8
    chunk_delay: float = 0.0
    #: One-shot behaviours consumed by the next chat requests, in order:
    #: "500", "429", "hang", "hang-stream" (an event stream's headers, then
    #: nothing), "drop", "empty-stream" (HTTP 200, an event stream
    #: with no event in it, whatever the request's size).
    behaviours: list[str] = field(default_factory=list)
    #: Seconds the summarizer's answer takes (a "summarizing" process to kill).
    summary_delay: float = 0.0
    #: What the summarizer answers; ``{call}`` becomes the number of the
    #: summary request (1, 2, …), so each summary can be told apart.
    summary_text: str = SUMMARY_TEXT
    #: What it answers when asked for a turn-prefix note (``{call}`` as above).
    turn_prefix_text: str = TURN_PREFIX_TEXT
    #: How the summarizer answers: "text" (``summary_text``), a reply that is
    #: not a summary ("ready", "agent": see ``NOT_SUMMARIES``), or a broken
    #: reply: "garbage" (not JSON), "no-choices", "empty" (empty content),
    #: "tool-calls" (a tool call instead of text), "error" (a 500).
    summary_reply: str = "text"
    #: False skips tokenizing chat requests (``usage`` then says 0), so the fake
    #: spends no CPU of its own on huge bodies while a test measures the proxy.
    count_tokens: bool = True
    received: list[Received] = field(default_factory=list)
    stream_closed: list[float] = field(default_factory=list)
    #: How many events each closed stream had sent (in ``stream_closed``'s order).
    stream_sent: list[int] = field(default_factory=list)
    #: When the proxy closed each "hang" request's connection (monotonic clock).
    hang_closed: list[float] = field(default_factory=list)
    counter: TokenCounter = field(default_factory=lambda: TokenCounter("gpt-4o"))
    _text_tokens: dict[str, int] = field(default_factory=dict, repr=False)

    # --- what was asked ------------------------------------------------

    @property
    def chat_requests(self) -> list[Received]:
        return [
            r
            for r in self.received
            if r.path.endswith("/chat/completions") and not _is_summary_request(r.json())
        ]

    @property
    def summary_requests(self) -> list[Received]:
        return [
            r
            for r in self.received
            if r.path.endswith("/chat/completions") and _is_summary_request(r.json())
        ]

    def summary_rounds(self, gap: float) -> int:
        """How many times a summary was asked for: a compaction whose tail starts
        inside a turn asks for two at once (the summary, and a note on the
        turn's first steps); calls less than ``gap`` seconds apart count once."""
        times = [r.at for r in self.summary_requests]
        return sum(1 for i, at in enumerate(times) if i == 0 or at - times[i - 1] > gap)

    @property
    def summary_prompts(self) -> list[str]:
        """The text of every summary request, exactly as the summarizer read it."""
        return [
            "\n".join(message_text(m) for m in r.json()["messages"]) for r in self.summary_requests
        ]

    @property
    def overflows(self) -> list[Received]:
        """Chat requests refused as over the window (a 400, or an empty 200 stream)."""
        return [r for r in self.chat_requests if r.overflowed]

    # --- counting ----------------------------------------------------------

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """What this upstream counts for a chat request's prompt."""
        if self.counting == "chat-template":
            return self.template_tokens(body)
        return int(self.counter.count_request(body) * self.count_factor)

    def template_tokens(self, body: dict[str, Any]) -> int:
        """The prompt as a chat-template upstream counts it.

        The messages are rendered the way a Qwen-style template does (tool
        calls as ``<tool_call>`` JSON, results in ``<tool_response>``, the tool
        schemas appended to the system turn one per line as ``json.dumps``
        writes them, with spaces after ``,`` and ``:``); the text is counted
        with o200k times :data:`TEMPLATE_TEXT_FACTOR`, and each message costs
        :data:`TEMPLATE_TOKENS_PER_MESSAGE` template tokens more.
        """
        messages = body.get("messages")
        messages = messages if isinstance(messages, list) else []
        text = 0
        schemas = body.get("tools") or body.get("functions")
        if isinstance(schemas, list) and schemas:
            rendered = "\n".join(json.dumps(schema) for schema in schemas)
            text += self._count(TOOLS_PREAMBLE + "\n" + rendered + TOOLS_POSTAMBLE)
        for message in messages:
            if isinstance(message, dict):
                text += self._count(_template_text(message))
        return (
            math.ceil(text * TEMPLATE_TEXT_FACTOR)
            + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)
            + TEMPLATE_REPLY_PRIMING
        )

    def _count(self, text: str) -> int:
        count = self._text_tokens.get(text)
        if count is None:
            count = self._text_tokens[text] = self.counter.count_text(text)
        return count

    def _over_window(self, body: dict[str, Any], prompt: int) -> bool:
        if self.window is None:
            return False
        if self.counting == "chat-template":
            return prompt + _requested_output(body) > self.window
        return prompt > self.window

    # --- the app ---------------------------------------------------------

    def app(self) -> ASGIApp:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
                Route("/v1/files", self._files, methods=["POST"]),
                Route("/v1/files/{file_id}", self._delete_file, methods=["DELETE"]),
            ]
        )

    async def _record(self, request: Request) -> Received:
        received = Received(
            request.method, request.url.path, dict(request.headers), await request.body()
        )
        self.received.append(received)
        return received

    async def _models(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": "gpt-4o", "object": "model", "created": 0, "owned_by": "fake"}],
            }
        )

    async def _files(self, request: Request) -> Response:
        """An upload: answers with the size and digest of what arrived."""
        received = await self._record(request)
        digest = hashlib.sha256(received.body).hexdigest()
        return JSONResponse({"object": "file", "bytes": len(received.body), "sha256": digest})

    async def _delete_file(self, request: Request) -> Response:
        await self._record(request)
        file_id = request.path_params["file_id"]
        return JSONResponse({"id": file_id, "object": "file", "deleted": True})

    async def _embeddings(self, request: Request) -> Response:
        received = await self._record(request)
        inputs = received.json().get("input")
        count = len(inputs) if isinstance(inputs, list) else 1
        return JSONResponse(
            {
                "object": "list",
                "model": "fake",
                "data": [
                    {"object": "embedding", "index": i, "embedding": [0.1, 0.2]}
                    for i in range(count)
                ],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        )

    async def _chat(self, request: Request) -> Response:
        received = await self._record(request)
        body = received.json()
        if _is_summary_request(body):
            if self.count_tokens:
                received.prompt_tokens = self.prompt_tokens(body)
            if self.summary_delay:
                await asyncio.sleep(self.summary_delay)
            response = self._summary(body, received.prompt_tokens or 10)
            received.status = response.status_code
            return response
        response = await self._answer(request, received, body)
        received.status = response.status_code
        return response

    async def _answer(self, request: Request, received: Received, body: dict[str, Any]) -> Response:
        behaviour = self.behaviours.pop(0) if self.behaviours else ""
        if behaviour == "500":
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, 500)
        if behaviour == "429":
            return JSONResponse(
                {
                    "error": {
                        "message": "Rate limit reached",
                        "type": "requests",
                        "code": "rate_limit_exceeded",
                    }
                },
                429,
                headers={"retry-after": "7"},
            )
        if behaviour == "hang":  # until the proxy gives up on this request
            while not await request.is_disconnected():
                await asyncio.sleep(0.02)
            self.hang_closed.append(time.monotonic())
            return Response(status_code=499)
        if behaviour == "hang-stream":  # the headers at once, then nothing (a long prefill)
            return StreamingResponse(self._silent(), media_type="text/event-stream")
        if behaviour == "empty-stream":
            return StreamingResponse(_no_events(), media_type="text/event-stream")
        prompt = self.prompt_tokens(body) if self.count_tokens else 0
        received.prompt_tokens = prompt if self.count_tokens else None
        if self._over_window(body, prompt):
            received.overflowed = True
            if self.error_style == "llama-cpp-python" and body.get("stream") is True:
                # The error is raised inside the event generator, after the
                # headers went out: the stream just ends.
                return StreamingResponse(_no_events(), media_type="text/event-stream")
            status, template = OVERFLOW_ERRORS[self.error_style]
            text = orjson.dumps(template).decode()
            for placeholder, value in (("{n}", prompt), ("{w}", self.window)):
                text = text.replace(f'"{placeholder}"', str(value))
                text = text.replace(placeholder, str(value))
            return Response(text, status, media_type="application/json")
        answer = f"I saw {len(body['messages'])} messages."
        if body.get("stream") is True:
            return StreamingResponse(
                self._sse(body, answer, prompt, drop=behaviour == "drop"),
                media_type="text/event-stream",
            )
        return JSONResponse(_completion(body, answer, prompt))

    async def _silent(self) -> AsyncIterator[bytes]:
        try:
            await asyncio.sleep(3600)
            yield b""
        finally:
            self.hang_closed.append(time.monotonic())

    def _summary(self, body: dict[str, Any], prompt: int) -> Response:
        reply = self.summary_reply
        if reply == "garbage":
            return Response(
                "<html><body>502 Bad Gateway</body></html>", 200, media_type="text/html"
            )
        if reply == "error":
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, 500)
        template = self.turn_prefix_text if _is_turn_prefix(body) else self.summary_text
        text = NOT_SUMMARIES.get(reply) or template.replace(
            "{call}", str(len(self.summary_requests))
        )
        completion = _completion(body, text, prompt)
        if reply == "no-choices":
            del completion["choices"]
        elif reply == "empty":
            completion["choices"][0]["message"]["content"] = ""
        elif reply == "tool-calls":
            completion["choices"][0]["finish_reason"] = "tool_calls"
            completion["choices"][0]["message"].update(
                content=None,
                tool_calls=[
                    {
                        "id": "call_summary",
                        "type": "function",
                        "function": {"name": "write_summary", "arguments": '{"text": "x"}'},
                    }
                ],
            )
        return JSONResponse(completion)

    async def _sse(
        self, body: dict[str, Any], answer: str, prompt: int, drop: bool
    ) -> AsyncIterator[bytes]:
        sent = 0
        try:
            words = [f"w{i} " for i in range(self.chunks)]
            base = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body.get("model", "fake"),
                "system_fingerprint": None,
            }
            yield _event(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
            for i, word in enumerate(words):
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                if drop and i == len(words) // 2:
                    raise RuntimeError("dropped mid-stream on purpose")
                sent += 1
                yield _event(
                    {
                        **base,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"content": word},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                )
            yield _event(
                {
                    **base,
                    "choices": [
                        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
                    ],
                }
            )
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):
                yield _event(
                    {
                        **base,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": prompt,
                            "completion_tokens": len(words),
                            "total_tokens": prompt + len(words),
                        },
                    }
                )
            yield b"data: [DONE]\n\n"
        finally:
            self.stream_closed.append(time.monotonic())
            self.stream_sent.append(sent)


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _no_events() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that ends before its first event


def _template_text(message: dict[str, Any]) -> str:
    """What a Qwen-style chat template writes for one message, without its special tokens."""
    role = str(message.get("role", ""))
    text = message_text(message)
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments")
        with suppress(TypeError, ValueError):
            arguments = json.loads(arguments)
        rendered = json.dumps({"name": function.get("name"), "arguments": arguments})
        text += f"\n<tool_call>\n{rendered}\n</tool_call>"
    if role in ("tool", "function"):
        text = f"<tool_response>\n{text}\n</tool_response>"
    return f"{role}\n{text}"


def _requested_output(body: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _completion(body: dict[str, Any], text: str, prompt: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": body.get("model", "fake"),
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5},
    }


def _is_summary_request(body: Any) -> bool:
    """Whether a chat request is the proxy asking for a summary: its system
    prompt is one of the condenser's (or starts like one, or asks for the
    summary's sections)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return False
    first = messages[0]
    content = first.get("content")
    if first.get("role") not in ("system", "developer") or not isinstance(content, str):
        return False
    prompts = (SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT)
    if any(content.startswith(prompt.split("\n", 1)[0]) for prompt in prompts):
        return True
    return ("## Goal" in content and "## Critical Context" in content) or (
        "## Done So Far" in content
    )


def _is_turn_prefix(body: dict[str, Any]) -> bool:
    content = body["messages"][0].get("content")
    first_line = TURN_PREFIX_SYSTEM_PROMPT.split("\n", 1)[0]
    return isinstance(content, str) and (
        content.startswith(first_line) or "## Done So Far" in content
    )


class _PromptServer(uvicorn.Server):
    """uvicorn's server, told to stop rather than noticing on its next tick.

    uvicorn looks at ``should_exit`` every 0.1 s; a test suite that starts a
    few hundred servers waited for that tick once per server."""

    _stopping: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter += 1
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 0.1)

    def stop(self) -> None:
        self.should_exit = True
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stopping.set)


@contextmanager
def serve_in_thread(app: ASGIApp) -> Iterator[str]:
    """Run ``app`` on a free loopback port; yields its base URL (no trailing slash)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = _PromptServer(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        thread.join(timeout=10)
        sock.close()


@contextmanager
def serve_hangup() -> Iterator[str]:
    """A TCP server that reads each request and closes the connection without
    answering (an upstream that dies before sending headers); yields its base URL."""
    with serve_raw(lambda conn: conn.recv(65536)) as url:
        yield url


@contextmanager
def serve_raw(handle: Callable[[socket.socket], object]) -> Iterator[str]:
    """A TCP server on loopback that hands each connection to ``handle`` (in
    one thread, one at a time) and closes it after; yields its base URL."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                with suppress(OSError):
                    handle(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def poller(timeout: float = 1.0) -> httpx.Client:
    """The client of a loop that asks a server again and again (up yet? still
    accepting?): one for the whole loop, for each new client reads the CA
    bundle again (~40 ms of CPU, taken from the process being waited for), and
    a new connection for each request, for whether one is accepted is the question."""
    return httpx.Client(timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0))


def first_health(
    port: int, process: subprocess.Popen[bytes], seconds: float = 30
) -> httpx.Response:
    """The ``/healthz`` answer of the server ``process`` starts on ``port``, once
    there is one: :class:`ChildProcessError` if the process ends first (its
    stderr, when piped, in the message), :class:`TimeoutError` past ``seconds``."""
    deadline = time.monotonic() + seconds
    with poller() as poll:
        while True:
            try:
                return poll.get(f"http://127.0.0.1:{port}/healthz")
            except httpx.TransportError:
                if process.poll() is not None:
                    said = process.stderr.read().decode(errors="replace") if process.stderr else ""
                    raise ChildProcessError(f"the server ended: {said[-2000:]}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError("the server did not come up") from None
                time.sleep(0.05)


class ProxyProcess:
    """``compaction-proxy serve`` as its own process, as a user runs it."""

    def __init__(self, upstream: str, env: dict[str, str], cwd: str) -> None:
        import os
        import sys

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        script = os.path.join(os.path.dirname(sys.executable), "compaction-proxy")
        base = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
        # A model asked for every summary, as in-process (tests.proxy.inprocess.asking_the_model).
        base["COMPACTION_PROXY_COMPACTION__SUMMARY_MUST_PAY"] = "false"
        self.process = subprocess.Popen(
            [
                script,
                "serve",
                "--port",
                str(self.port),
                "--upstream",
                upstream,
                "--log-level",
                "warning",
            ],
            env={**base, **env},
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.url = f"http://127.0.0.1:{self.port}/v1"
        try:
            first_health(self.port, self.process)
        except TimeoutError:
            # One still starting is ended, and its pipe closed with it: a
            # failed start leaves no process behind, nor a file for the
            # collector to warn about in whichever test runs next.
            self.process.kill()
            _, err = self.process.communicate(timeout=30)
            raise RuntimeError(f"proxy did not start: {err.decode()[-2000:]}") from None
        except ChildProcessError as exc:
            self.process.communicate(timeout=30)
            raise RuntimeError(f"proxy did not start: {exc}") from None

    def stop(self, kill: bool = False) -> None:
        if self.process.poll() is None:
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
        self.process.communicate(timeout=30)
