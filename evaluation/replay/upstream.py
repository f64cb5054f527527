"""The loopback upstream: a provider that answers with the session's own next turn
and bills every prompt through the cache simulator.

It serves ``POST /v1/chat/completions`` on 127.0.0.1 (a free port) for one
strategy run. Who is calling is the bearer key: the replay client gives each
session its own (:meth:`LoopbackUpstream.register`), and the proxy sends the
caller's key upstream for its own summary calls too, so both kinds of call are
billed to the session they belong to. The two kinds are told apart by the
replay marker, a body field only the replay client writes and the proxy
forwards as a field it does not own::

    chat call     body[REPLAY_FIELD] = {"replay": {"turn": k, "step": i, "time": t}}
                  → messages[k] of the session (tool calls included), its
                    usage, and a record priced at virtual time t
    summary call  no marker (the proxy's own request)
                  → the stand-in model's summary (:mod:`evaluation.replay.standin`),
                    within max_tokens, billed at the session's latest virtual time;
                    ``background`` when the session's client had no request
                    waiting for its chat call (:meth:`LoopbackUpstream.expect`)

Every reply carries OpenAI's usage: ``prompt_tokens``, ``completion_tokens``
and ``prompt_tokens_details.cached_tokens``. Anything else (a model listing, a
request without a registered key, a broken body) gets an error, counted in
:attr:`LoopbackUpstream.refused`. The server runs on the caller's event loop;
:meth:`start` and :meth:`close` bound its life.
"""

from __future__ import annotations

import socket
import time as wallclock
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp import web

from compaction import Message
from evaluation.replay.cache import SegmentTokens
from evaluation.replay.prompts import message_segment, prompt_segments, sent_text
from evaluation.replay.records import FactScore, Recorder
from evaluation.replay.standin import stand_in_reply, turn_prefix_prompt

#: The body field of the replay client's requests that the proxy forwards as it is.
REPLAY_FIELD: Final = "metadata"
_MARKER: Final = "replay"
#: The summary a summary call gets when it asks for no limit.
DEFAULT_SUMMARY_TOKENS: Final = 4_000

#: Scores the next-step facts of the cut at ``turn`` against the messages sent for it.
FactScorer = Callable[[int, Sequence[Message]], FactScore | None]


def replay_marker(turn: int, step: int, virtual_time: float) -> dict[str, Any]:
    """The body field the replay client adds to its request for cut point ``turn``,
    its ``step``-th, sent at ``virtual_time``."""
    return {_MARKER: {"turn": turn, "step": step, "time": virtual_time}}


@dataclass(frozen=True)
class Script:
    """One registered session: its id, its messages, and how to score a cut."""

    session: str
    messages: list[Message]
    scorer: FactScorer | None = None


class LoopbackUpstream:
    """The upstream of one strategy run (see the module docstring)."""

    def __init__(self, recorder: Recorder, tokens: SegmentTokens) -> None:
        self.recorder = recorder
        self._tokens = tokens
        self._scripts: dict[str, Script] = {}
        self._latest: dict[str, float] = {}
        #: Sessions whose client sent a request whose chat call has not come yet.
        self._waiting: set[str] = set()
        self.refused = 0
        self.summaries_in_flight = 0
        #: Wall-clock seconds spent pricing and scoring calls (the replay's own cost).
        self.busy_seconds = 0.0
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def register(self, key: str, script: Script) -> None:
        """Calls presenting ``Bearer <key>`` belong to ``script``'s session."""
        self._scripts[key] = script

    def expect(self, session: str) -> None:
        """``session``'s client sent a request: summary calls until its chat call
        comes are on that request's path; any other is a preparation ahead."""
        self._waiting.add(session)

    async def start(self) -> str:
        """Serve on a free loopback port; the base URL (with ``/v1``)."""
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock)
        await site.start()
        self._runner = runner
        port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self.base_url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _chat(self, request: web.Request) -> web.Response:
        script = self._scripts.get(_bearer(request.headers.get("authorization", "")))
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        if script is None or not isinstance(body, dict):
            self.refused += 1
            return web.json_response({"error": {"message": "not a replay call"}}, status=401)
        marker = body.get(REPLAY_FIELD)
        marker = marker.get(_MARKER) if isinstance(marker, dict) else None
        if isinstance(marker, dict):
            return self._reply(body, *self._answer(script, body, marker))
        self.summaries_in_flight += 1
        try:
            return self._reply(body, *self._summarize(script, body))
        finally:
            self.summaries_in_flight -= 1

    def _answer(
        self, script: Script, body: dict[str, Any], marker: dict[str, Any]
    ) -> tuple[Message, int, int, int]:
        started = wallclock.perf_counter()
        turn, step, at = int(marker["turn"]), int(marker["step"]), float(marker["time"])
        self._latest[script.session] = max(at, self._latest.get(script.session, 0.0))
        self._waiting.discard(script.session)
        answer = script.messages[turn]
        messages = list(body.get("messages") or ())
        facts = script.scorer(turn, messages) if script.scorer is not None else None
        output = self._tokens.count(message_segment(answer))
        text = sent_text(messages) if self.recorder.unused(script.session) else ""
        call = self.recorder.chat(
            script.session, turn, step, at, prompt_segments(body), output, facts=facts, text=text
        )
        self.busy_seconds += wallclock.perf_counter() - started
        reply: Message = {
            key: answer[key] for key in ("role", "content", "tool_calls") if key in answer
        }
        reply.setdefault("content", None)
        return reply, call.tokens, call.cached, call.output

    def _summarize(self, script: Script, body: dict[str, Any]) -> tuple[Message, int, int, int]:
        started = wallclock.perf_counter()
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        limit = int(limit) if isinstance(limit, int) and limit > 0 else DEFAULT_SUMMARY_TOKENS
        messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
        text = stand_in_reply(messages, limit, self._tokens.count)
        output = self._tokens.count(text)
        at = self._latest.get(script.session, 0.0)
        call = self.recorder.summary(
            script.session,
            at,
            prompt_segments(body),
            output,
            reply=text,
            kind="turn-prefix" if turn_prefix_prompt(messages) else "main",
            background=script.session not in self._waiting,
        )
        self.busy_seconds += wallclock.perf_counter() - started
        return {"role": "assistant", "content": text}, call.tokens, call.cached, call.output

    @staticmethod
    def _reply(
        body: dict[str, Any], message: Message, tokens: int, cached: int, output: int
    ) -> web.Response:
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        payload = {
            "id": "chatcmpl-replay",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", ""),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": tokens,
                "completion_tokens": output,
                "total_tokens": tokens + output,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
        return web.Response(body=orjson.dumps(payload), content_type="application/json")


def _bearer(value: str) -> str:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
