from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

from compaction.chat.groups import group_messages
from compaction.chat.own import SUMMARY_MARKER
from compaction.conversation.checkpoints import (
    Checkpoint,
    apply_checkpoint,
    chain_hashes,
    find_checkpoint,
    session_key,
)
from compaction.tokens.counter import LINKS_PER_MESSAGE, TokenCounter, message_keys
from tests.conftest import assistant, system, tool_group, user


def conversation() -> list[dict]:
    return [
        system("sys"),
        user("task"),
        *tool_group("read_file", {"path": "a.py"}, "aaa"),
        assistant("looked"),
        *tool_group("bash", {"command": "pytest"}, "ok", "more"),
        user("next"),
        assistant("done"),
    ]


def summary() -> dict:
    return user(f"{SUMMARY_MARKER}\nsummary")


def test_chain_ignores_the_head_and_unknown_keys_but_not_content() -> None:
    msgs = conversation()
    other_system = [system("a different date"), *msgs[1:]]
    assert chain_hashes(msgs, 1) == chain_hashes(other_system, 1)
    decorated = [*msgs[:3], {**msgs[3], "x_extra": 1}, *msgs[4:]]
    assert chain_hashes(msgs, 2) == chain_hashes(decorated, 2)
    edited = [*msgs[:4], assistant("looked twice"), *msgs[5:]]
    chain, other = chain_hashes(msgs, 2), chain_hashes(edited, 2)
    assert chain[:2] == other[:2] and chain[2:] != other[2:]  # a chain: all later ones differ


def test_session_key_is_the_first_non_system_message() -> None:
    msgs = conversation()
    assert session_key(msgs) == session_key([system("other"), *msgs[1:3]])
    assert session_key(msgs) != session_key([system("sys"), user("another task")])


def test_a_checkpoint_that_would_split_a_group_is_rejected() -> None:
    msgs = conversation()
    # covered=2 ends inside the read_file group (assistant call at 2, result at 3).
    bad = Checkpoint(
        session="s",
        end_hash="x",
        covered=1,
        replacement=(summary(),),
        stage="condensed",
        reason="threshold",
        tokens_before=1,
        tokens_after=1,
        id="c1",
        created_at=0.0,
    )
    assert apply_checkpoint(msgs, 2, bad, group_messages(msgs)) is None


def test_find_requires_the_hash_at_the_recorded_position() -> None:
    msgs = conversation()
    chain = chain_hashes(msgs, 2)
    misplaced = Checkpoint(
        session="s",
        end_hash=chain[3],
        covered=2,
        replacement=(),
        stage="pruned",
        reason="threshold",
        tokens_before=1,
        tokens_after=1,
        id="c1",
        created_at=0.0,
    )
    assert find_checkpoint(chain, {chain[3]: misplaced}) is None


def _chain_of(messages: list[dict], start: int, counter: TokenCounter) -> list[str]:
    """The memoized chain as the proxy takes it: messages counted, then chained."""
    keys = message_keys(messages)
    counter.count_messages(messages, keys)
    return chain_hashes(messages, start, memo=counter, keys=keys)


def test_a_memoized_chain_is_the_chain() -> None:
    msgs = [*conversation(), user("ok"), assistant("ok"), user("ok"), assistant("ok")]
    counter = TokenCounter("gpt-4o")
    plain = chain_hashes(msgs, 2)
    assert _chain_of(msgs, 2, counter) == plain  # cold: every link computed
    assert _chain_of(msgs, 2, counter) == plain  # warm: every link remembered
    assert chain_hashes(msgs, 2, memo=counter) == plain  # keys worked out on the way
    assert chain_hashes(copy.deepcopy(msgs), 2, memo=counter) == plain  # new objects, same text
    edited = [*msgs[:4], assistant("looked twice"), *msgs[5:]]
    assert _chain_of(edited, 2, counter) == chain_hashes(edited, 2) != plain
    assert _chain_of(msgs, 1, counter) == chain_hashes(msgs, 1)  # another head
    assert _chain_of(msgs, 2, counter) == plain


def test_a_memoized_chain_survives_eviction_and_repeats() -> None:
    counter = TokenCounter("gpt-4o", cache_size=3)  # smaller than any conversation here
    repeated = [user("same"), assistant("same")] * (LINKS_PER_MESSAGE + 2)
    for msgs in (conversation(), repeated, [*conversation(), *repeated]):
        for _ in range(2):
            assert _chain_of(msgs, 1, counter) == chain_hashes(msgs, 1)


def test_a_memoized_chain_is_the_chain_when_threads_share_the_memo() -> None:
    conversations = [
        [user(f"task {i % 3}"), *[assistant(f"step {j}") for j in range(i % 5)], user("ok")]
        for i in range(24)
    ]
    expected = [chain_hashes(msgs, 0) for msgs in conversations]
    counter = TokenCounter("gpt-4o", cache_size=8)
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            assert list(pool.map(lambda m: _chain_of(m, 0, counter), conversations)) == expected


def test_a_seeded_chain_shares_no_hash_with_another_seed() -> None:
    msgs = conversation()
    alice, bob = chain_hashes(msgs, 2, seed=b"alice"), chain_hashes(msgs, 2, seed=b"bob")
    assert not set(alice) & set(bob)
    assert chain_hashes(msgs, 2, seed=b"alice") == alice  # and stays the same for one seed
