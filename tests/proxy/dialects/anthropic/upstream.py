"""A scripted Anthropic Messages API on loopback, for end-to-end tests.

:class:`AnthropicUpstream` is a Starlette app (serve it with
:func:`tests.proxy.servers.serve_in_thread`) that behaves like
``api.anthropic.com/v1`` where the proxy can get it wrong:

* it refuses what the real API refuses — a broken tool pairing
  (:func:`proxy.dialects.anthropic.pairing_problems`, in the API's words) and
  a ``thinking`` block whose ``signature`` is not the one it gave that text;
* it enforces a context window: a prompt over ``window`` tokens (counted
  with tiktoken o200k over the request's text, independently of the proxy's
  mapping) gets HTTP 400 ``prompt is too long: N tokens > M maximum``;
* it answers a request with tools with a ``tool_use`` (behind a signed
  ``thinking`` block when the request asks for thinking) until ``tool_turns``
  were answered or ``stop`` is set, then with text — so a client loop runs
  many turns;
* a request without tools whose system prompt is the proxy's summarizer's
  gets :data:`~tests.proxy.servers.SUMMARY_TEXT` plus a line naming the first
  file path of the transcript;
* ``stream: true`` gets the real event sequence (``message_start``,
  ``content_block_start``, ``ping``, deltas, ``content_block_stop``,
  ``message_delta``, ``message_stop``), each ``event: <type>\\ndata: <json>``;
* ``POST /v1/messages/count_tokens`` answers ``{"input_tokens": N}``;
* it records every request (:attr:`received`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from compaction import TokenCounter
from compaction.summary.prompts import SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT
from proxy.dialects.anthropic import pairing_problems
from tests.proxy.dialects.anthropic.sessions import signature
from tests.proxy.servers import SUMMARY_TEXT, TURN_PREFIX_TEXT, Received

#: What the API charges per message and per image (its documented ~1,600 for a 1,092 px image).
TOKENS_PER_MESSAGE = 3
IMAGE_TOKENS = 1_600
_PATH = re.compile(r"[\w./-]+/[\w.-]+\.\w+|[\w-]+\.(?:py|js|ts|md|toml|json)\b")
_TAGS = re.compile(r"</?[a-z-]+>")


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_summary_request(body: dict[str, Any]) -> bool:
    """The proxy asking for a summary: no tools, and the condenser's system prompt."""
    system = body.get("system")
    if "tools" in body or not isinstance(system, str):
        return False
    firsts = (SUMMARY_SYSTEM_PROMPT.split("\n", 1)[0], TURN_PREFIX_SYSTEM_PROMPT.split("\n", 1)[0])
    return system.startswith(firsts) or "## Goal" in system or "## Done So Far" in system


