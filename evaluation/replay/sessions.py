"""The sessions a replay plays back, and their cut points.

A session is one request body of the fixtures (``{model, messages, tools?}``):
its messages are the whole conversation. A **cut point** is every index ``k``
past the head where ``messages[k]`` is an assistant message: the client sends
``messages[:k]`` and the model's answer is ``messages[k]`` itself, so the next
request is the history up to the next cut — a client that resends its whole
history every turn, as agents do. The head is the system prompt and the first
user message (:func:`compaction.head_end` with two messages).

By default a replay takes every mini-swe-agent and swe-agent session and a
deterministic sample of the tau-bench dialogues (every :data:`TAU_STRIDE`-th,
by name). ``synthetic_sessions`` builds long coding sessions with the
project's own generator (``tests/synthetic.py``, imported only when asked:
it lives with the tests), for the 200k window.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from compaction import Message, group_messages, head_end

#: The fixture folders a replay takes by default, and how it samples each.
DEFAULT_SETS: Final = ("mini-swe-agent", "swe-agent", "tau-bench")
TAU_STRIDE: Final = 5
#: Leading messages the head holds at least (the system prompt and the task).
HEAD_COUNT: Final = 2
#: The model every replayed request names: o200k is the simulator's tokenizer
#: and the proxy's counter for it, so the two count alike.
REPLAY_MODEL: Final = "gpt-4o"


@dataclass(frozen=True)
class Session:
    """One conversation to replay."""

    name: str  #: its path under the fixtures folder
    messages: list[Message]
    tools: list[Any] | None
    head: int  #: index one past the head
    cuts: tuple[int, ...] = field(default=())

    def body(self, k: int) -> dict[str, Any]:
        """The request the client sends at cut point ``k`` (without the replay marker)."""
        body: dict[str, Any] = {"model": REPLAY_MODEL, "messages": self.messages[:k]}
        if self.tools:
            body["tools"] = self.tools
        return body


def session_of(name: str, body: dict[str, Any]) -> Session | None:
    """The session a chat-completions body holds, or ``None`` when it has no cut point."""
    messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
    head = head_end(messages, group_messages(messages), HEAD_COUNT)
    cuts = tuple(k for k in range(head, len(messages)) if messages[k].get("role") == "assistant")
    if not cuts:
        return None
    tools = body.get("tools") or None
    return Session(name, messages, tools, head, cuts)


def load_sessions(
    folder: Path,
    *,
    sets: Sequence[str] = DEFAULT_SETS,
    patterns: Sequence[str] = (),
    tau_stride: int = TAU_STRIDE,
    limit: int | None = None,
) -> list[Session]:
    """The sessions of ``folder``'s ``sets``, sorted by name; only names matching one
    of ``patterns`` (globs) when given, then at most ``limit``."""
    sessions: list[Session] = []
    for set_name in sets:
        paths = sorted((folder / set_name).glob("*.json"))
        if set_name == "tau-bench" and not patterns:
            paths = paths[::tau_stride]
        for path in paths:
            name = path.relative_to(folder).as_posix()
            if patterns and not any(fnmatch.fnmatch(name, p) for p in patterns):
                continue
            body = orjson.loads(path.read_bytes())
            if isinstance(body, dict):
                session = session_of(name, body)
                if session is not None:
                    sessions.append(session)
    return sessions[:limit] if limit is not None else sessions


class SyntheticUnavailable(Exception):
    """The project's session generator cannot be imported here."""


def _generator() -> Callable[..., list[Message]]:
    root = Path(__file__).resolve().parents[2]
    if not (root / "tests" / "synthetic.py").is_file():
        raise SyntheticUnavailable("synthetic sessions need the project's tests/synthetic.py")
    if str(root) not in sys.path:
        sys.path.append(str(root))
    try:
        from tests.synthetic import agent_session
    except ImportError as exc:
        raise SyntheticUnavailable(f"synthetic sessions need the test extras: {exc}") from exc
    return agent_session


def synthetic_sessions(count: int, steps: int = 300, output_chars: int = 8_000) -> list[Session]:
    """``count`` long coding sessions of the project's generator (for the 200k window).

    The generator lives with the tests (``tests/synthetic.py``, which needs the
    test extras): it is imported from this checkout, and
    :class:`SyntheticUnavailable` says so when it cannot be.
    """
    agent_session = _generator()
    sessions = []
    for seed in range(count):
        messages = agent_session(seed=seed, steps=steps, output_chars=output_chars)
        session = session_of(f"synthetic/{seed}", {"messages": messages})
        if session is not None:
            sessions.append(session)
    return sessions
