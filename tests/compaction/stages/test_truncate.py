from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction.chat.groups import group_messages, validate_tool_pairing
from compaction.chat.own import SUMMARY_MARKER, recorded
from compaction.errors import CannotFitError
from compaction.stages.truncate import TruncateResult, truncate
from compaction.tokens.counter import TokenCounter
from tests.conftest import assistant, system, tool_group, user

COUNTER = TokenCounter("gpt-4o")
OVERHEAD = 3


def _tokens(messages: list[dict[str, Any]]) -> int:
    return sum(COUNTER.count_messages(messages)) + OVERHEAD


def _truncate(messages: list[dict[str, Any]], limit: int, head_end: int = 2) -> TruncateResult:
    return truncate(messages, head_end=head_end, limit=limit, counter=COUNTER, overhead=OVERHEAD)


def _note(count: int) -> dict[str, Any]:
    return user(f"[{count} earlier messages were removed to fit the context window.]")


def _words(n: int) -> str:
    return " ".join(f"w{i % 97}" for i in range(n))


def _session(steps: int = 12) -> list[dict[str, Any]]:
    messages = [system(), user("Fix the failing test.")]
    for step in range(steps):
        messages.append(assistant(f"step {step}: " + _words(50)))
        messages.extend(tool_group("bash", {"command": f"run {step}"}, _words(200)))
    return messages


def _check(messages: list[dict[str, Any]], result: TruncateResult, limit: int, head: int) -> None:
    assert _tokens(result.messages) <= limit
    assert validate_tool_pairing(result.messages) == []
    assert all(a is b for a, b in zip(result.messages[:head], messages[:head], strict=True))


def test_a_conversation_that_fits_comes_back_unchanged() -> None:
    messages = _session(2)
    result = _truncate(messages, _tokens(messages))
    assert result == TruncateResult(messages, 0, 0, (), suffix=len(messages))
    assert all(a is b for a, b in zip(result.messages, messages, strict=True))


def test_a_head_too_large_for_the_limit_is_an_error() -> None:
    messages = [system(_words(2_000)), user("task"), assistant("ok")]
    head_tokens = _tokens(messages[:2])
    with pytest.raises(CannotFitError) as caught:
        _truncate(messages, head_tokens - 1)
    assert caught.value.part == "head"
    assert caught.value.tokens == head_tokens  # overhead included
    assert caught.value.limit == head_tokens - 1


def test_oldest_groups_are_dropped_and_one_note_takes_their_place() -> None:
    messages = _session(12)
    limit = _tokens(messages) // 2
    result = _truncate(messages, limit)
    _check(messages, result, limit, 2)

    out = result.messages
    assert out[2] == _note(result.dropped)
    kept = len(out) - 3
    assert result.dropped == len(messages) - 2 - kept
    assert all(a is b for a, b in zip(out[3:], messages[-kept:], strict=True))
    assert result.shrunk == 0
    assert result.notes == (f"removed {result.dropped} earlier messages to fit {limit:,} tokens",)


def test_the_kept_suffix_is_as_long_as_the_limit_allows() -> None:
    messages = _session(12)
    limit = _tokens(messages) // 2
    out = _truncate(messages, limit).messages
    kept = len(out) - 3
    # One more group (two messages: call and result, or one assistant message) does not fit.
    one_more = [*out[:3], *messages[-kept - 2 :]]
    assert _tokens(one_more) > limit


def test_a_tool_call_with_three_results_is_kept_or_dropped_whole() -> None:
    messages = [
        system(),
        user("task"),
        *tool_group("read", {"path": "a"}, _words(300), _words(300), _words(300)),
        assistant(_words(100)),
    ]
    group = messages[2:6]
    tight = _tokens([*messages[:2], _note(4), messages[-1]]) + 10
    for limit in range(tight, _tokens(messages), 97):
        out = _truncate(messages, limit).messages
        present = [any(m is g for m in out) for g in group]
        assert all(present) or not any(present)
        assert validate_tool_pairing(out) == []
        assert _tokens(out) <= limit


def test_the_newest_summary_is_kept_right_after_the_head() -> None:
    summary = recorded(user(f"{SUMMARY_MARKER}\n## Goal\nFix the test."))
    messages = [*_session(0), summary, *_session(10)[2:]]
    limit = _tokens(messages) // 2
    result = _truncate(messages, limit)
    _check(messages, result, limit, 2)
    assert result.messages[2] is summary
    assert result.messages[3] == _note(result.dropped)


def test_the_request_being_worked_on_is_kept_when_its_turn_is_cut() -> None:
    request = user("Now please also update the changelog.")
    messages = [*_session(6), request]
    for step in range(8):
        messages.extend(tool_group("bash", {"command": f"edit {step}"}, _words(200)))
    limit = _tokens(messages) // 2
    result = _truncate(messages, limit)
    _check(messages, result, limit, 2)
    out = result.messages
    assert out[2] == _note(result.dropped)
    assert out[3] is request
    suffix = result.suffix
    assert out[-suffix]["role"] == "assistant"
    assert all(a is b for a, b in zip(out[-suffix:], messages[-suffix:], strict=True))
    assert messages[-suffix - 1] is not request  # the opener was not reached by the suffix
    # Between the opener and the verbatim suffix: the next older step, excerpted
    # to the room left instead of dropped unseen.
    excerpt = out[4:-suffix]
    assert [m["role"] for m in excerpt] == ["assistant", "tool"]
    assert "characters cut" in excerpt[1]["content"]
    assert not any(m is o for m in excerpt for o in messages)


