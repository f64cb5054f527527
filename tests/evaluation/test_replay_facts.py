"""Next-step facts of the replay (evaluation/replay/facts.py), on hand-made conversations."""

from __future__ import annotations

from typing import Any

from compaction import mark, ref_of
from evaluation.replay.facts import Fact, SessionFacts, candidates, turn_words
from tests.conftest import assistant, system, tool_group, user

SALT = "caller-salt"


def texts(facts: tuple[Fact, ...] | set[Fact]) -> set[str]:
    return {fact.text for fact in facts}


def conversation() -> list[dict[str, Any]]:
    """Head, three old groups, two newest groups, then the turn that uses the old ones."""
    return [
        system("You are a coding agent."),
        user("Fix the failing test in the parser."),
        *tool_group(
            "bash",
            {"command": "grep -rn parse_window_header src/"},
            "src/http/headers.py:42:def parse_window_header(value):\n    return value",
        ),
        *tool_group(
            "bash",
            {"command": "cat src/http/limits.py"},
            "MAX_WINDOW = 2_000_000\nclass WindowLimit:\n    pass",
        ),
        *tool_group("bash", {"command": "pytest -q"}, "E   AssertionError: 'expected 8192'"),
        assistant("The header is returned as a string."),
        *tool_group("bash", {"command": "ls src"}, "http\nutil"),
        *tool_group("bash", {"command": "git status"}, "nothing to commit"),
        # The next turn (the cut point): uses facts from the three old groups.
        *tool_group(
            "bash",
            {"command": "sed -n 40,50p src/http/headers.py && grep -n WindowLimit src/"},
            "ok",
        ),
    ]


def cut(messages: list[dict[str, Any]]) -> int:
    return max(i for i, m in enumerate(messages) if m["role"] == "assistant")


def test_candidates_are_identifiers_paths_quoted_strings_and_line_numbers() -> None:
    found = candidates(
        'Open src/app.py at line 120, then `sed -n 40,52p setup.cfg`; grep "def main" '
        "for parse_window_header, WindowLimit and os.path.join; see foo.py:77. The end."
    )
    assert {
        "src/app.py",
        "setup.cfg",
        "def main",
        "parse_window_header",
        "WindowLimit",
        "os.path.join",
        "foo.py",
        "120",
        "40",
        "52",
        "77",
    } <= texts(found)
    # Plain words and short names are not facts.
    assert not {"Open", "then", "grep", "The", "end", "see"} & texts(found)


def test_tool_call_arguments_are_read_as_values_not_as_json() -> None:
    message = tool_group("bash", {"command": "cat src/a.py"})[0]
    words = turn_words(message)
    assert "cat src/a.py" in words
    assert "command" not in texts(candidates(words))


def test_facts_are_what_the_next_turns_use_of_the_compactable_past() -> None:
    messages = conversation()
    facts = SessionFacts(messages, head=2)
    # The lines asked for (40, 50) and "src/" appear nowhere in the past, or only
    # in the newest two groups ("ls src"): not facts.
    assert texts(facts.at(cut(messages))) == {"src/http/headers.py", "WindowLimit"}


def test_a_fact_also_in_the_head_or_in_the_newest_groups_does_not_count() -> None:
    messages = conversation()
    messages[1] = user("Fix the failing test; WindowLimit is involved.")
    facts = SessionFacts(messages, head=2)
    assert "WindowLimit" not in texts(facts.at(cut(messages)))


def test_kept_counts_the_facts_present_in_what_was_sent() -> None:
    messages = conversation()
    k = cut(messages)
    facts = SessionFacts(messages, head=2)
    total = len(facts.at(k))
    assert total > 0
    everything = facts.score(k, messages[:k])
    assert (everything.total, everything.kept, everything.reachable) == (total, total, 0)
    head_and_tail = messages[:2] + messages[k - 4 : k]
    nothing = facts.score(k, head_and_tail)
    assert (nothing.kept, nothing.reachable) == (0, 0)


def test_a_fact_behind_a_sent_ref_is_reachable_not_kept() -> None:
    messages = conversation()
    k = cut(messages)
    facts = SessionFacts(messages, head=2)
    original = messages[5]  # the output of cat src/http/limits.py
    brief = {**original, "content": mark("[bash] cat → 3 lines", ref_of(SALT, original["content"]))}
    sent = [*messages[:5], brief, *messages[6:k]]
    score = facts.score(k, sent, facts.refs(SALT))
    assert "WindowLimit" in texts(facts.at(k))
    assert score.kept < score.total
    assert score.reachable >= 1
    # Without the caller's refs (another salt), nothing is reachable.
    assert facts.score(k, sent, facts.refs("another-caller")).reachable == 0


def test_a_line_number_must_stand_as_a_whole_number() -> None:
    number = Fact("42", number=True)
    assert number.found_in("headers.py:42:def")
    assert not number.found_in("line 421")