@dataclass
class AnthropicUpstream:
    window: int | None = None
    #: Tool calls answered before the upstream answers with text.
    tool_turns: int = 1_000
    stop: bool = False
    #: The tool call of turn ``n``: a tool name and its input (default: the
    #: first tool the request offers, with a shell-like input).
    tool_use: Callable[[int], tuple[str, dict[str, Any]]] | None = None
    received: list[Received] = field(default_factory=list)
    counter: TokenCounter = field(default_factory=lambda: TokenCounter("gpt-4o"))
    _answered: int = 0

    # --- what was asked ------------------------------------------------------

    @property
    def message_requests(self) -> list[Received]:
        return [
            r
            for r in self.received
            if r.path.endswith("/messages") and not is_summary_request(r.json())
        ]

    @property
    def summary_requests(self) -> list[Received]:
        return [
            r
            for r in self.received
            if r.path.endswith("/messages") and is_summary_request(r.json())
        ]

    @property
    def overflows(self) -> list[Received]:
        return [r for r in self.message_requests if r.overflowed]

    # --- counting ------------------------------------------------------------

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """The prompt as this upstream counts it: the text of the system, of every
        block (tool inputs and unknown blocks as JSON, images at a fixed cost)
        and of the tool schemas."""
        total = self._content(body.get("system"))
        messages = body.get("messages")
        for message in messages if isinstance(messages, list) else ():
            total += TOKENS_PER_MESSAGE + self._content(message.get("content"))
        if body.get("tools"):
            total += self.counter.count_text(orjson.dumps(body["tools"]).decode())
        return total

    def _content(self, content: Any) -> int:
        if isinstance(content, str):
            return self.counter.count_text(content)
        if not isinstance(content, list):
            return 0
        total = 0
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                total += self.counter.count_text(block.get("text", ""))
            elif kind == "thinking":
                total += self.counter.count_text(block.get("thinking", ""))
            elif kind in ("image", "document") and block.get("source", {}).get("type") != "text":
                total += IMAGE_TOKENS
            elif kind == "tool_use":
                name = block.get("name", "")
                total += self.counter.count_text(name + orjson.dumps(block.get("input")).decode())
            elif kind == "tool_result":
                total += self._content(block.get("content"))
            else:
                total += self.counter.count_text(orjson.dumps(block).decode())
        return total

    # --- refusals ------------------------------------------------------------

    def refusal(self, body: dict[str, Any]) -> str | None:
        """Why the real API would refuse ``body`` (400 ``invalid_request_error``)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages: at least one message is required"
        problems = pairing_problems(messages)
        if problems:
            return problems[0]
        for i, message in enumerate(messages):
            content = message.get("content")
            for j, block in enumerate(content if isinstance(content, list) else ()):
                if block.get("type") == "thinking" and block.get("signature") != signature(
                    block.get("thinking", "")
                ):
                    return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                if block.get("type") == "text" and not block.get("text"):
                    return f"messages.{i}.content.{j}: text content blocks must be non-empty"
        return None

    # --- the app -------------------------------------------------------------

    def app(self) -> ASGIApp:
        return Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count, methods=["POST"]),
            ]
        )

    async def _record(self, request: Request) -> Received:
        received = Received(
            request.method, request.url.path, dict(request.headers), await request.body()
        )
        self.received.append(received)
        return received

    async def _count(self, request: Request) -> Response:
        received = await self._record(request)
        return JSONResponse({"input_tokens": self.prompt_tokens(received.json())})

    async def _messages(self, request: Request) -> Response:
        received = await self._record(request)
        body = received.json()
        response = self._answer(received, body)
        received.status = response.status_code
        return response

    def _answer(self, received: Received, body: dict[str, Any]) -> Response:
        refusal = self.refusal(body)
        if refusal is not None:
            return JSONResponse(error_body("invalid_request_error", refusal), 400)
        prompt = received.prompt_tokens = self.prompt_tokens(body)
        if self.window is not None and prompt > self.window:
            received.overflowed = True
            message = f"prompt is too long: {prompt} tokens > {self.window} maximum"
            return JSONResponse(error_body("invalid_request_error", message), 400)
        if is_summary_request(body):
            content = [{"type": "text", "text": self._summary(body)}]
            stop_reason = "end_turn"
        elif body.get("tools") and not self.stop and self._answered < self.tool_turns:
            self._answered += 1
            content = self._tool_call(body)
            stop_reason = "tool_use"
        else:
            content = [{"type": "text", "text": f"Done after {len(body['messages'])} messages."}]
            stop_reason = "end_turn"
        message = {
            "id": f"msg_scripted{len(self.received):04d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude"),
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": 10},
        }
        if body.get("stream") is True:
            return StreamingResponse(_events(message), media_type="text/event-stream")
        return JSONResponse(message)

    def _tool_call(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        turn = self._answered
        name = body["tools"][0].get("name", "tool")
        tool_input: dict[str, Any] = {
            "command": f"cat src/module_{turn}.py",
            "path": f"src/module_{turn}.py",
        }
        if self.tool_use is not None:
            name, tool_input = self.tool_use(turn)
        content: list[dict[str, Any]] = []
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
            text = f"Step {turn}: I should look at src/module_{turn}.py next."
            content.append({"type": "thinking", "thinking": text, "signature": signature(text)})
        content.append({"type": "text", "text": f"Reading src/module_{turn}.py."})
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_scripted{turn:04d}",
                "name": name,
                "input": tool_input,
            }
        )
        return content

    def _summary(self, body: dict[str, Any]) -> str:
        template = (
            TURN_PREFIX_TEXT
            if body["system"].startswith(TURN_PREFIX_SYSTEM_PROMPT.split("\n", 1)[0])
            else SUMMARY_TEXT
        )
        transcript = "\n".join(
            m["content"] for m in body["messages"] if isinstance(m.get("content"), str)
        )
        found = _PATH.search(transcript)
        # A model quotes what it read, not the prompt's tags around it (a reply
        # holding them is not taken as a summary).
        seen = found.group(0) if found else " ".join(_TAGS.sub(" ", transcript).split())[:40]
        return f"{template}\n- Seen in the input: `{seen}`"


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _events(message: dict[str, Any]) -> Iterator[bytes]:
    """``message`` as the API streams it."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {**usage, "output_tokens": 1},
    }
    yield _event("message_start", {"type": "message_start", "message": start})
    yield _event("ping", {"type": "ping"})
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            empty: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _halves(block["text"])]
        elif kind == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": p} for p in _halves(block["thinking"])]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:  # tool_use
            empty = {**block, "input": {}}
            raw = orjson.dumps(block["input"]).decode()
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in _halves(raw)]
        yield _event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": empty},
        )
        for delta in deltas:
            yield _event(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield _event("message_stop", {"type": "message_stop"})


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [text[:middle], text[middle:]] if middle else [text]
