from __future__ import annotations

from compaction.summary.prompts import SUMMARY_SECTIONS
from compaction.summary.ranked import RankedLines
from compaction.tokens.counter import TokenCounter

COUNTER = TokenCounter("gpt-4o")


def test_every_heading_is_written_and_empty_sections_say_so() -> None:
    lines = RankedLines()
    lines.add("Goal", "fix the bug", 100)
    text = lines.render(1_000, COUNTER)
    assert all(f"## {section}\n" in text for section in SUMMARY_SECTIONS)
    assert "## Goal\n- fix the bug\n" in text
    assert "## Next Steps\n- None recorded" in text


def test_a_line_already_in_its_section_is_skipped() -> None:
    lines = RankedLines()
    lines.add("Goal", "- a", 1)
    lines.add("Goal", "a", 2)
    lines.add("Key Decisions", "a", 3)
    assert [(line.section, line.text) for line in lines.lines] == [
        ("Goal", "- a"),
        ("Key Decisions", "- a"),
    ]


def test_the_lowest_scores_go_first_and_dropped_steps_are_counted() -> None:
    lines = RankedLines()
    for i in range(100):
        lines.add("Done", f"step {i:03d} " + "word " * 10, 60 + i / 100)
    lines.add("Goal", "the task", 100)
    text = lines.render(300, COUNTER)
    assert COUNTER.count_text(text) <= 300
    assert "the task" in text and "step 099" in text and "step 000" not in text
    assert "earlier steps not listed)" in text


def test_a_turn_prefix_leaves_out_goal_and_constraints() -> None:
    text = RankedLines().render(500, COUNTER, turn_prefix=True)
    assert "## Goal" not in text and "## Constraints" not in text and "## Progress" in text


def test_a_line_too_long_for_the_room_left_is_passed_over() -> None:
    lines = RankedLines()
    lines.add("Goal", "the task", 100)
    lines.add("In Progress", "a long step " + "word " * 200, 90)
    lines.add("Blocked", "KeyError: 'x'", 85)
    text = lines.render(150, COUNTER)
    assert COUNTER.count_text(text) <= 150
    assert "the task" in text and "KeyError: 'x'" in text and "a long step" not in text
