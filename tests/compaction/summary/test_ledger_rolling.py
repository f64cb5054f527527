"""A qwen-code-shaped session in a tight window, compacting at every turn: the
newest errors of the compacted turns stay in every request sent on.

The fixture's 14 tool schemas take about 9k of a 16k window that keeps 4,096
tokens for the answer, so each turn's request crosses the limit and is
compacted (from the eighth on) over the checkpoint of the turn before, as the proxy does (decide
with the stored checkpoints, execute, store the new one). Each turn runs a
command whose output ends in its own error line. A rolling summary that
keeps its oldest lines would lose the newest errors; the ledger keeps them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from compaction import Profile, TokenCounter, execute, message_text
from compaction.budget.calibrated import calibrated_budget
from compaction.conversation.checkpoints import Checkpoint
from compaction.conversation.reading import read_conversation
from compaction.stages.decide import decide
from compaction.stages.results import new_checkpoint
from tests.compaction.summary.test_ledger_corpus import prose_only
from tests.synthetic import qwen_shell_turn

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "clients"
COUNTER = TokenCounter("gpt-4o")
WINDOW = 16_384
MAX_TOKENS = 4_096
TURNS = 30
NEWEST = 5
TASK = "Make the test suite of the parser pass; the failures are listed in ticket PARSE-314."


def _tools() -> list[dict[str, Any]]:
    path = FIXTURES / "qwen-code-tools.json"
    if not path.is_file():
        pytest.skip(f"{path} is absent: the qwen-code tools live in ../shared/fixtures/clients")
    tools: list[dict[str, Any]] = json.loads(path.read_text())
    return tools


def _error(turn: int) -> str:
    return f"AssertionError: step {turn} expected parse(tokens_{turn}) to be balanced"


def _turn(turn: int) -> list[dict[str, Any]]:
    return qwen_shell_turn(turn, f"E   {_error(turn)}")


def _forwarded(mode: str) -> list[tuple[int, list[dict[str, Any]]]]:
    """Each turn's request after compaction, with the number of turns it holds."""
    tools = _tools()
    profile = Profile(context_window=WINDOW, summarizer=mode)  # type: ignore[arg-type]
    budget = calibrated_budget(profile, MAX_TOKENS)
    summarizer = prose_only(TASK) if mode == "llm" else None
    stored: dict[str, Checkpoint] = {}
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are Qwen Code, a CLI agent for software tasks."},
        {"role": "user", "content": TASK},
    ]
    forwarded = []
    for turn in range(TURNS):
        history.extend(_turn(turn))
        body: dict[str, Any] = {"model": "qwen3-coder", "messages": history, "tools": tools}
        body["max_tokens"] = MAX_TOKENS
        conversation = read_conversation(body, list(history), COUNTER, profile.head_count)
        decision = decide(conversation, profile, budget, stored=stored)
        result = asyncio.run(execute(conversation, decision, summarizer))
        made = new_checkpoint(
            conversation,
            result,
            id=f"t{turn}",
            created_at=float(turn),
            progress_ok=True,
            base=decision.checkpoint,
        )
        if made is not None:
            stored[made.end_hash] = made
        forwarded.append((turn + 1, result.messages))
    return forwarded


def _text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(message_text(m) for m in messages)


@pytest.mark.parametrize("mode", ["extractive", "llm"])
def test_every_request_keeps_the_newest_errors_of_the_turns_it_compacted(mode: str) -> None:
    compacted_requests = 0
    for turns, messages in _forwarded(mode):
        text = _text(messages)
        verbatim = {t for t in range(turns) if f"call_{t:04d}" in json.dumps(messages)}
        compacted = [t for t in range(turns) if t not in verbatim]
        if not compacted:
            continue
        compacted_requests += 1
        for turn in compacted[-NEWEST:]:
            assert _error(turn) in text, f"request of {turns} turns lost the error of turn {turn}"
    # The first turns fit; from the eighth on, every request is compacted.
    assert compacted_requests >= TURNS * 2 // 3, "the window was not tight enough to compact"