def test_a_group_too_large_for_the_room_left_is_excerpted_not_dropped() -> None:
    diff = "\n".join(f"+line {i} of a very long diff output" for i in range(4_000))
    messages = [
        system(),
        user("Review the change."),
        *tool_group("bash", {"command": "git diff"}, diff),
        user("Now summarize the risks."),
    ]
    limit = _tokens([*messages[:2], messages[-1]]) + 600
    result = _truncate(messages, limit)
    out = result.messages
    assert _tokens(out) <= limit and validate_tool_pairing(out) == []
    assert result.dropped == 0 and out[-1] is messages[-1]
    kept = out[3]["content"]
    # Its start and its end, with a marker saying how much was cut.
    assert kept.startswith("+line 0 ") and kept.endswith("+line 3999 of a very long diff output")
    assert re.search(r"\[… [\d,]+ characters cut …\]", kept)


def test_a_removal_note_counts_what_summaries_and_notes_stood_for() -> None:
    old_summary = recorded(
        user(f"{SUMMARY_MARKER}\nSummary of 23 earlier messages, condensed.\n## Goal\nx")
    )
    older_note = _note(7)
    messages = [*_session(0), older_note, old_summary, *_session(12)[2:]]
    newer_summary = recorded(user(f"{SUMMARY_MARKER}\nSummary of 3 earlier messages, condensed."))
    messages.insert(len(messages) - 4, newer_summary)
    limit = _tokens([*messages[:2], *messages[-4:]]) + 120
    result = _truncate(messages, limit)
    note = next(
        m for m in result.messages if m["content"].startswith("[") and "removed" in m["content"]
    )
    dropped = [m for m in messages[2:] if not any(m is o for o in result.messages)]
    expected = sum(7 if m is older_note else 23 if m is old_summary else 1 for m in dropped)
    assert note == _note(expected)


def test_a_note_from_an_earlier_truncation_is_counted_into_the_new_one() -> None:
    messages = [*_session(0), _note(40), *_session(12)[2:]]
    result = _truncate(messages, _tokens(messages) // 2)
    assert result.messages[2] == _note(40 - 1 + result.dropped)


def test_a_head_end_inside_a_group_is_moved_to_the_group_end() -> None:
    messages = [system(), *tool_group("read", {"path": "a"}, _words(100)), *_session(8)[1:]]
    limit = _tokens(messages) // 2
    result = _truncate(messages, limit, head_end=2)
    _check(messages, result, limit, 3)


def test_an_oversize_newest_group_is_cut_until_it_fits() -> None:
    big = "\n".join(f"output line {i}: " + _words(12) for i in range(1_500))
    messages = [
        *_session(3),
        *tool_group("read_file", {"path": "huge.log"}, big, "short result"),
    ]
    limit = _tokens(messages[:2]) + 2_000
    snapshot = copy.deepcopy(messages)
    result = _truncate(messages, limit)
    _check(messages, result, limit, 2)
    assert messages == snapshot

    out = result.messages
    assert out[2] == _note(9)
    assert out[3]["tool_calls"] == messages[-3]["tool_calls"]
    cut = out[4]["content"]
    assert cut.startswith("output line 0: ") and cut.endswith(big[-50:])
    assert "characters cut …]" in cut
    assert out[5] is messages[-1]
    assert result.shrunk == 1 and result.dropped == 9
    assert any("cut 1 messages of the newest group" in note for note in result.notes)


def test_an_oversize_message_alone_is_cut_without_a_note() -> None:
    messages = [system(), user("task"), user(_words(20_000))]
    limit = 3_000
    result = _truncate(messages, limit)
    _check(messages, result, limit, 2)
    assert len(result.messages) == 3 and result.dropped == 0 and result.shrunk == 1


def test_huge_arguments_of_the_newest_call_are_cut_keeping_json_valid() -> None:
    arguments = {"path": "big.txt", "content": _words(30_000)}
    messages = [*_session(2), *tool_group("write_file", arguments, "written")]
    limit = _tokens(messages[:2]) + 1_000
    result = _truncate(messages, limit)
    _check(messages, result, limit, 2)
    shrunk = json.loads(result.messages[-2]["tool_calls"][0]["function"]["arguments"])
    assert shrunk["path"] == "big.txt"
    assert shrunk["content"].startswith("w0 w1 w2")


def test_a_newest_group_too_large_even_when_cut_is_an_error() -> None:
    results = [_words(300)] * 200
    messages = [system(), user("task"), *tool_group("read", {"path": "a"}, *results)]
    limit = _tokens(messages[:2]) + 3_000
    with pytest.raises(CannotFitError) as caught:
        _truncate(messages, limit)
    assert caught.value.part == "newest group"
    assert caught.value.tokens > caught.value.limit == limit


def test_truncate_does_not_mutate_its_input() -> None:
    messages = _session(12)
    snapshot = copy.deepcopy(messages)
    _truncate(messages, _tokens(messages) // 3)
    assert messages == snapshot


# --- properties --------------------------------------------------------------

_texts = st.one_of(
    st.text(max_size=200),
    st.integers(500, 20_000).map(_words),
)


@st.composite
def _conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [system(draw(_texts)), user(draw(_texts))]
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "tool", "tool", "summary"]))
        if kind == "user":
            messages.append(user(draw(_texts)))
        elif kind == "assistant":
            messages.append(assistant(draw(_texts)))
        elif kind == "summary":
            messages.append(recorded(user(f"{SUMMARY_MARKER}\n{draw(_texts)}")))
        else:
            arguments = {"command": draw(_texts)}
            results = draw(st.lists(_texts, min_size=1, max_size=3))
            messages.extend(tool_group("bash", arguments, *results))
    return messages


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=_conversations(), limit=st.integers(200, 40_000), head=st.integers(0, 3))
def test_truncation_always_fits_or_says_why(
    messages: list[dict[str, Any]], limit: int, head: int
) -> None:
    snapshot = copy.deepcopy(messages)
    # A head ending inside a tool group is extended to the group's end.
    head = max([head, *(g.end for g in group_messages(messages) if g.start < head < g.end)])
    try:
        result = _truncate(messages, limit, head_end=head)
    except CannotFitError as exc:
        # The part's own size, against the room the limit leaves for it.
        assert exc.tokens > exc.room and exc.limit == limit
        # The head, with the system messages after it, which are never dropped.
        kept = messages[:head] + [m for m in messages[head:] if m["role"] == "system"]
        if exc.part == "head":
            assert _tokens(kept) > limit
        else:  # what the head (and a note) leave of the limit
            assert exc.room <= limit - _tokens(kept)
        return
    finally:
        assert messages == snapshot
    _check(messages, result, limit, head)
    if not result.shrunk:
        # The newest messages are kept as a run of whole groups.
        out = result.messages
        kept = 0
        while kept < min(len(out), len(messages)) and out[-kept - 1] is messages[-kept - 1]:
            kept += 1
        assert kept >= 1
        starts = {g.start for g in group_messages(messages)}
        assert len(messages) - kept in starts or kept == len(messages)


