"""The names a span mentions: ids, URLs and branches in the user's words, and the
names the agent's turns worked with, those cut by the pruner included."""

from __future__ import annotations

from compaction import Profile
from compaction.summary.ledger import ledger_of
from compaction.summary.names import identifiers_in, names_cut_by_pruning

PROFILE = Profile()


def test_the_agents_names_are_quoted_as_written() -> None:
    turn = {
        "role": "assistant",
        "content": "I'll call os.path.basename in _is_ignored_file, defined in "
        "pylint/lint/__init__.py, and from django.utils.translation.trans_real import "
        "get_language_from_path; see setup.py. Then src/app.py:12 again.",
    }
    names = ledger_of([turn], PROFILE).identifiers
    assert names == (
        "os.path.basename",
        "_is_ignored_file",
        "pylint/lint/__init__.py",
        "django.utils.translation.trans_real",
        "get_language_from_path",
        "setup.py",
        "src/app.py:12",
    )


def test_identifiers_are_issue_and_ticket_ids_urls_and_branches() -> None:
    text = "See #12 and JIRA-7 at https://x.org/a?b=1. `git checkout -b feat/x`, git switch main"
    assert identifiers_in(text) == [
        "#12",
        "JIRA-7",
        "https://x.org/a?b=1",
        "branch feat/x",
        "branch main",
    ]


def test_the_names_of_a_turn_the_pruner_cuts_are_named_by_the_ledger() -> None:
    long = {
        "role": "assistant",
        "content": "Looking at self.assertEqual(response.content) in tests.i18n.sampleproject. "
        + "More reasoning. " * 600,
    }
    short = {"role": "assistant", "content": "Then check parse_window_header."}
    parts = {"role": "assistant", "content": [{"type": "text", "text": long["content"]}]}
    output = {"role": "tool", "tool_call_id": "c1", "content": "x_y_z " * 2_000}
    assert len(long["content"]) > PROFILE.assistant_text_chars
    names = names_cut_by_pruning([long, short, parts, output], PROFILE)
    assert (
        names
        == [
            "self.assertEqual",
            "response.content",
            "tests.i18n.sampleproject",
        ]
        * 2
    )


def test_a_long_turn_keeps_the_names_it_reaches_at_its_end() -> None:
    names = [f"step_{i}_done" for i in range(60)]
    turn = {"role": "assistant", "content": "I checked " + ", ".join(names) + "."}
    assert ledger_of([turn], PROFILE).identifiers == tuple(names)
