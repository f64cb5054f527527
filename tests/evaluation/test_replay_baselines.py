"""The replay's baselines (evaluation/replay/baselines.py): truncation, masking and
Claude Code-style compaction, on hand-made and generated sessions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from compaction import is_summary, load_encoding, validate_tool_pairing
from evaluation.replay.baselines import (
    CLAUDE_CODE_SHARE,
    MASK_KEEP,
    ClaudeCode,
    Context,
    Masking,
    Truncation,
    input_limit,
    masked,
    truncated,
)
from evaluation.replay.cache import SegmentTokens
from evaluation.replay.sessions import session_of
from tests.synthetic import agent_session

WINDOW = 8_192


@pytest.fixture(scope="module")
def tokens() -> SegmentTokens:
    encoding = load_encoding("o200k_base")
    assert encoding is not None
    return SegmentTokens(encoding)


def context_of(messages: list[dict[str, Any]], tokens: SegmentTokens) -> Context:
    session = session_of("test", {"messages": messages})
    assert session is not None
    return Context(WINDOW, session.head, None, tokens.count)


def histories(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What the client sends at each cut point."""
    return [messages[:k] for k, m in enumerate(messages) if k > 2 and m["role"] == "assistant"]


def test_the_input_limit_is_the_window_less_the_output_room() -> None:
    assert input_limit(8_192) == 6_144
    assert input_limit(200_000) == 200_000 - 16_384


def test_truncation_keeps_the_head_and_whole_groups_under_the_limit(
    tokens: SegmentTokens,
) -> None:
    messages = agent_session(seed=3, steps=40, output_chars=3_000)
    context = context_of(messages, tokens)
    over = 0
    for history in histories(messages):
        sent = asyncio.run(Truncation(context).send(history))
        assert sent.messages[:2] == history[:2]
        assert validate_tool_pairing(sent.messages) == []
        assert context.tokens(sent.messages) <= context.limit
        # What is kept after the head is the newest stretch of the history, whole.
        kept = sent.messages[2:]
        assert kept == history[len(history) - len(kept) :]
        over += sent.messages != history
    assert over > 10


def test_truncation_never_drops_the_newest_group_even_above_the_limit(
    tokens: SegmentTokens,
) -> None:
    messages = agent_session(seed=1, steps=3, output_chars=60_000)
    context = context_of(messages, tokens)
    sent = truncated(messages, context)
    assert sent[-1] == messages[-1]
    assert validate_tool_pairing(sent) == []


def test_masking_keeps_the_newest_outputs_and_hides_the_older_ones() -> None:
    messages = agent_session(seed=5, steps=30, output_chars=2_000)
    results = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    hidden = masked(messages, head=2)
    for i in results[-MASK_KEEP:]:
        assert hidden[i] == messages[i]
    older = [i for i in results[:-MASK_KEEP] if len(messages[i]["content"]) > 100]
    assert older
    for i in older:
        assert hidden[i]["content"].startswith("[Old tool output hidden")
        assert hidden[i]["tool_call_id"] == messages[i]["tool_call_id"]
    assert messages == agent_session(seed=5, steps=30, output_chars=2_000)


def test_masking_stays_under_the_limit_and_keeps_pairs(tokens: SegmentTokens) -> None:
    messages = agent_session(seed=7, steps=60, output_chars=3_000)
    context = context_of(messages, tokens)
    for history in histories(messages):
        sent = asyncio.run(Masking(context).send(history))
        assert validate_tool_pairing(sent.messages) == []
        assert context.tokens(sent.messages) <= context.limit


def test_claude_code_summarizes_past_its_share_then_appends_to_the_summary(
    tokens: SegmentTokens,
) -> None:
    messages = agent_session(seed=2, steps=40, output_chars=3_000)
    context = context_of(messages, tokens)
    strategy = ClaudeCode(context)
    compactions = []
    previous: list[dict[str, Any]] | None = None
    for history in histories(messages):
        sent = asyncio.run(strategy.send(history))
        assert validate_tool_pairing(sent.messages) == []
        if sent.compacted:
            compactions.append(sent)
            assert sent.summary_prompt is not None
            # The prompt it would have sent passed the share (or the input limit,
            # if lower); the summary call reads it.
            trigger = min(CLAUDE_CODE_SHARE * WINDOW, context.limit)
            assert context.tokens(sent.summary_prompt[:-1]) > trigger
            assert sent.summary_prompt[-1]["role"] == "user"
            assert any(is_summary(m) for m in sent.messages)
            assert sent.summary_output > 0
        else:
            # Never above the limit every strategy is held to ...
            assert context.tokens(sent.messages) <= context.limit
            if previous is not None:
                # ... and between compactions the prompt only grows.
                assert sent.messages[: len(previous)] == previous
        previous = sent.messages
    assert len(compactions) >= 2