# --- pinned messages ------------------------------------------------------------


def test_a_system_message_among_the_dropped_is_kept_right_after_the_note() -> None:
    messages = _session(12)
    agents = {"role": "system", "content": "Available agent types: general, explore."}
    messages.insert(4, agents)  # between two old steps, far from the tail
    limit = _tokens(messages) // 3
    result = _truncate(messages, limit)
    _check(messages, result, limit, 2)
    out = result.messages
    assert result.dropped > 0 and out[2]["content"].startswith("[")
    assert out[3] is agents
    assert sum(m is agents for m in out) == 1
    assert f"[{result.dropped} earlier messages" in out[2]["content"]


def test_a_system_message_inside_the_newest_group_is_never_cut() -> None:
    rule = {"role": "system", "content": "Never edit generated files. " * 40}
    group = tool_group("bash", {"command": "cat big.log"}, _words(4_000))
    messages = [system(), user("go"), group[0], rule, group[1]]
    limit = _tokens([*messages[:2], rule]) + 400
    result = _truncate(messages, limit)
    _check(messages, result, limit, 2)
    assert result.shrunk == 1 and result.messages[3] is rule
    assert len(result.messages[4]["content"]) < len(group[1]["content"])


def test_a_system_message_inside_an_excerpted_older_group_is_forwarded_as_sent() -> None:
    rule = {"role": "system", "content": "Run the linter before committing."}
    group = tool_group("bash", {"command": "cat big.log"}, _words(3_000))
    messages = [system(), user("go"), group[0], rule, group[1], user("and now?"), assistant("ok")]
    limit = _tokens([*messages[:2], rule, *messages[5:]]) + 600
    result = _truncate(messages, limit)
    _check(messages, result, limit, 2)
    assert any(note.startswith("excerpted") for note in result.notes)  # not dropped
    assert any(m is rule for m in result.messages), "the client's own object is forwarded"


def test_system_messages_too_large_to_keep_are_the_heads_error() -> None:
    messages = [system(), user("go"), {"role": "system", "content": _words(2_000)}, user("x")]
    with pytest.raises(CannotFitError) as caught:
        _truncate(messages, _tokens(messages[:2]) + 100)
    assert caught.value.part == "head" and "system messages after it" in str(caught.value)


def test_an_excerpt_alone_is_not_reported_as_removing_nothing() -> None:
    big = user("\n".join(f"line {i} of the files in the chat" for i in range(600)))
    messages = [system(), user("Fix the parser."), big, assistant("Ok."), user("Next.")]
    limit = sum(COUNTER.count_messages(messages)) // 2
    result = truncate(messages, head_end=2, limit=limit, counter=COUNTER, overhead=0)
    assert result.dropped == 0
    assert result.notes == ("excerpted 1 older messages to fit",)
