"""Real HTTP servers on loopback for the integration tests.

``serve_in_thread`` runs any ASGI app under uvicorn in a background thread on
a free port. ``FakeUpstream`` is an OpenAI-compatible server that behaves like
the real ones: JSON and SSE responses in the exact wire format (with
``usage``), an enforced context window answered with a chosen provider's
error body, latency and failure injection, and a record of every request.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
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

from compaction import TokenCounter
from compaction.prompts import SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT

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


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class FakeUpstream:
    window: int | None = None
    error_style: str = "openai"
    #: Multiplies our token count: a tokenizer that counts more than tiktoken.
    count_factor: float = 1.0
    #: Chunks in a streamed answer, and the pause before each.
    chunks: int = 8
    chunk_delay: float = 0.0
    #: One-shot behaviours consumed by the next chat requests, in order:
    #: "500", "429", "hang", "drop".
    behaviours: list[str] = field(default_factory=list)
    #: Seconds the summarizer's answer takes (a "summarizing" process to kill).
    summary_delay: float = 0.0
    summary_text: str = "## Goal\nFix the bug.\n## Progress\n### Done\n- ran the tests"
    #: How the summarizer answers: "text" (``summary_text``), or a broken reply:
    #: "garbage" (not JSON), "no-choices", "empty" (empty content),
    #: "tool-calls" (a tool call instead of text), "error" (a 500).
    summary_reply: str = "text"
    #: False skips tokenizing chat requests (``usage`` then says 0), so the fake
    #: spends no CPU of its own on huge bodies while a test measures the proxy.
    count_tokens: bool = True
    received: list[Received] = field(default_factory=list)
    stream_closed: list[float] = field(default_factory=list)
    #: When the proxy closed each "hang" request's connection (monotonic clock).
    hang_closed: list[float] = field(default_factory=list)
    counter: TokenCounter = field(default_factory=lambda: TokenCounter("gpt-4o"))

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
            if self.summary_delay:
                await asyncio.sleep(self.summary_delay)
            return self._summary(body)
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
        prompt = (
            int(self.counter.count_request(body) * self.count_factor) if self.count_tokens else 0
        )
        if self.window is not None and prompt > self.window:
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

    def _summary(self, body: dict[str, Any]) -> Response:
        reply = self.summary_reply
        if reply == "garbage":
            return Response(
                "<html><body>502 Bad Gateway</body></html>", 200, media_type="text/html"
            )
        if reply == "error":
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, 500)
        completion = _completion(body, self.summary_text, 10)
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


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


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
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return False
    return messages[0].get("content") in (SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT)


@contextmanager
def serve_in_thread(app: ASGIApp) -> Iterator[str]:
    """Run ``app`` on a free loopback port; yields its base URL (no trailing slash)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
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
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextmanager
def serve_hangup() -> Iterator[str]:
    """A TCP server that reads each request and closes the connection without
    answering (an upstream that dies before sending headers); yields its base URL."""
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
                    conn.recv(65536)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


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
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1)
                return
            except httpx.TransportError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    err = self.process.stderr.read() if self.process.stderr else b""
                    raise RuntimeError(f"proxy did not start: {err.decode()[-2000:]}") from None
                time.sleep(0.05)

    def stop(self, kill: bool = False) -> None:
        if self.process.poll() is None:
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
        self.process.communicate(timeout=30)
