from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

from compaction.checkpoints import (
    Checkpoint,
    apply_checkpoint,
    chain_hashes,
    find_checkpoint,
    kept_suffix,
    make_checkpoint,
    session_key,
)
from compaction.messages import SUMMARY_MARKER, group_messages
from compaction.tokens import LINKS_PER_MESSAGE, TokenCounter, message_keys
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


def test_make_then_find_then_apply_round_trip() -> None:
    msgs = conversation()
    head = 2
    result = [*msgs[:head], summary(), *msgs[-2:]]  # the middle replaced, tail kept
    chain = chain_hashes(msgs, head)
    made = make_checkpoint(
        msgs,
        head,
        result,
        chain=chain,
        session="s",
        stage="condensed",
        reason="threshold",
        tokens_before=100,
        tokens_after=20,
    )
    assert made is not None
    assert made.covered == len(msgs) - head - 2
    assert made.replacement == (result[2],)

    later = [*msgs, assistant("more"), user("again")]
    later_chain = chain_hashes(later, head)
    found = find_checkpoint(later_chain, {made.end_hash: made})
    assert found is made
    applied = apply_checkpoint(later, head, made, group_messages(later))
    assert applied is not None
    assert applied.messages == [*later[:head], result[2], *later[head + made.covered :]]


def test_no_checkpoint_without_a_verbatim_suffix_or_replacement() -> None:
    msgs = conversation()
    chain = chain_hashes(msgs, 2)
    shrunk_tail = [*msgs[:2], summary(), {**msgs[-1], "content": "cut"}]
    assert (
        make_checkpoint(
            msgs,
            2,
            shrunk_tail,
            chain=chain,
            session="s",
            stage="truncated",
            reason="threshold",
            tokens_before=1,
            tokens_after=1,
        )
        is None
    )
    assert (
        make_checkpoint(
            msgs,
            2,
            list(msgs),
            chain=chain,
            session="s",
            stage="none",
            reason="threshold",
            tokens_before=1,
            tokens_after=1,
        )
        is None
    )


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
    )
    assert find_checkpoint(chain, {chain[3]: misplaced}) is None


def test_kept_suffix_counts_identical_objects_only() -> None:
    msgs = conversation()
    assert kept_suffix(msgs, [*msgs[:2], summary(), *msgs[-3:]], 2) == 3
    assert kept_suffix(msgs, [*msgs[:2], dict(msgs[-1])], 2) == 0


def test_a_suffix_starting_inside_a_group_is_cut_back_to_the_group() -> None:
    msgs = [
        system("sys"),
        user("task"),
        assistant("thinking"),
        *tool_group("write_file", {"path": "a.py", "text": "x" * 40_000}, "ok"),
        user("go on"),
    ]
    pruned_call = {
        **msgs[3],
        "tool_calls": [
            {
                **msgs[3]["tool_calls"][0],
                "function": {"name": "write_file", "arguments": '{"path": "a.py", "text": "x…"}'},
            }
        ],
    }
    result = [*msgs[:3], pruned_call, msgs[4], msgs[5]]  # the result and the user kept as-is
    made = make_checkpoint(
        msgs,
        2,
        result,
        chain=chain_hashes(msgs, 2),
        session="s",
        stage="pruned",
        reason="threshold",
        tokens_before=1,
        tokens_after=1,
    )
    assert made is not None
    assert made.covered == 3  # the whole group, not just its call
    applied = apply_checkpoint(msgs, 2, made, group_messages(msgs))
    assert applied is not None and applied.messages == result


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
