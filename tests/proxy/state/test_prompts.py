"""proxy.state.prompts: each conversation's previous client request, for the
cost without compaction."""

from __future__ import annotations

from proxy.state.prompts import LastPrompts


def _book(max_sessions: int = 10) -> tuple[LastPrompts, list[float]]:
    now = [100.0]
    return LastPrompts(max_sessions=max_sessions, clock=lambda: now[0]), now


def test_a_conversations_first_request_finds_nothing_cached() -> None:
    book, _ = _book()
    assert book.swap("alice", "s1", 5_000, within=300) == 0


def test_the_previous_request_is_cached_within_the_lifetime_and_not_after() -> None:
    book, now = _book()
    book.swap("alice", "s1", 5_000, within=300)
    now[0] += 300
    assert book.swap("alice", "s1", 6_000, within=300) == 5_000
    now[0] += 301
    assert book.swap("alice", "s1", 7_000, within=300) == 0


def test_owners_and_sessions_are_kept_apart() -> None:
    book, _ = _book()
    book.swap("alice", "s1", 5_000, within=300)
    assert book.swap("bob", "s1", 9_000, within=300) == 0
    assert book.swap("alice", "s2", 9_000, within=300) == 0
    assert book.swap("alice", "s1", 6_000, within=300) == 5_000


def test_past_the_bound_the_least_recently_seen_conversation_is_forgotten() -> None:
    book, _ = _book(max_sessions=2)
    book.swap("a", "1", 10, within=300)
    book.swap("a", "2", 20, within=300)
    book.swap("a", "1", 11, within=300)  # seen again: now the newest
    book.swap("a", "3", 30, within=300)
    assert len(book) == 2
    assert book.swap("a", "2", 21, within=300) == 0
    assert book.swap("a", "3", 31, within=300) == 30
