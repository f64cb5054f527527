"""Drivers for the real agent CLIs' headless input modes.

* :class:`ClaudeStream` runs ``claude -p --input-format stream-json``: user
  messages go in on stdin as the user types them (also while a tool runs),
  events come out on stdout.
* :class:`CodexAppServer` runs ``codex app-server`` (JSON-RPC over stdio, the
  protocol the Codex IDE extension speaks): ``turn/start`` begins a turn,
  ``turn/steer`` is what the TUI sends when the user types while the turn runs.
* :func:`gate` is a shell command that waits for a file: a tool that runs
  until the test has typed what it means to type during it.

Every wait here has a generous deadline that only keeps a broken CLI from
hanging the run; no test asserts on how long anything took.
"""

from __future__ import annotations

import json
import queue
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

#: Deadline for one event of a CLI: a broken client fails the test, never hangs it.
EVENT_TIMEOUT = 120.0


def gate(flag: Path, then: str) -> str:
    """A shell command that waits until ``flag`` exists, then runs ``then``."""
    quoted = shlex.quote(str(flag))
    return f"while [ ! -f {quoted} ]; do sleep 0.05; done; {then}"


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
