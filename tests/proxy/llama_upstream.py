"""A llama-cpp-python server (``python -m llama_cpp.server``, 0.3.x) on loopback,
as far as the proxy can tell one from the outside.

What it reproduces of the real server:

* **its count** — the model's own tokenizer: here the proxy's own count of the
  request times :data:`TOKEN_RATIO` (rounded up), so the proxy's estimate is
  short by a tenth, as it is against Qwen2.5's tokenizer and chat template;
* **its window** — ``n_ctx`` (8,192 by default); a prompt of ``n_ctx`` tokens or
  more is refused (``Llama._create_completion`` raises ``Requested tokens (N)
  exceed context window of M``);
* **a whole answer over the window** — the server's error route rewrites that
  exception into an OpenAI-shaped 400 (``llama_cpp/server/errors.py``,
  ``context_length_exceeded``: "This model's maximum context length is M tokens.
  However, you requested …");
* **a streamed answer over the window** — the exception is raised inside the
  event generator, after the 200 and its ``text/event-stream`` headers went
  out: the stream ends without a single event;
* **no ``usage`` on streams**, even when the client asks for it with
  ``stream_options.include_usage``; whole answers carry it;
* ``GET /v1/models`` lists the model and says nothing of its window.
"""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from compaction import TokenCounter
from tests.proxy.servers import serve_in_thread

#: The server's tokenizer counts this many tokens for each of the proxy's.
TOKEN_RATIO = 1.1
#: The model name the table believes has 32,768 tokens.
MODEL = "qwen2.5-coder-1.5b-instruct"
#: What every answer says.
ANSWER = "Looked at it; next step."


@dataclass(frozen=True)
class Asked:
    """One chat request as the server saw it."""

    streamed: bool
    prompt_tokens: int
    #: Over the window: refused (a 400, or an empty 200 stream).
    refused: bool


@dataclass
class LlamaCppPython:
    n_ctx: int = 8_192
    #: The next this many streams end empty whatever their size (a server that
    #: fails for another reason: a crashed slot, an out-of-memory KV cache).
    broken_streams: int = 0
    asked: list[Asked] = field(default_factory=list)
    _counter: TokenCounter = field(default_factory=lambda: TokenCounter(MODEL))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        return math.ceil(self._counter.count_request(body) * TOKEN_RATIO)

    @property
    def refused(self) -> list[Asked]:
        return [asked for asked in self.asked if asked.refused]

    async def chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        streamed = body.get("stream") is True
        prompt = self.prompt_tokens(body)
        refused = prompt >= self.n_ctx
        with self._lock:
            self.asked.append(Asked(streamed, prompt, refused))
            broken = streamed and self.broken_streams > 0
            self.broken_streams -= broken
        if streamed and (refused or broken):
            return StreamingResponse(_nothing(), media_type="text/event-stream")
        if refused:
            return JSONResponse({"error": self._overflow(body, prompt)}, status_code=400)
        if streamed:
            return StreamingResponse(_events(body), media_type="text/event-stream")
        return JSONResponse(_completion(body, prompt))

    def _overflow(self, body: dict[str, Any], prompt: int) -> dict[str, Any]:
        completion = body.get("max_tokens")
        message = (
            f"This model's maximum context length is {self.n_ctx} tokens. However, you "
            f"requested {(completion or 0) + prompt} tokens ({prompt} in the messages, "
            f"{completion} in the completion). Please reduce the length of the messages "
            "or completion."
        )
        return {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }

    async def models(self, request: Request) -> Response:
        model = {"id": MODEL, "object": "model", "owned_by": "me", "permissions": []}
        return JSONResponse({"object": "list", "data": [model]})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
            ]
        )


@contextmanager
def serve_llama_cpp_python(n_ctx: int = 8_192) -> Iterator[tuple[LlamaCppPython, str]]:
    """The fake on a free loopback port, and its base URL (with ``/v1``)."""
    server = LlamaCppPython(n_ctx=n_ctx)
    with serve_in_thread(server.app()) as url:
        yield server, url + "/v1"


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # a generator that ends before its first event


def _chunk(body: dict[str, Any], delta: dict[str, Any], finish: str | None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    event = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": body.get("model", MODEL),
        "choices": [choice],
    }
    # sse-starlette, which the server streams with, ends its lines with CRLF.
    return b"data: " + orjson.dumps(event) + b"\r\n\r\n"


async def _events(body: dict[str, Any]) -> AsyncIterator[bytes]:
    yield _chunk(body, {"role": "assistant"}, None)
    yield _chunk(body, {"content": ANSWER}, None)
    yield _chunk(body, {}, "stop")
    yield b"data: [DONE]\r\n\r\n"


def _completion(body: dict[str, Any], prompt: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": body.get("model", MODEL),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ANSWER},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 6, "total_tokens": prompt + 6},
    }
