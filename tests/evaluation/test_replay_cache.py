"""The replay's prompt-cache simulator and its pricing (evaluation/replay/cache.py, records.py)."""

from __future__ import annotations

import pytest

from compaction import load_encoding
from compaction.budget.pricing import PRESETS
from evaluation.replay.cache import PromptCache, SegmentTokens
from evaluation.replay.prompts import message_segment, prompt_segments
from evaluation.replay.records import Call, Recorder


@pytest.fixture(scope="module")
def tokens() -> SegmentTokens:
    encoding = load_encoding("o200k_base")
    assert encoding is not None
    return SegmentTokens(encoding)


def segments(*texts: str) -> list[str]:
    return [message_segment({"role": "user", "content": text}) for text in texts]


A, B, C = segments(
    "Fix the failing test in tests/test_app.py.",
    "Ran pytest -q: 1 failed, 41 passed; AssertionError: expected 8192 got '8192'.",
    "The header value is parsed in src/app.py by parse_window_header.",
)


def size(tokens: SegmentTokens, *parts: str) -> int:
    return sum(tokens.count(part) for part in parts)


def shared(tokens: SegmentTokens, x: str, y: str) -> int:
    """Leading tokens ``x`` and ``y`` have in common."""
    count = 0
    for a, b in zip(tokens(x), tokens(y), strict=False):
        if a != b:
            break
        count += 1
    return count


def test_a_prompt_that_extends_the_previous_one_reads_all_of_it(tokens: SegmentTokens) -> None:
    cache = PromptCache(tokens, lifetime=300)
    first = cache.read("s", [A, B], now=0)
    second = cache.read("s", [A, B, C], now=30)
    assert (first.cached, first.written) == (0, size(tokens, A, B))
    assert second.cached == size(tokens, A, B)
    assert second.written == size(tokens, C)


def test_a_changed_early_message_breaks_the_prefix_where_it_changed(tokens: SegmentTokens) -> None:
    cache = PromptCache(tokens, lifetime=300)
    cache.read("s", [A, B, C], now=0)
    changed = B.replace("41 passed", "40 passed")
    read = cache.read("s", [A, changed, C], now=30)
    assert 0 < shared(tokens, B, changed) < tokens.count(B)
    assert read.cached == size(tokens, A) + shared(tokens, B, changed)


def test_an_entry_expires_after_its_lifetime_in_virtual_time(tokens: SegmentTokens) -> None:
    cache = PromptCache(tokens, lifetime=300)
    cache.read("s", [A, B], now=0)
    assert cache.read("s", [A, B, C], now=299).cached == size(tokens, A, B)
    other = PromptCache(tokens, lifetime=300)
    other.read("s", [A, B], now=0)
    assert other.read("s", [A, B, C], now=301).cached == 0


def test_a_read_refreshes_the_entry_it_read(tokens: SegmentTokens) -> None:
    cache = PromptCache(tokens, lifetime=300)
    cache.read("s", [A, B], now=0)
    # Reads A and the role marker B and C share, and so refreshes the first prompt.
    assert cache.read("s", [A, C], now=250).cached == size(tokens, A) + shared(tokens, B, C)
    # Without the refresh the first prompt would have expired at 300.
    assert cache.read("s", [A, B], now=500).cached == size(tokens, A, B)


def test_sessions_never_read_each_others_prompts(tokens: SegmentTokens) -> None:
    cache = PromptCache(tokens, lifetime=300)
    cache.read("one", [A, B], now=0)
    assert cache.read("two", [A, B], now=0).cached == 0
    assert cache.read("one", [A, B], now=0).cached == size(tokens, A, B)


def test_a_prompt_the_new_one_extends_is_dropped_and_entries_stay_bounded(
    tokens: SegmentTokens,
) -> None:
    cache = PromptCache(tokens, lifetime=300, max_entries=3)
    cache.read("s", [A], now=0)
    cache.read("s", [A, B], now=1)
    assert cache.entries("s") == 1
    for i in range(10):
        cache.read("s", segments(f"another conversation {i}"), now=2 + i)
    assert cache.entries("s") == 3


def test_the_tools_block_comes_first_so_a_new_tool_changes_everything_after_it(
    tokens: SegmentTokens,
) -> None:
    tool = {"type": "function", "function": {"name": "bash", "parameters": {}}}
    recall = {"type": "function", "function": {"name": "compaction_recall", "parameters": {}}}
    messages = [{"role": "user", "content": "Fix the failing test."}]
    before = prompt_segments({"tools": [tool], "messages": messages})
    after = prompt_segments({"tools": [tool, recall], "messages": messages})
    cache = PromptCache(tokens, lifetime=300)
    cache.read("s", before, now=0)
    read = cache.read("s", after, now=30)
    assert read.cached < tokens.count(before[0])


def test_a_call_is_priced_as_cache_reads_writes_and_output() -> None:
    call = Call("s", "chat", 3, 0, 0.0, tokens=1_000, cached=600, output=100)
    # Anthropic: 600 × 0.1 read + 400 × 1.25 written + 100 × 5 output.
    assert call.cost(PRESETS["anthropic"]) == pytest.approx(60 + 500 + 500)
    # OpenAI: no write premium, output at 8.
    assert call.cost(PRESETS["openai"]) == pytest.approx(60 + 400 + 800)


def test_the_recorder_marks_a_broken_prefix_and_a_repeated_summary_prompt(
    tokens: SegmentTokens,
) -> None:
    recorder = Recorder(PromptCache(tokens, lifetime=300))
    first = recorder.chat("s", 2, 0, 0.0, [A, B], output=5)
    extended = recorder.chat("s", 4, 1, 30.0, [A, B, C], output=5)
    rewritten = recorder.chat("s", 6, 2, 60.0, [A, C], output=5)
    asked = recorder.summary("s", 60.0, [B, C], output=50)
    again = recorder.summary("s", 90.0, [B, C], output=50)
    assert [first.broke, extended.broke, rewritten.broke] == [False, False, True]
    assert (asked.repeat, again.repeat) == (False, True)
    assert again.cached == again.tokens
    assert recorder.calls == [first, extended, rewritten, asked, again]


def test_a_summary_is_used_once_a_later_prompt_of_its_session_carries_its_reply(
    tokens: SegmentTokens,
) -> None:
    recorder = Recorder(PromptCache(tokens, lifetime=300))
    reply = "## Goal\n- fix parse_window_header"
    recorder.summary("s", 0.0, [A], output=20, reply=reply)
    recorder.summary("s", 0.0, [B], output=20, reply="## Goal\n- something else")
    recorder.summary("t", 0.0, [A], output=20, reply=reply)
    recorder.summary("s", 0.0, [C], output=20)  # a baseline's: not looked for
    assert [c.used for c in recorder.calls] == [False, False, False, True]
    prompt = f"[CONTEXT CONDENSED]\nSummary of 4 earlier messages\n\n{reply}\n\n<read-files>"
    recorder.chat("s", 4, 1, 30.0, [A, B], output=5, text=prompt)
    assert [c.used for c in recorder.calls[:4]] == [True, False, False, True]
    assert recorder.unused("s") and recorder.unused("t")
    recorder.chat("s", 6, 2, 60.0, [A, B, C], output=5, text=prompt + "\n## Goal\n- something else")
    assert not recorder.unused("s")
