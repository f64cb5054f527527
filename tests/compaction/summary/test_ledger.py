"""The ledger of a span: what it did and said, gathered from its messages and the
earlier summaries folded in, and carried by the summary that replaces it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from compaction import Profile, TokenCounter
from compaction.chat.own import is_summary
from compaction.chat.typed import typed_messages
from compaction.summary.files import FileLists
from compaction.summary.format import parse_summary, summary_message, with_body
from compaction.summary.ledger import (
    Ledger,
    ledger_of,
    parse_ledger,
    render_ledger,
)
from compaction.text.clipping import error_lines
from compaction.types import Message

COUNTER = TokenCounter("gpt-4o")
PROFILE = Profile()
ROOMY = 100_000


def _bash(call_id: str, command: str, output: str, code: int) -> list[dict[str, Any]]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": f"<returncode>{code}</returncode>\n<output>\n{output}\n</output>",
        },
    ]


def _span() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Please keep the public API of parser.py unchanged."},
        *_bash("c1", "python -m pytest -q", "E   AssertionError: assert 1 == 2\n1 failed", 1),
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\nok\n</output>"},
        *_bash("c2", "python -m unittest", "FAILED (failures=3, errors=3, skipped=8)", 1),
        {"role": "user", "content": "/compact keep the errors"},
        *_bash("c3", "pytest", "3 failed, 68 passed, 1 xfailed in 4.74s", 1),
        {"role": "user", "content": "Now fix ABC-123 on branch 'fix/parser'."},
    ]


def test_a_span_ledger_holds_its_errors_commands_identifiers_and_typed_messages() -> None:
    ledger = ledger_of(_span(), PROFILE, task="Fix #42, see https://example.com/issues/42.")
    assert ledger.errors == (
        "E AssertionError: assert 1 == 2",
        "1 failed",
        "FAILED (failures=3, errors=3, skipped=8)",
        "3 failed, 68 passed, 1 xfailed in 4.74s",
    )
    assert ledger.commands == (
        "`python -m pytest -q` → exit 1",
        "`python -m unittest` → exit 1",
        "`pytest` → exit 1",
    )
    assert ledger.user_messages == (
        "Please keep the public API of parser.py unchanged.",
        "Now fix ABC-123 on branch 'fix/parser'.",
    )
    assert ledger.identifiers == (
        "#42",
        "https://example.com/issues/42",
        "ABC-123",
        "branch fix/parser",
    )


def test_test_runner_tallies_with_failures_are_error_lines_and_clean_runs_are_not() -> None:
    text = "3 failed, 68 passed, 1 xfailed in 4.74s\n=== 1 passed, 2 errors in 0.1s ===\n"
    assert error_lines(text + "5 passed in 1.02s\n") == text.splitlines()


def test_a_trailer_saying_there_was_no_error_is_no_error_line() -> None:
    # qwen-code ends every command's result so.
    assert error_lines("Output: ok\nError: (none)\nExit Code: 0\nError: disk full") == [
        "Error: disk full"
    ]


def test_tool_observations_summaries_and_compact_commands_are_not_typed_messages() -> None:
    earlier = summary_message("## Goal\n- g", condensed=2, files=FileLists(), turn_prefix=False)
    messages = [
        earlier,
        {"role": "user", "content": "<returncode>1</returncode><output>x</output>"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]},
        {"role": "user", "content": "/compact focus on the parser"},
        {"role": "user", "content": "Use tabs, not spaces."},
    ]
    assert typed_messages(messages) == ["Use tabs, not spaces."]


def test_a_long_user_message_is_kept_to_its_cap_with_a_marker() -> None:
    long = "word " * 1_000
    ledger = ledger_of([{"role": "user", "content": long}], PROFILE)
    (kept,) = ledger.user_messages
    assert kept.startswith("word word") and "characters cut]" in kept
    assert len(kept) < 2_100


def test_a_rendered_ledger_parses_back_to_itself() -> None:
    ledger = ledger_of(_span(), PROFILE, task="Fix #42.")
    ledger = dataclasses.replace(ledger, files=FileLists(("a.py",), ("b.py",)))
    assert parse_ledger(render_ledger(ledger, ROOMY, COUNTER)) == ledger


def test_a_file_path_that_reads_like_a_ledger_tag_is_a_path_when_parsed_back() -> None:
    # A tool may be handed any path; inside a file list no line opens a block.
    read = {"name": "read_file", "arguments": json.dumps({"path": "<errors>"})}
    span: list[dict[str, Any]] = [
        {"role": "user", "content": "Read it."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "r1", "function": read}]},
        {"role": "tool", "tool_call_id": "r1", "content": "x = 1"},
        *_bash("c1", "pytest", "E   AssertionError: assert 1 == 2", 1),
    ]
    ledger = ledger_of(span, PROFILE)
    assert ledger.files.read == ("<errors>",) and ledger.errors
    assert parse_ledger(render_ledger(ledger, ROOMY, COUNTER)) == ledger


def test_a_fold_keeps_new_entries_over_old_ones() -> None:
    old = Ledger(errors=tuple(f"OldError: {i}" for i in range(20)))
    folded = ledger_of(_span(), PROFILE, old)
    assert folded.errors[:20] == old.errors  # carried over, older than the span's
    errors_only = Ledger(errors=folded.errors)
    kept = parse_ledger(render_ledger(errors_only, 40, COUNTER)).errors
    assert kept and all(not e.startswith("OldError") for e in kept)
    assert kept[-1] == "3 failed, 68 passed, 1 xfailed in 4.74s"


def test_an_earlier_summarys_ledger_is_folded_in_at_its_place() -> None:
    earlier_ledger = Ledger(errors=("KeyError: 'old'",), user_messages=("first request",))
    earlier = summary_message(
        "## Goal\n- g",
        condensed=4,
        ledger=render_ledger(earlier_ledger, ROOMY, COUNTER),
        turn_prefix=False,
    )
    ledger = ledger_of([earlier, *_span()], PROFILE)
    assert ledger.errors[0] == "KeyError: 'old'"
    assert ledger.user_messages[0] == "first request"


def test_each_earlier_summary_is_read_once(
    count_block_readings: Callable[[], list[str]],
) -> None:
    # A session compacted many times carries its summary in every request:
    # its ledger and its file lists are two views of one reading of its lines.
    def summary(n: int) -> Message:
        ledger = Ledger(FileLists((f"r{n}.py",), (f"m{n}.py",)), errors=(f"KeyError: {n}",))
        rendered = render_ledger(ledger, ROOMY, COUNTER)
        return summary_message("## Goal\n- g", condensed=4, ledger=rendered, turn_prefix=False)

    messages = [summary(1), *_span(), summary(2), *_span()]
    readings = count_block_readings()
    ledger = ledger_of(messages, PROFILE)
    assert ledger.files == FileLists(("r1.py", "r2.py"), ("m1.py", "m2.py"))
    assert ledger.errors[0] == "KeyError: 1"
    assert sorted(readings) == sorted(str(m["content"]) for m in messages if is_summary(m))


def test_the_same_span_gives_the_same_bytes() -> None:
    one = render_ledger(ledger_of(_span(), PROFILE), 200, COUNTER)
    two = render_ledger(ledger_of(_span(), PROFILE), 200, COUNTER)
    assert one == two


def test_a_summary_edit_keeps_the_ledger_out_of_the_body_and_byte_for_byte() -> None:
    rendered = render_ledger(ledger_of(_span(), PROFILE), ROOMY, COUNTER)
    message = summary_message("## Goal\n- g", condensed=9, ledger=rendered, turn_prefix=False)
    parts = parse_summary(message)
    assert parts is not None and parts.body == "## Goal\n- g" and parts.ledger == rendered
    edited = parse_summary(with_body(message, "## Goal\n- h"))
    assert edited is not None and edited.body == "## Goal\n- h" and edited.ledger == rendered


def _long_session() -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the parser (#7)."},
    ]
    for i in range(40):
        messages.extend(
            _bash(f"c{i}", f"python check_{i}.py", "checked a line\n" * 40 + f"KeyError: 'k{i}'", 1)
        )
        messages.append({"role": "user", "content": f"Go on with check {i}."})
    return {"model": "gpt-4o", "messages": messages}


def _summary_of(profile: Profile) -> str:
    import asyncio

    from compaction import compact, message_text

    result = asyncio.run(compact(_long_session(), profile, counter=COUNTER))
    assert result.summary is not None
    return message_text(result.summary)


def test_the_summary_carries_the_ledger_within_its_share_of_the_budget() -> None:
    text = _summary_of(Profile(context_window=4_096, tool_result_chars=1_000_000))
    ledger = parse_ledger(text)
    # the newest errors of the summarized span, five at least, none skipped
    newest = int(ledger.errors[-1].split("'k")[1].rstrip("'"))
    assert len(ledger.errors) >= 5
    assert ledger.errors == tuple(
        f"KeyError: 'k{i}'" for i in range(newest - len(ledger.errors) + 1, newest + 1)
    )
    assert ledger.user_messages and ledger.commands
    blocks = text[text.index("<errors>") :]
    # the summary budget is at least 500 tokens; 35 % of it, and the tags
    assert COUNTER.count_text(blocks) <= round(0.35 * 4_000)


def test_a_ledger_share_of_zero_keeps_the_file_lists_only() -> None:
    text = _summary_of(Profile(context_window=4_096, tool_result_chars=1_000_000, ledger_share=0.0))
    assert "<errors>" not in text and "<user-messages>" not in text
