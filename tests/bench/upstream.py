"""The benchmarks' upstream: a raw ASGI app, as fast as Python serves HTTP.

No framework, no JSON parsing, every answer precomputed: whatever time the
bench measures on a direct connection is uvicorn's and the kernel's, so what a
proxy adds stands out. A chat request whose body asks for ``"stream": true``
gets an SSE answer of ``chunks`` frames, the first at once and each next one
after ``interval`` seconds, then ``data: [DONE]``; any other one gets the same
``chat.completion`` JSON; ``/messages`` and ``/responses`` get a fixed Anthropic
message and Response. Run as its own process::

    python -m tests.bench.upstream --port 9000 --chunks 64 --interval 0.02
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import orjson
import uvicorn

Scope = dict[str, Any]
Receive = Any
Send = Any

COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Benchmark answer.", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }
)
#: An Anthropic Messages answer and an OpenAI Responses one, as small as the chat one.
MESSAGE = orjson.dumps(
    {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-bench",
        "content": [{"type": "text", "text": "Benchmark answer."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 3},
    }
)
RESPONSE = orjson.dumps(
    {
        "id": "resp_bench",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "model": "gpt-4o",
        "output": [
            {
                "type": "message",
                "id": "msg_bench",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "Benchmark answer.", "annotations": []}
                ],
            }
        ],
        "usage": {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13},
    }
)
MODELS = orjson.dumps(
    {"object": "list", "data": [{"id": "gpt-4o", "object": "model", "created": 0, "owned_by": "b"}]}
)
DONE = b"data: [DONE]\n\n"
_STREAM_MARKERS = (b'"stream":true', b'"stream": true')


def sse_frames(chunks: int) -> list[bytes]:
    """The data frames of a streamed answer, without ``[DONE]``; the last one stops."""
    frames = []
    for i in range(chunks):
        last = i == chunks - 1
        delta: dict[str, Any] = {"content": f"w{i} "}
        if i == 0:
            delta["role"] = "assistant"
        payload = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-4o",
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": "stop" if last else None,
                }
            ],
        }
        frames.append(b"data: " + orjson.dumps(payload) + b"\n\n")
    return frames


def _headers(content_type: bytes, length: int | None = None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", content_type)]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return headers


class Upstream:
    """The ASGI callable; one instance per process."""

    def __init__(self, chunks: int = 64, interval: float = 0.02) -> None:
        self.frames = sse_frames(chunks)
        self.interval = interval

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        path: str = scope["path"]
        if scope["method"] == "POST" and path.endswith("/chat/completions"):
            if any(marker in body for marker in _STREAM_MARKERS):
                await self._stream(send)
            else:
                await _answer(send, COMPLETION)
        elif scope["method"] == "POST" and path.endswith("/messages"):
            await _answer(send, MESSAGE)
        elif scope["method"] == "POST" and path.endswith("/responses"):
            await _answer(send, RESPONSE)
        elif path.endswith("/models"):
            await _answer(send, MODELS)
        else:
            await _answer(send, b'{"status":"ok"}')

    async def _stream(self, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _headers(b"text/event-stream"),
            }
        )
        for i, frame in enumerate(self.frames):
            if i:
                await asyncio.sleep(self.interval)
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": DONE, "more_body": False})


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send: Send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": _headers(b"application/json", len(body)),
        }
    )
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--interval", type=float, default=0.02)
    args = parser.parse_args()
    uvicorn.run(
        Upstream(args.chunks, args.interval),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
        lifespan="off",
    )


if __name__ == "__main__":
    main()
