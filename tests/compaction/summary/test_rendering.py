"""The ledger as text: rendered under a budget, newest first, and parsed back to
the same record; blocks pasted into a summary's prose are not the ledger."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction import TokenCounter
from compaction.summary.blocks import block_lines
from compaction.summary.files import FileLists
from compaction.summary.format import summary_message
from compaction.summary.rendering import Ledger, parse_ledger, render_ledger, strip_ledger

COUNTER = TokenCounter("gpt-4o")
ROOMY = 100_000


_line = (
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs", "Zl", "Zp", "Cc")),
        min_size=1,
        max_size=40,
    )
    .map(lambda s: " ".join(s.split()))
    .filter(bool)
)
_message = (
    st.lists(
        st.text(
            alphabet=st.characters(blacklist_categories=("Cs", "Cc")) | st.just("\n"), max_size=60
        ),
        min_size=1,
        max_size=4,
    )
    .map(lambda parts: "\n".join(p.strip() for p in parts).strip())
    .filter(bool)
)
_entries = st.lists(_line, max_size=8, unique=True).map(tuple)


def test_the_newest_entries_survive_a_tight_budget() -> None:
    errors = tuple(f"ValueError: failure number {i}" for i in range(40))
    ledger = Ledger(errors=errors)
    text = render_ledger(ledger, 60, COUNTER)
    kept = parse_ledger(text).errors
    assert 0 < len(kept) < len(errors)
    assert kept == errors[-len(kept) :]
    assert COUNTER.count_text(text) <= 60


def test_the_users_newest_message_claims_the_budget_first() -> None:
    ledger = Ledger(
        errors=tuple(f"ValueError: e{i}" for i in range(30)),
        user_messages=("an older request", "the newest request of all"),
    )
    text = render_ledger(ledger, 30, COUNTER)
    assert parse_ledger(text).user_messages == ("the newest request of all",)


def test_each_block_gets_its_newest_entries_before_any_block_gets_older_ones() -> None:
    ledger = Ledger(
        errors=tuple(f"ValueError: e{i}" for i in range(30)),
        user_messages=tuple(f"request number {i}" for i in range(30)),
    )
    kept = parse_ledger(render_ledger(ledger, 80, COUNTER))
    assert kept.errors[-1] == "ValueError: e29"
    assert kept.user_messages[-1] == "request number 29"


def test_a_repeated_entry_keeps_its_newest_place() -> None:
    old = Ledger(errors=("SyntaxError: invalid syntax", "KeyError: 'x'"))
    later = Ledger(errors=("SyntaxError: invalid syntax",))
    assert old.merge(later).errors == ("KeyError: 'x'", "SyntaxError: invalid syntax")


def test_ledger_blocks_pasted_into_a_body_are_not_read_back_as_the_ledger() -> None:
    message = summary_message(
        "## Goal\n- g\n<errors>\nFakeError: pasted\n</errors>",
        condensed=2,
        ledger="",
        turn_prefix=False,
    )
    assert parse_ledger(message["content"]) == Ledger()
    assert strip_ledger("a\n<errors>\nX\n</errors>\nb") == "a\nb"


@pytest.mark.parametrize(
    ("body", "prose"),
    [
        # Joined, the text either side of the block would be an opener.
        (
            "## Goal\n- g <err<read-files>a.py</read-files>ors>\nFakeError: pasted\n</errors>",
            "## Goal\n- g <err\nors>\nFakeError: pasted\n</errors>",
        ),
        # Kept on its line, the text after the block is one, and goes with its block.
        (
            "## Goal\n- g <read-files>a.py</read-files><errors>\nFakeError: pasted\n</errors>",
            "## Goal\n- g",
        ),
        (
            "## Goal\n- g <read-files>\na.py\n</read-files>\n<errors>\nFakeError\n</errors>\nh",
            "## Goal\n- g \nh",
        ),
    ],
)
def test_a_file_block_within_a_line_of_the_body_leaves_no_ledger_block_behind(
    body: str, prose: str
) -> None:
    assert strip_ledger(body) == prose
    ledger = Ledger(FileLists(("b.py",)), errors=("KeyError: 'real'",))
    rendered = render_ledger(ledger, ROOMY, COUNTER)
    message = summary_message(body, condensed=2, ledger=rendered, turn_prefix=False)
    assert parse_ledger(message["content"]) == ledger


_PIECES = [
    "x", " ", "\n", "<", "ors>", "<err", "<errors>", "</errors>", "<user-messages>",
    "<user-message>", "</user-message>", "</user-messages>", "<read-files>", "</read-files>",
    "<modified-files>", "</modified-files>",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join))
def test_the_prose_left_holds_no_block(text: str) -> None:
    prose = strip_ledger(text)
    assert all(block is None for block, _, _ in block_lines(prose))
    assert strip_ledger(prose) == prose


@settings(max_examples=60, deadline=None)
@given(_entries, _entries, _entries, st.lists(_message, max_size=5, unique=True).map(tuple))
def test_any_ledger_round_trips_through_its_rendering(
    errors: tuple[str, ...],
    commands: tuple[str, ...],
    identifiers: tuple[str, ...],
    users: tuple[str, ...],
) -> None:
    ledger = Ledger(FileLists(), errors, commands, identifiers, users)
    assert parse_ledger(render_ledger(ledger, ROOMY, COUNTER)) == ledger


@settings(max_examples=60, deadline=None)
@given(_entries, st.lists(_message, max_size=5, unique=True).map(tuple), st.integers(0, 120))
def test_a_rendered_ledger_holds_its_budget_and_only_the_newest_of_each_block(
    errors: tuple[str, ...], users: tuple[str, ...], budget: int
) -> None:
    ledger = Ledger(errors=errors, user_messages=users)
    text = render_ledger(ledger, budget, COUNTER)
    assert COUNTER.count_text(text) <= budget
    kept = parse_ledger(text)
    assert kept.errors == errors[len(errors) - len(kept.errors) :]
    assert kept.user_messages == users[len(users) - len(kept.user_messages) :]
