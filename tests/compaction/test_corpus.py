"""Every real conversation in ../shared/fixtures, compacted at 8k, 16k and 32k
with each strategy."""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path
from typing import Any, get_args

import orjson
import pytest

from compaction import (
    CannotFitError,
    Profile,
    Strategy,
    TokenCounter,
    compact,
    requested_output_tokens,
    validate_tool_pairing,
)
from compaction.chat.calls import parse_arguments as parse_args
from compaction.chat.groups import group_messages
from compaction.chat.messages import call_name_and_arguments as call_parts
from compaction.chat.messages import message_text, tool_calls
from compaction.chat.own import SUMMARY_MARKER
from compaction.conversation.regions import head_end

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
# Request bodies only: clients/ also holds a bare list of tool schemas.
FILES = [
    path
    for path in (sorted(FIXTURES.glob("*/*.json")) if FIXTURES.is_dir() else [])
    if isinstance(orjson.loads(path.read_bytes()), dict)
]
WINDOWS = (8_192, 16_384, 32_768)
STRATEGIES = get_args(Strategy)
COUNTER = TokenCounter("gpt-4o")

if not FILES:
    pytest.skip(f"corpus tests skipped: no fixtures at {FIXTURES}", allow_module_level=True)


def _load(path: Path) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(path.read_bytes())
    return body


def _sed_modified(command: str) -> set[str]:
    """An independent oracle: files edited in place with ``sed -i``."""
    found = set()
    for match in re.finditer(
        r"\bsed\s+-i\S*\s+(?:'[^']*'|\"[^\"]*\")(?:\s+-e\s+\S+)*\s+(\S+)", command
    ):
        path = match.group(1).strip("'\"")
        if "/" in path or "." in path:
            found.add(path)
    return found


def _edited_paths(messages: list[dict[str, Any]]) -> set[str]:
    paths: set[str] = set()
    for message in messages:
        for call in tool_calls(message):
            name, arguments = call_parts(call)
            args = parse_args(arguments)
            if not isinstance(args, dict):
                continue
            if name in ("edit", "create", "str_replace_editor") and isinstance(
                args.get("path"), str
            ):
                paths.add(args["path"])
            command = args.get("command")
            if name == "bash" and isinstance(command, str):
                paths |= _sed_modified(command)
    return paths


@pytest.mark.corpus
@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fixture_compacts_within_limit_at_every_window(path: Path) -> None:
    body = _load(path)
    messages = body["messages"]
    head = head_end(messages, group_messages(messages), 2)
    for window, strategy in itertools.product(WINDOWS, STRATEGIES):
        profile = Profile(context_window=window, summarizer="extractive", strategy=strategy)
        try:
            result = asyncio.run(compact(body, profile, counter=COUNTER))
        except CannotFitError as exc:
            # Legitimate only when the system prompt and task, with the tool
            # schemas, alone exceed L; or when the output the request asks
            # for (qwen-code's max_tokens, 16,384) leaves no L at all.
            if exc.part == "output":
                requested = requested_output_tokens(body)
                assert (exc.tokens, exc.window) == (requested, window) and exc.limit <= 0, exc
                continue
            head_tokens = sum(COUNTER.count_messages(messages[:head]))
            head_tokens += COUNTER.request_overhead(body)
            assert exc.part == "head" and head_tokens > exc.limit, exc
            continue
        out = result.messages
        assert result.tokens_after <= result.input_limit, (window, result.notes)
        assert validate_tool_pairing(out) == []
        assert all(a is b for a, b in zip(out[:head], messages[:head], strict=True))
        assert out[-1] is messages[-1] or result.stage == "truncated"
        if strategy == "mask":
            assert result.summarizer_calls == 0 and result.summary is None
            assert result.stage in ("none", "masked", "truncated"), result.stage
        if result.stage == "condensed":
            summaries = [m for m in out if message_text(m).startswith(SUMMARY_MARKER)]
            assert summaries, "condensed without a summary message"
            text = "\n".join(message_text(m) for m in summaries)
            # A conversation that is one long turn (a tau-bench dialogue) may keep
            # its opener and condense only the turn's start: that note has no Goal.
            assert "Goal" in text or "of the current turn, condensed" in text
            replaced = [m for m in messages if not any(m is o for o in out)]
            # A file edited in what was replaced is named by the summary, or by
            # the edit itself where the compaction kept it pruned after the summary.
            kept = "\n".join(
                f"{message_text(m)} {orjson.dumps(tool_calls(m)).decode()}"
                for m in out
                if not message_text(m).startswith(SUMMARY_MARKER)
            )
            for edited in _edited_paths(replaced):
                assert edited in text or edited in kept, f"{edited} lost at {window}"


@pytest.mark.corpus
def test_the_largest_fixture_is_condensed_and_keeps_its_task() -> None:
    largest = max(FILES, key=lambda p: p.stat().st_size)
    body = _load(largest)
    task = message_text(body["messages"][1])
    result = asyncio.run(compact(body, Profile(context_window=16_384, summarizer="extractive")))
    assert result.stage in ("condensed", "truncated")
    assert result.tokens_after <= result.input_limit
    assert message_text(result.messages[1]) == task
    summary = next(m for m in result.messages if message_text(m).startswith(SUMMARY_MARKER))
    assert "<modified-files>" in message_text(summary)
