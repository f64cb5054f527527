"""A qwen-code-shaped session through the proxy in a tight window, compacting
at (nearly) every turn: every request the proxy forwards keeps the newest
error lines of the turns it compacted away.

The engine's own test of this (tests/compaction/summary/test_ledger_rolling.py) runs
decide/execute by hand; this one runs the proxy in-process, so what is checked
is what the upstream is sent: the session's checkpoints as the proxy stores
and reuses them, its settings as they reach the engine, the request as the
dialect writes it back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.synthetic import qwen_shell_turn

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "clients"
MODEL = "qwen3-coder"
WINDOW = 16_384
MAX_TOKENS = 4_096
TURNS = 30
NEWEST = 5
TASK = "Make the test suite of the parser pass; the failures are listed in ticket PARSE-314."
#: The fixture's own system prompt is about 7k tokens and its 14 tool schemas
#: about 9k: together they fill a 16k window that keeps 4,096 tokens for the
#: answer before any turn is sent. A short system prompt leaves the tools as
#: they are and room for the turns, so the turns are what the proxy compacts.
SYSTEM = "You are Qwen Code, a CLI agent for software tasks."


def _fixture(name: str) -> Any:
    path = FIXTURES / name
    if not path.is_file():
        pytest.skip(f"{path} is absent: the qwen-code request lives in ../shared/fixtures/clients")
    return json.loads(path.read_text())


def _tools() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = _fixture("qwen-code-request.json")["tools"]
    assert len(tools) == 14 and tools == _fixture("qwen-code-tools.json")
    return tools


def _error(turn: int) -> str:
    """The turn's own error line: an assertion on even turns, pytest's tally on
    odd ones (both count as error lines), each naming its turn so none is
    another's substring."""
    if turn % 2 == 0:
        return f"E   AssertionError: case {turn} failed: parse(tokens_{turn}) is unbalanced"
    return f"==== {turn} failed, 3 passed in 0.{turn:02d}s ===="


def _turn(turn: int) -> list[dict[str, Any]]:
    return qwen_shell_turn(turn, _error(turn))


def _text(message: dict[str, Any]) -> str:
    """Everything of a forwarded message the model reads."""
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    text = content if isinstance(content, str) else ""
    for call in message.get("tool_calls") or []:
        text += "\n" + json.dumps(call.get("function", {}))
    return text


def _session(proxy: InProcessProxy) -> tuple[list[str], list[list[dict[str, Any]]]]:
    """Runs the 30 turns; returns each answer's compaction stage and each
    forwarded chat request's messages, in order."""
    tools = _tools()
    history: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    stages = []
    for turn in range(TURNS):
        history.extend(_turn(turn))
        body = {"model": MODEL, "messages": history, "tools": tools, "max_tokens": MAX_TOKENS}
        response = proxy.http.post(
            f"{proxy.url}/chat/completions",
            json=body,
            headers={"authorization": "Bearer sk-client"},
        )
        assert response.status_code == 200, response.text[:300]
        stages.append(response.headers["x-compaction-stage"])
    forwarded = [r.json()["messages"] for r in proxy.transport.asked("/chat/completions")]
    return stages, forwarded


def _flat(text: str) -> str:
    """``text`` with each run of spaces and tabs as one space: the summary
    quotes an error line with the runs inside it collapsed (pytest's
    ``E   AssertionError`` as ``E AssertionError``), every word kept in order."""
    return re.sub(r"[ \t]+", " ", text)


def _losses(forwarded: list[list[dict[str, Any]]]) -> tuple[int, list[tuple[int, int]]]:
    """How many forwarded requests compacted turns away, and each (request,
    turn) pair where one of the newest five such turns' error line is missing.

    A turn is compacted away when its error line is in none of the request's
    tool messages (its result removed, pruned or summarized)."""
    compacted_requests = 0
    lost = []
    for index, messages in enumerate(forwarded):
        tool_text = "\n".join(_text(m) for m in messages if m.get("role") == "tool")
        text = _flat("\n".join(_text(m) for m in messages))
        # A request holds the turns sent so far; the summarizer asks nothing
        # of the chat path here (extractive), so request i is turn i's.
        compacted = [t for t in range(index + 1) if _error(t) not in tool_text]
        if not compacted:
            continue
        compacted_requests += 1
        lost += [(index, t) for t in compacted[-NEWEST:] if _flat(_error(t)) not in text]
    return compacted_requests, lost


def _start(start_app: AppFactory, **compaction: Any) -> InProcessProxy:
    return start_app(
        models={"qwen*": {"context_window": WINDOW}},
        compaction={"summarizer": "extractive", **compaction},
    )


def test_every_forwarded_request_keeps_the_newest_errors_of_the_turns_compacted_away(
    start_app: AppFactory,
) -> None:
    stages, forwarded = _session(_start(start_app))
    assert len(forwarded) == TURNS, "one forwarded request a turn"
    compacting = [s for s in stages if s != "none"]
    # The first turns fit; once the window is full every turn compacts.
    assert len(compacting) >= TURNS * 2 // 3, f"only {len(compacting)} turns compacted: {stages}"
    compacted_requests, lost = _losses(forwarded)
    assert compacted_requests >= len(compacting), "a compacted turn kept every tool result"
    assert not lost, f"(request, turn) pairs whose error line was lost: {lost}"


def test_the_check_fails_where_the_error_lines_are_hidden(
    start_app: AppFactory,
) -> None:
    """The check above can fail: masking hides the outputs whole, error lines
    with them, and never summarizes, so nothing quotes them."""
    stages, forwarded = _session(_start(start_app, strategy="mask"))
    assert sum(s != "none" for s in stages) >= TURNS * 2 // 3
    _, lost = _losses(forwarded)
    assert lost, "every newest error was kept though the outputs were hidden"
