"""The summary format (compaction/summary.py): made, recognized, parsed and edited by one module."""

from __future__ import annotations

from collections.abc import Callable

from compaction.chat.own import SUMMARY_MARKER, is_summary, recorded
from compaction.summary.files import FileLists
from compaction.summary.format import (
    parse_summary,
    summary_body,
    summary_count,
    summary_message,
    with_body,
)

FILES = FileLists(read=("src/a.py", "README.md"), modified=("src/b.py",))
BODY = "## Goal\n- Fix the parser.\n\n## Next Steps\n- Run the tests."


def _summary(files: FileLists = FILES, *, turn_prefix: bool = False) -> dict[str, object]:
    return summary_message(BODY, condensed=12, files=files, turn_prefix=turn_prefix)


def test_a_made_summary_is_recognized_and_parses_back_into_its_parts() -> None:
    message = _summary()
    assert is_summary(message)
    parts = parse_summary(message)
    assert parts is not None
    assert parts.body == BODY
    assert parts.files == FILES
    assert parts.heading.startswith("Summary of 12 earlier messages")
    assert summary_count(message) == 12


def test_a_summary_is_taken_apart_in_one_reading_of_its_lines(
    count_block_readings: Callable[[], list[str]],
) -> None:
    # Body, file lists and ledger are three views of one partition of the lines.
    message = _summary()
    readings = count_block_readings()
    parts = parse_summary(message)
    assert parts is not None and parts.body == BODY and parts.files == FILES
    assert len(readings) == 1


def test_the_body_never_holds_the_file_lists() -> None:
    parts = parse_summary(_summary())
    assert parts is not None
    assert "<read-files>" not in parts.body
    assert "<modified-files>" not in parts.body
    assert summary_body(str(_summary()["content"])) == BODY


def test_an_edit_replaces_the_body_and_keeps_marker_heading_and_file_lists() -> None:
    message = recorded({**_summary(), "name": "kept"})
    edited = with_body(message, "## Goal\n- Keep the frobnicator at 42 rpm.")
    parts = parse_summary(edited)
    assert parts is not None
    assert parts.body == "## Goal\n- Keep the frobnicator at 42 rpm."
    assert parts.files == FILES
    assert parts.heading == parse_summary(message).heading  # type: ignore[union-attr]
    text = str(edited["content"])
    assert text.startswith(SUMMARY_MARKER)
    assert text.endswith("</modified-files>")
    assert edited["name"] == "kept"
    assert "Fix the parser" not in text


def test_an_edit_is_what_the_next_compaction_reads_as_the_previous_summary() -> None:
    edited = with_body(_summary(), "## Goal\n- New text.")
    assert summary_body(str(edited["content"])) == "## Goal\n- New text."
    assert summary_count(edited) == 12


def test_a_summary_without_file_lists_gains_none_on_edit() -> None:
    edited = with_body(_summary(FileLists()), "short")
    assert "<read-files>" not in str(edited["content"])
    assert parse_summary(edited) is not None


def test_a_turn_prefix_note_is_a_summary_too() -> None:
    message = _summary(turn_prefix=True)
    assert is_summary(message)
    assert summary_count(message) == 12
    assert parse_summary(with_body(message, "x")).heading.startswith(  # type: ignore[union-attr]
        "Summary of the first 12 messages of the current turn"
    )


def test_other_messages_are_not_summaries() -> None:
    for message in (
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": f"{SUMMARY_MARKER}\nquoted by the model"},
    ):
        assert not is_summary(message)
        assert parse_summary(message) is None
        assert summary_count(message) is None


def test_a_reply_loses_its_hidden_reasoning_and_any_copied_marker_or_file_lists() -> None:
    reply = f"<think>plan</think>{SUMMARY_MARKER}\nSummary of 3 earlier messages.\n{BODY}\n"
    reply += "<read-files>\nx.py\n</read-files>"
    assert summary_body(reply) == BODY
