"""Drivers for the real agent CLIs' headless input modes, and the scripted
upstreams and proxy recording that the real-client tests read.

* :class:`ClaudeStream` runs ``claude -p --input-format stream-json``: user
  messages go in on stdin as the user types them (also while a tool runs),
  events come out on stdout.
* :class:`CodexAppServer` runs ``codex app-server`` (JSON-RPC over stdio, the
  protocol the Codex IDE extension speaks): ``turn/start`` begins a turn,
  ``turn/steer`` is what the TUI sends when the user types while the turn runs.
* :class:`RecordingApp` wraps the proxy's ASGI app and keeps the status and
  headers of every answer (the ``x-compaction-*`` figures the CLIs never show).
* :class:`FocusAnthropicUpstream` and :class:`FocusResponsesUpstream` are the
  scripted upstreams whose summaries name the ``<focus>`` the proxy's
  summarizer prompt carried, so a test can tell which compaction a forwarded
  summary came from.
* :func:`gate` is a shell command that waits for a file: a tool that runs
  until the test has typed what it means to type during it.

Every wait here has a generous deadline that only keeps a broken CLI from
hanging the run; no test asserts on how long anything took.
"""

from __future__ import annotations

import json
import queue
import re
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from compaction.prompts import TURN_PREFIX_SYSTEM_PROMPT
from tests.proxy.dialects.anthropic_upstream import AnthropicUpstream, is_summary_request
from tests.proxy.dialects.anthropic_upstream import _events as anthropic_events
from tests.proxy.dialects.responses_upstream import Received as ResponsesReceived
from tests.proxy.dialects.responses_upstream import ResponsesUpstream
from tests.proxy.dialects.responses_upstream import _message as message_item
from tests.proxy.servers import SUMMARY_TEXT, TURN_PREFIX_TEXT

#: Deadline for one event of a CLI: a broken client fails the test, never hangs it.
EVENT_TIMEOUT = 120.0
_FOCUS = re.compile(r"<focus>\s*(.*?)\s*</focus>", re.S)
#: The proxy's answer to ``/compact`` (proxy/manual.py's wording).
COMPACTED = re.compile(
    r"Context compacted: ([\d,]+) → ([\d,]+) tokens \((\d+) messages condensed\)"
)


def gate(flag: Path, then: str) -> str:
    """A shell command that waits until ``flag`` exists, then runs ``then``."""
    quoted = shlex.quote(str(flag))
    return f"while [ ! -f {quoted} ]; do sleep 0.05; done; {then}"


def focus_of(body: Any) -> str | None:
    """The ``<focus>`` of a summarizer request (the ``/compact`` instructions), if any."""
    found = _FOCUS.search(json.dumps(body, ensure_ascii=False).replace("\\n", "\n"))
    return found.group(1) if found else None


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


# --- the CLIs -----------------------------------------------------------------


