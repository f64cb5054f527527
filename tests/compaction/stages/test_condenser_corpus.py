"""No summary outweighs the span it stands for, over every real conversation in
../shared/fixtures: short spans (a message or two, where a summary's fixed header
and sections are largest against what they replace) and long ones."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from compaction import Profile, TokenCounter
from compaction.chat.groups import group_messages
from compaction.chat.own import is_summary
from compaction.conversation.regions import head_end
from compaction.errors import SummarizationError
from compaction.stages.condenser import condense, find_middle
from compaction.types import Message

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures"
FILES = [
    path
    for path in (sorted(FIXTURES.glob("*/*.json")) if FIXTURES.is_dir() else [])
    if isinstance(orjson.loads(path.read_bytes()), dict)
]
COUNTER = TokenCounter("gpt-4o")
PROFILE = Profile(summarizer="extractive")

if not FILES:
    pytest.skip(f"corpus tests skipped: no fixtures at {FIXTURES}", allow_module_level=True)


def _tokens(messages: list[Message]) -> int:
    return sum(COUNTER.count_messages(messages))


def _tails(messages: list[Message], head: int) -> list[int]:
    """Where a condensed span may end: one, two and three groups after the head,
    half way, and before the newest group."""
    starts = [g.start for g in group_messages(messages) if g.start > head]
    if not starts:
        return []
    picked = {*starts[:3], starts[len(starts) // 2], starts[-1]}
    return sorted(picked)


def _spans(messages: list[Message], head: int, tail: int) -> list[tuple[int, int]]:
    plan = find_middle(messages, head, tail)
    spans = [(head, plan.main_end)]
    if plan.turn_start is not None:
        spans.append((plan.turn_start + 1, tail))
    return spans


@pytest.mark.corpus
@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_summary_outweighs_its_span(path: Path) -> None:
    messages: list[Message] = orjson.loads(path.read_bytes())["messages"]
    head = head_end(messages, group_messages(messages), PROFILE.head_count)
    for tail in _tails(messages, head):
        plan = find_middle(messages, head, tail)
        try:
            result = asyncio.run(
                condense(messages, plan, profile=PROFILE, counter=COUNTER, summarizer=None)
            )
        except SummarizationError:
            continue  # not condensed: nothing was replaced
        out = result.messages
        assert _tokens(out) < _tokens(messages), f"tail {tail}: the request grew"
        written = [m for m in out if is_summary(m)]
        # Each summary against its own span: the main one stands right after the
        # head, the turn prefix's right after the turn's opener.
        for summary in written:
            where = next(i for i, m in enumerate(out) if m is summary)
            start, end = _spans(messages, head, tail)[0 if where == head else 1]
            pinned = set(plan.pinned)
            span = [messages[i] for i in range(start, end) if i not in pinned]
            assert COUNTER.count_message(summary) < _tokens(span), (
                f"tail {tail}: a summary of {end - start} messages outweighs them"
            )


def test_the_corpus_has_spans_too_small_to_summarize() -> None:
    """The property above is not vacuous: some spans of the corpus are kept as
    they were because a summary would outweigh them."""
    kept = 0
    for path in FILES[:40]:
        messages: list[Any] = orjson.loads(path.read_bytes())["messages"]
        head = head_end(messages, group_messages(messages), PROFILE.head_count)
        for tail in _tails(messages, head)[:1]:
            try:
                result = asyncio.run(
                    condense(
                        messages,
                        find_middle(messages, head, tail),
                        profile=PROFILE,
                        counter=COUNTER,
                        summarizer=None,
                    )
                )
            except SummarizationError:
                kept += 1
                continue
            kept += not is_summary(result.messages[head])
    assert kept > 0
