"""Re-reads: calls the model made again because a compaction took their output away."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from compaction import NO_REREADS, Checkpoint, Profile, Rereads, count_rereads
from compaction.summary.files import files_of_call
from tests.conftest import assistant, system, tool_group, user

PROFILE = Profile()


def checkpoint(covered: int, replacement: tuple[dict[str, Any], ...] = ()) -> Checkpoint:
    return Checkpoint(
        session="s",
        end_hash="h",
        covered=covered,
        replacement=replacement or ({"role": "user", "content": "[summary]"},),
        stage="summarized",
        reason="threshold",
        tokens_before=100,
        tokens_after=10,
        id="cp",
        created_at=0.0,
    )


def history() -> list[dict[str, Any]]:
    """A head (system + task), a covered span reading a.py and running tests, a kept reply."""
    return [
        system(),
        user("fix the bug"),
        *tool_group("read_file", {"path": "src/a.py"}, "def a(): ..." * 50),
        *tool_group("bash", {"command": "pytest -q"}, "1 failed"),
        assistant("I see the failure."),
        user("go on"),
    ]


COVERED = 4  # the two tool groups after the head (system + task)


def test_a_request_with_no_checkpoint_has_no_rereads() -> None:
    messages = [*history(), *tool_group("read_file", {"path": "src/a.py"}, "again")]
    assert count_rereads(messages, None, PROFILE) == NO_REREADS


def test_a_call_of_the_covered_span_made_again_is_one_reread() -> None:
    messages = [*history(), *tool_group("read_file", {"path": "src/a.py"}, "again")]
    found = count_rereads(messages, checkpoint(COVERED), PROFILE)
    assert found == Rereads(("read_file",))
    assert found.count == 1
    assert found.by_tool() == {"read_file": 1}


def test_the_same_arguments_in_another_key_order_are_the_same_call() -> None:
    messages = history()
    messages[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"a": 1, "b": 2})
    messages[2]["tool_calls"][0]["function"]["name"] = "search"
    messages += tool_group("search", {"b": 2, "a": 1}, "again")
    assert count_rereads(messages, checkpoint(COVERED), PROFILE).tools == ("search",)


def test_a_read_of_a_covered_path_with_other_arguments_is_a_reread() -> None:
    messages = [
        *history(),
        *tool_group("read_file", {"path": "src/a.py", "start_line": 10}, "again"),
    ]
    assert count_rereads(messages, checkpoint(COVERED), PROFILE).tools == ("read_file",)


def test_a_shell_cat_of_a_covered_path_is_a_reread() -> None:
    messages = [*history(), *tool_group("bash", {"command": "cat src/a.py"}, "again")]
    assert count_rereads(messages, checkpoint(COVERED), PROFILE).tools == ("bash",)


def test_a_path_whose_arguments_escape_its_letters_is_the_same_path() -> None:
    messages = history()
    messages[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"path": "src/é.py"})
    messages += tool_group("bash", {"command": "cat src/é.py"}, "again")
    assert "\\u00e9" in messages[2]["tool_calls"][0]["function"]["arguments"]
    assert count_rereads(messages, checkpoint(COVERED), PROFILE).tools == ("bash",)


def test_a_compaction_prepared_ahead_and_applied_now_was_not_seen_by_the_model() -> None:
    messages = [*history(), *tool_group("read_file", {"path": "src/a.py"}, "again")]
    prepared = dataclasses.replace(checkpoint(COVERED), precomputed=True)
    assert count_rereads(messages, prepared, PROFILE) == NO_REREADS


def test_a_call_made_before_but_not_covered_is_no_reread() -> None:
    # Only the first group is covered; the test run's output is still there.
    messages = [*history(), *tool_group("bash", {"command": "pytest -q"}, "1 failed")]
    assert count_rereads(messages, checkpoint(2), PROFILE) == NO_REREADS


def test_a_new_call_of_something_never_removed_is_no_reread() -> None:
    messages = [*history(), *tool_group("read_file", {"path": "src/b.py"}, "other")]
    assert count_rereads(messages, checkpoint(COVERED), PROFILE) == NO_REREADS


def test_a_covered_result_the_replacement_keeps_as_it_was_was_not_removed() -> None:
    # The pruner keeps a short output verbatim: the model still sees it.
    messages = history()
    kept_call, kept_result = messages[4], messages[5]
    replacement = (messages[2], {**messages[3], "content": "[read_file] src/a.py"}, kept_call)
    messages += tool_group("bash", {"command": "pytest -q"}, "1 failed")
    assert count_rereads(messages, checkpoint(COVERED, (*replacement, kept_result)), PROFILE) == (
        NO_REREADS
    )


def test_calls_are_new_only_in_the_request_that_first_carries_their_results() -> None:
    messages = [*history(), *tool_group("read_file", {"path": "src/a.py"}, "again")]
    later = [*messages, assistant("read it"), user("and now?")]
    assert count_rereads(later, checkpoint(COVERED), PROFILE) == NO_REREADS


def test_each_rereading_call_of_a_round_counts() -> None:
    messages = [
        *history(),
        *tool_group("read_file", {"path": "src/a.py"}, "again", "and again"),
    ]
    found = count_rereads(messages, checkpoint(COVERED), PROFILE)
    assert found.tools == ("read_file", "read_file")
    assert found.by_tool() == {"read_file": 2}


def test_the_head_is_found_from_the_profile_when_not_given() -> None:
    messages = [*history(), *tool_group("read_file", {"path": "src/a.py"}, "again")]
    assert count_rereads(messages, checkpoint(COVERED), PROFILE, head=2).count == 1
    # A head said to end later shifts the covered span past the read.
    assert count_rereads(messages, checkpoint(2), PROFILE, head=4) == NO_REREADS


_NAMES = ["read_file", "bash", "grep", "view", "edit_file"]
#: The tools that read the file they name, for the profile (compaction.summary.files).
_READERS = {"read_file", "grep", "view"}


def _call(name: str, path: str) -> dict[str, Any]:
    return {"id": "c", "function": {"name": name, "arguments": json.dumps({"path": path})}}


_names = st.sampled_from(_NAMES)
_paths = st.sampled_from(["a.py", "b.py", "c.py"])
_groups = st.lists(st.tuples(_names, _paths), min_size=1, max_size=8)


@given(_groups, _groups, st.integers(min_value=0, max_value=8))
def test_rereads_are_exactly_the_new_calls_matching_a_covered_call(
    before: list[tuple[str, str]], new: list[tuple[str, str]], covered_groups: int
) -> None:
    covered_groups = min(covered_groups, len(before))
    messages: list[dict[str, Any]] = [system(), user("task")]
    for name, path in before:
        messages += tool_group(name, {"path": path}, "x" * 10)
    messages += [assistant("done"), user("more")]
    last = [
        *tool_group(new[0][0], {"path": new[0][1]}, *["y"] * len(new)),
    ]
    # One assistant message making every new call.
    for call, (name, path) in zip(last[0]["tool_calls"], new, strict=True):
        call["function"] = {"name": name, "arguments": json.dumps({"path": path})}
    messages += last
    stored = checkpoint(2 * covered_groups) if covered_groups else None
    found = count_rereads(messages, stored, PROFILE, head=2)
    removed = set(before[:covered_groups])
    read_paths = {p for n, p in before[:covered_groups] if n in _READERS}
    expected = tuple(
        name
        for name, path in new
        if (name, path) in removed or (name in _READERS and path in read_paths)
    )
    assert found.tools == expected
    assert {n for n in _NAMES if files_of_call(_call(n, "x"), PROFILE).read} == _READERS
    # Nothing but the covered span and the last round matters: no checkpoint, no re-reads.
    assert count_rereads(messages, None, PROFILE, head=2) == NO_REREADS