class _Lines:
    """A process's stdout read line by line on a thread, as JSON objects."""

    def __init__(self, stream: IO[str]) -> None:
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.pending: list[dict[str, Any]] = []
        self.seen: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str]) -> None:
        with stream:
            for line in stream:
                line = line.strip()
                if line.startswith("{"):
                    self._queue.put(json.loads(line))
        self._queue.put(None)

    def until(self, wanted: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The first event not yet taken for which ``wanted`` holds (events
        before it stay pending for later calls)."""
        for i, event in enumerate(self.pending):
            if wanted(event):
                return self.pending.pop(i)
        while True:
            try:
                event = self._queue.get(timeout=EVENT_TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"the CLI sent no {what}") from None
            if event is None:
                raise AssertionError(f"the CLI ended before it sent {what}")
            self.seen.append(event)
            if wanted(event):
                return event
            self.pending.append(event)


class _Process:
    def __init__(self, argv: list[str], cwd: Path, env: Mapping[str, str], log: Path) -> None:
        self._log = log.open("w")
        self.log = log
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.process.stdout is not None
        self.events = _Lines(self.process.stdout)

    def write(self, message: Mapping[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def close(self) -> int:
        """Close stdin (the end of the user's input) and wait for the exit status."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            return self.process.wait(timeout=EVENT_TIMEOUT)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.events.reader.join(timeout=EVENT_TIMEOUT)
            self._log.close()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


class ClaudeStream(_Process):
    """``claude -p`` in stream-json mode: what a user types arrives on stdin."""

    def __init__(self, claude: str, args: list[str], cwd: Path, env: Mapping[str, str]) -> None:
        argv = [
            claude,
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            *args,
        ]
        super().__init__(argv, cwd, env, cwd.parent / "claude-stderr.log")

    def type(self, text: str) -> None:
        """The user types ``text`` and presses enter."""
        self.write({"type": "user", "message": {"role": "user", "content": text}})

    def tool_use(self) -> dict[str, Any]:
        """The next tool call Claude Code starts."""
        event = self.events.until(
            lambda e: (
                e.get("type") == "assistant"
                and any(b.get("type") == "tool_use" for b in e["message"]["content"])
            ),
            "tool call",
        )
        return next(b for b in event["message"]["content"] if b.get("type") == "tool_use")

    def result(self) -> dict[str, Any]:
        """The ``result`` event that ends the current turn."""
        return self.events.until(lambda e: e.get("type") == "result", "result")


class CodexAppServer(_Process):
    """``codex app-server``: a thread, turns, and steering while a turn runs."""

    def __init__(self, codex: str, cwd: Path, env: Mapping[str, str]) -> None:
        super().__init__([codex, "app-server"], cwd, env, cwd.parent / "codex-stderr.log")
        self._ids: Iterator[int] = iter(range(1, 1_000_000))
        self.call("initialize", {"clientInfo": {"name": "compaction-proxy-tests", "version": "0"}})
        self.write({"method": "initialized"})

    def send(self, method: str, params: Mapping[str, Any]) -> int:
        ident = next(self._ids)
        self.write({"id": ident, "method": method, "params": params})
        return ident

    def answer(self, ident: int) -> Any:
        event = self.events.until(
            lambda e: e.get("id") == ident and "method" not in e, f"answer {ident}"
        )
        assert "error" not in event, event
        return event["result"]

    def call(self, method: str, params: Mapping[str, Any]) -> Any:
        return self.answer(self.send(method, params))

    def notification(self, wanted: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        return self.events.until(lambda e: "id" not in e and wanted(e), what)

    def start_thread(self, cwd: Path) -> str:
        params = {"cwd": str(cwd), "approvalPolicy": "never", "sandbox": "danger-full-access"}
        return str(self.call("thread/start", params)["thread"]["id"])

    def start_turn(self, thread: str, text: str) -> str:
        params = {"threadId": thread, "input": [{"type": "text", "text": text}]}
        return str(self.call("turn/start", params)["turn"]["id"])

    def steer(self, thread: str, turn: str, text: str) -> None:
        """The user types ``text`` while ``turn`` runs (what the TUI sends)."""
        params = {
            "threadId": thread,
            "expectedTurnId": turn,
            "input": [{"type": "text", "text": text}],
        }
        self.call("turn/steer", params)

    def command_started(self) -> dict[str, Any]:
        """The next command Codex starts to run."""
        return self.notification(
            lambda e: (
                e.get("method") == "item/started"
                and e["params"]["item"].get("type") == "commandExecution"
            ),
            "command",
        )["params"]["item"]

    def turn_completed(self) -> list[dict[str, Any]]:
        """Wait for the running turn to end; its items."""
        event = self.notification(lambda e: e.get("method") == "turn/completed", "turn end")
        return list(event["params"]["turn"].get("items") or [])

    def agent_messages(self) -> list[str]:
        """Every agent message text the server reported so far."""
        return [
            e["params"]["item"]["text"]
            for e in self.events.seen
            if e.get("method") == "item/completed"
            and e["params"]["item"].get("type") == "agentMessage"
        ]
