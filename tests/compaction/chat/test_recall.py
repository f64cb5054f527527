"""Recall: refs in briefs and ledger entries, the tool's arguments and answers."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction import CannotFitError, Profile, TokenCounter, compact, is_summary, message_text
from compaction.chat.own import own
from compaction.chat.recall import (
    MAX_ARGUMENT_CHARS,
    RECALL_TOOL_NAME,
    RECALL_TOOL_PARAMETERS,
    REF_PATTERN,
    RecallRequest,
    find_original,
    mark,
    parse_request,
    recalled_text,
    ref_of,
    trailing_ref,
)
from compaction.stages.pruner import prune
from compaction.stages.strategies import mask, shrink_middle
from compaction.summary.files import REFS_PER_FILE, parse_file_lists, render_file_lists
from compaction.summary.format import parse_summary, summary_message
from compaction.summary.ledger import ledger_of, parse_ledger, render_ledger
from compaction.summary.steps import tool_steps
from tests.conftest import assistant, system, tool_group, user
from tests.synthetic import conversations, tool_call

COUNTER = TokenCounter("gpt-4o")
PROFILE = Profile()
SALT = "owner-1"
LOG = "\n".join(f"line {i}: collected item {i}" for i in range(1, 301))


def _session(*outputs: str, name: str = "bash") -> list[dict[str, Any]]:
    messages = [system(), user("fix the tests")]
    for k, output in enumerate(outputs):
        messages.extend(tool_group(name, {"command": f"pytest -q -k case{k}"}, output))
    return messages


def _refs(messages: list[dict[str, Any]]) -> list[str]:
    return [ref for m in messages for ref in REF_PATTERN.findall(message_text(m))]


# --- refs --------------------------------------------------------------------


def test_a_ref_is_stable_for_the_same_salt_and_text_and_differs_across_salts_and_texts() -> None:
    ref = ref_of(SALT, LOG)
    assert ref == ref_of(SALT, LOG)
    assert ref != ref_of("owner-2", LOG)
    assert ref != ref_of(SALT, LOG + "\n")
    assert REF_PATTERN.fullmatch(f"[ref: {ref}]")


def test_salts_longer_than_a_blake2b_key_still_tell_owners_apart() -> None:
    long_a, long_b = "a" * 100 + "1", "a" * 100 + "2"
    assert ref_of(long_a, LOG) != ref_of(long_b, LOG)


def test_a_marked_text_ends_with_a_ref_the_pattern_finds() -> None:
    ref = ref_of(SALT, LOG)
    marked = mark("[bash] brief", ref)
    assert marked == f"[bash] brief [ref: {ref}]"
    assert REF_PATTERN.search(marked).group(1) == ref  # type: ignore[union-attr]
    assert trailing_ref(marked) == ref
    assert trailing_ref(marked + " and more") is None


# --- the tool's arguments ----------------------------------------------------


def test_the_tool_takes_a_ref_and_an_optional_line_range_and_nothing_else() -> None:
    assert RECALL_TOOL_NAME == "compaction_recall"
    assert RECALL_TOOL_PARAMETERS["required"] == ["ref"]
    assert set(RECALL_TOOL_PARAMETERS["properties"]) == {"ref", "start_line", "end_line"}
    assert RECALL_TOOL_PARAMETERS["additionalProperties"] is False
    assert json.loads(json.dumps(RECALL_TOOL_PARAMETERS)) == RECALL_TOOL_PARAMETERS


def test_a_request_is_read_with_or_without_its_lines_and_with_the_marker_copied_whole() -> None:
    ref = ref_of(SALT, LOG)
    assert parse_request(json.dumps({"ref": ref})) == RecallRequest(ref, None, None)
    assert parse_request(json.dumps({"ref": ref, "start_line": 3, "end_line": 9})) == (
        RecallRequest(ref, 3, 9)
    )
    assert parse_request(json.dumps({"ref": f"[ref: {ref}]", "start_line": 5})) == (
        RecallRequest(ref, 5, None)
    )


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ("", "ref must be"),
        ("{}", "ref must be"),
        ('{"ref": 12}', "ref must be"),
        ('{"ref": "../etc/passwd"}', "ref must be"),
        ('{"ref": "rabcdefghijkl", "start_line": "3"}', "start_line must be a whole number"),
        ('{"ref": "rabcdefghijkl", "start_line": 2.5}', "start_line must be a whole number"),
        ('{"ref": "rabcdefghijkl", "end_line": true}', "end_line must be a whole number"),
        ('{"ref": "rabcdefghijkl", "start_line": 0}', "start_line must be at least 1"),
        ('{"ref": "rabcdefghijkl", "start_line": 9, "end_line": 3}', "is before start_line"),
        ('{"ref": "rabcdefghijkl", "lines": "1-5"}', "Unknown argument lines"),
    ],
)
def test_bad_arguments_get_a_short_message_for_the_model(arguments: str, said: str) -> None:
    answer = parse_request(arguments)
    assert isinstance(answer, str)
    assert said in answer
    assert RECALL_TOOL_NAME in answer  # says how the tool is called
    assert len(answer) < 300


def test_arguments_over_the_limit_are_refused_before_they_are_parsed() -> None:
    padded = json.dumps({"ref": "rabcdefghijkl", "note": "x" * MAX_ARGUMENT_CHARS})
    answer = parse_request(padded)
    assert isinstance(answer, str)
    assert "too long" in answer


# --- the tool's answers ------------------------------------------------------


def test_the_whole_original_comes_back_with_a_note_of_its_lines() -> None:
    text = "alpha\nbeta\ngamma\n"
    answer = recalled_text(text, RecallRequest("rabcdefghijkl"), 1_000)
    assert answer == "alpha\nbeta\ngamma\n[lines 1–3 of 3]"


def test_a_line_range_returns_exactly_those_lines_inclusive() -> None:
    answer = recalled_text(LOG, RecallRequest("rabcdefghijkl", 10, 12), 10_000)
    assert answer.split("\n")[:3] == [
        "line 10: collected item 10",
        "line 11: collected item 11",
        "line 12: collected item 12",
    ]
    assert answer.endswith("[lines 10–12 of 300]")


def test_a_slice_stops_at_a_line_boundary_within_max_chars_and_says_where_to_go_on() -> None:
    answer = recalled_text(LOG, RecallRequest("rabcdefghijkl"), 500)
    body, note = answer.rsplit("\n", 1)
    assert len(body) + 1 <= 500  # the lines and their endings
    last = body.split("\n")[-1]
    shown = len(body.split("\n"))
    assert last == f"line {shown}: collected item {shown}"  # a whole line
    assert note == f"[lines 1–{shown} of 300; call again with start_line={shown + 1} for more]"
    again = recalled_text(LOG, RecallRequest("rabcdefghijkl", shown + 1), 500)
    assert again.startswith(f"line {shown + 1}: ")


def test_a_line_longer_than_the_slice_comes_back_cut_and_said_so() -> None:
    text = "short\n" + "y" * 5_000 + "\nafter\n"
    answer = recalled_text(text, RecallRequest("rabcdefghijkl", 2), 1_000)
    assert answer.startswith("y" * 1_000 + "\n")
    assert "[line 2 of 3: its first 1,000 of 5,000 characters" in answer
    assert "start_line=3" in answer


def test_a_start_past_the_end_and_an_empty_output_are_said_so() -> None:
    assert "past the end" in recalled_text("a\nb", RecallRequest("rabcdefghijkl", 5), 1_000)
    assert "empty" in recalled_text("", RecallRequest("rabcdefghijkl"), 1_000)


def test_not_found_is_the_same_answer_whatever_the_reason() -> None:
    messages = _session(LOG)
    other_owner = ref_of("owner-2", LOG)
    gone = ref_of(SALT, "an output no longer sent")
    answers = [
        recalled_text(find_original(messages, SALT, ref), RecallRequest(ref), 1_000)
        for ref in (other_owner, gone)
    ]
    assert answers[0].replace(other_owner, "R") == answers[1].replace(gone, "R")
    assert answers[0].startswith(f"No content found for ref {other_owner}")


# --- briefs ------------------------------------------------------------------


def test_a_brief_carries_the_ref_of_the_original_and_stays_within_the_limit() -> None:
    for limit in (60, 120, 500):
        profile = Profile(tool_result_chars=limit)
        messages = _session(LOG + "\nE   AssertionError: " + "z" * 300)
        pruned = prune(messages, 2, len(messages), profile, salt=SALT).messages
        brief = pruned[-1]["content"]
        assert len(brief) <= limit
        assert trailing_ref(brief) == ref_of(SALT, message_text(messages[-1]))


def test_a_limit_too_small_for_a_ref_gives_a_brief_within_it_and_no_ref() -> None:
    profile = Profile(tool_result_chars=30)
    messages = _session(LOG)
    brief = prune(messages, 2, len(messages), profile, salt=SALT).messages[-1]["content"]
    assert len(brief) <= 30
    assert "[ref:" not in brief


def test_pruning_twice_with_refs_is_pruning_once() -> None:
    messages = _session(LOG, "x" * 2_000, "ok")
    once = prune(messages, 2, len(messages), PROFILE, salt=SALT).messages
    twice = prune(once, 2, len(once), PROFILE, salt=SALT)
    assert twice.messages == once
    assert twice.pruned == 0
    assert len(_refs(once)) == 2  # the short result is not briefed, so has no ref


def test_a_brief_briefed_again_under_a_smaller_limit_keeps_the_ref_of_the_original() -> None:
    messages = _session(LOG)
    stored = mark("[bash] an earlier, longer brief " + "w" * 300, ref_of(SALT, LOG))
    messages[-1] = own({**messages[-1], "content": stored})  # the proxy's, from a checkpoint
    again = prune(messages, 2, len(messages), Profile(tool_result_chars=100), salt=SALT)
    assert again.pruned == 1
    assert len(again.messages[-1]["content"]) <= 100
    assert trailing_ref(again.messages[-1]["content"]) == ref_of(SALT, LOG)


def test_without_a_salt_or_with_recall_off_briefs_are_as_they_were() -> None:
    messages = _session(LOG, "x" * 2_000)
    plain = prune(messages, 2, len(messages), PROFILE).messages
    assert prune(messages, 2, len(messages), PROFILE, salt="").messages == plain
    off = dataclasses.replace(PROFILE, recall=False)
    assert prune(messages, 2, len(messages), off, salt=SALT).messages == plain
    assert not _refs(plain)


def test_a_ref_from_a_brief_finds_its_original_in_the_resent_conversation_only() -> None:
    messages = _session(LOG, "other output " * 100)
    pruned = prune(messages, 2, len(messages), PROFILE, salt=SALT).messages
    first = REF_PATTERN.search(pruned[3]["content"]).group(1)  # type: ignore[union-attr]
    assert find_original(messages, SALT, first) == LOG
    assert find_original(messages, "owner-2", first) is None
    assert find_original(pruned, SALT, first) is None  # the brief is not the original
    assert find_original(messages, SALT, "not a ref") is None


def test_the_steps_read_from_a_brief_are_the_same_with_its_ref() -> None:
    messages = _session("<returncode>1</returncode>\n" + LOG + "\nE   AssertionError: boom")
    plain = prune(messages, 2, len(messages), PROFILE).messages
    marked = prune(messages, 2, len(messages), PROFILE, salt=SALT).messages
    assert tool_steps(marked) == tool_steps(plain)
    assert tool_steps(marked)[0].outcome == "exit 1, error: `E AssertionError: boom`"


def test_a_masked_output_is_hidden_behind_a_placeholder_that_carries_its_ref() -> None:
    messages = _session(LOG, "x" * 2_000)
    masked = mask(messages, 2, len(messages), salt=SALT).messages
    assert [trailing_ref(m["content"]) for m in masked if m["role"] == "tool"] == [
        ref_of(SALT, LOG),
        ref_of(SALT, "x" * 2_000),
    ]
    assert mask(masked, 2, len(masked), salt=SALT).changed == 0
    plain = mask(messages, 2, len(messages)).messages
    mask_profile = Profile(strategy="mask")
    assert shrink_middle(messages, 2, len(messages), mask_profile, salt=SALT).messages == masked
    off = dataclasses.replace(mask_profile, recall=False)
    assert shrink_middle(messages, 2, len(messages), off, salt=SALT).messages == plain
    assert not _refs(plain)


# --- the ledger --------------------------------------------------------------


def test_ledger_commands_carry_refs_that_find_their_output() -> None:
    messages = _session("<returncode>1</returncode>\n" + LOG, "<returncode>0</returncode>\nok")
    ledger = ledger_of(messages, PROFILE, salt=SALT)
    assert len(ledger.commands) == 2
    long_output, short_output = ledger.commands
    ref = trailing_ref(long_output)
    assert ref is not None
    assert find_original(messages, SALT, ref) == "<returncode>1</returncode>\n" + LOG
    assert long_output.startswith("`pytest -q -k case0` → exit 1 [ref: ")
    # An output the pruner would not have briefed is gone with the summary too:
    # it has its ref as well.
    short_ref = trailing_ref(short_output)
    assert short_ref is not None
    assert find_original(messages, SALT, short_ref) == "<returncode>0</returncode>\nok"
    assert not any("[ref:" in entry for entry in ledger_of(messages, PROFILE).commands)


def test_a_command_cut_short_in_the_ledger_names_the_agents_message_by_its_ref() -> None:
    script = "python3 - <<'EOF'\n" + "".join(
        f"def helper_{i}(value, *, limit={i}):\n    return value[:limit]\n" for i in range(60)
    )
    call = tool_call("c0", "bash", {"command": script})
    messages = [
        system("You are an agent."),
        user("Fix it."),
        {"role": "assistant", "content": "Writing the helpers.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "<returncode>0</returncode>"},
    ]
    (entry,) = ledger_of(messages, PROFILE, salt=SALT).commands
    refs = REF_PATTERN.findall(entry)
    assert len(refs) == 2  # the agent's message, then the output
    whole = find_original(messages, SALT, refs[0])
    assert whole is not None and "def helper_59(value, *, limit=59)" in whole
    assert "helper_59" not in entry  # cut in the ledger, whole by its ref


def test_the_agents_text_cut_by_the_pruner_ends_with_the_ref_of_the_whole_message() -> None:
    long_text = "Thinking it through. " + " ".join(f"step_{i}" for i in range(1_500))
    messages = [system("s"), user("task"), assistant(long_text), user("go on")]
    once = prune(messages, 2, 3, PROFILE, salt=SALT).messages
    cut = message_text(once[2])
    ref = trailing_ref(cut)
    assert ref is not None and len(cut) < len(long_text)
    assert find_original(messages, SALT, ref) == long_text
    # Pruning again changes nothing; with no salt there is no ref.
    assert prune(once, 2, 3, PROFILE, salt=SALT).messages[2] is once[2]
    assert trailing_ref(message_text(prune(messages, 2, 3, PROFILE).messages[2])) is None


def test_ledger_refs_survive_rendering_parsing_and_a_fold() -> None:
    messages = _session(LOG)
    ledger = ledger_of(messages, PROFILE, salt=SALT)
    rendered = render_ledger(ledger, 100_000, COUNTER)
    assert parse_ledger(rendered).commands == ledger.commands
    folded = parse_ledger(rendered).merge(ledger)
    assert folded.commands == ledger.commands  # the same entry once, its ref kept
    assert trailing_ref(folded.commands[-1]) == ref_of(SALT, LOG)
    assert render_ledger(folded, 100_000, COUNTER).count("[ref: ") == 1


def test_a_command_whose_result_is_already_a_brief_names_the_original_by_its_ref() -> None:
    messages = _session(LOG)
    pruned = prune(messages, 2, len(messages), PROFILE, salt=SALT).messages
    entry = ledger_of(pruned, PROFILE, salt=SALT).commands[-1]
    assert trailing_ref(entry) == ref_of(SALT, LOG)


def _read(path: str, output: str) -> list[dict[str, Any]]:
    return tool_group("read_file", {"path": path}, output)


def test_files_read_carry_the_refs_of_their_newest_reads_each_part_its_own() -> None:
    first, second = "v1\n" * 300, "v2\n" * 300
    messages = [
        system(),
        user("task"),
        *_read("src/a.py", first),
        *_read("src/b.py", "b\n" * 300),
        *_read("src/a.py", second),
    ]
    files = ledger_of(messages, PROFILE, salt=SALT).files
    assert files.read == ("src/a.py", "src/b.py")  # paths stay paths
    a_refs = [ref for path, ref in files.refs if path == "src/a.py"]
    assert a_refs == [ref_of(SALT, first), ref_of(SALT, second)]  # both parts, oldest first
    rendered = render_file_lists(files)
    line = f"src/a.py [ref: {ref_of(SALT, first)}] [ref: {ref_of(SALT, second)}]"
    assert line in rendered.splitlines()
    for ref in REF_PATTERN.findall(rendered):
        assert find_original(messages, SALT, ref) is not None
    assert parse_file_lists(rendered) == files
    assert not ledger_of(messages, PROFILE).files.refs


def test_a_file_read_many_times_keeps_only_its_newest_refs() -> None:
    reads = [f"part {n}\n" * 400 for n in range(REFS_PER_FILE + 2)]
    messages = [system(), user("task")]
    for text in reads:
        messages += _read("src/a.py", text)
    files = ledger_of(messages, PROFILE, salt=SALT).files
    kept = [ref for _, ref in files.refs]
    assert kept == [ref_of(SALT, text) for text in reads[-REFS_PER_FILE:]]


def test_a_file_read_then_modified_is_listed_as_modified_without_a_ref() -> None:
    messages = [
        system(),
        user("task"),
        *_read("src/a.py", "v1\n" * 300),
        *tool_group("edit_file", {"path": "src/a.py"}, "File edited."),
    ]
    files = ledger_of(messages, PROFILE, salt=SALT).files
    assert (files.read, files.modified, files.refs) == ((), ("src/a.py",), ())
    assert "[ref:" not in render_file_lists(files)


def test_a_summarys_file_refs_survive_a_fold_into_the_next_summary() -> None:
    messages = [system(), user("task"), *_read("src/a.py", "v1\n" * 300)]
    ledger = render_ledger(ledger_of(messages, PROFILE, salt=SALT), 1_000, COUNTER)
    earlier = summary_message("Read a.", condensed=1, ledger=ledger, turn_prefix=False)
    later = [earlier, *_read("src/b.py", "b\n" * 300)]
    files = ledger_of(later, PROFILE, salt=SALT).files
    assert files.read == ("src/a.py", "src/b.py")
    assert dict(files.refs) == {
        "src/a.py": ref_of(SALT, "v1\n" * 300),
        "src/b.py": ref_of(SALT, "b\n" * 300),
    }
    assert parse_summary(earlier).files.read == ("src/a.py",)


def test_a_summary_ledger_made_with_a_salt_names_outputs_the_request_still_holds() -> None:
    outputs = [
        f"<returncode>{k % 2}</returncode>\n" + LOG.replace("item", f"i{k}") for k in range(16)
    ]
    messages = [*_session(*outputs), user("now the docs"), {"role": "assistant", "content": "ok"}]
    profile = Profile(context_window=4_096, summarizer="extractive", keep_recent_tokens=200)
    request = {"model": "gpt-4o", "messages": messages}
    result = asyncio.run(
        compact(request, profile, reason="manual", counter=COUNTER, recall_salt=SALT)
    )
    summaries = [m for m in result.messages if is_summary(m)]
    assert summaries
    refs = _refs(summaries)
    assert refs
    assert all(find_original(messages, SALT, ref) is not None for ref in refs)
    off = asyncio.run(
        compact(
            request,
            dataclasses.replace(profile, recall=False),
            reason="manual",
            counter=COUNTER,
            recall_salt=SALT,
        )
    )
    assert not _refs(off.messages)


# --- every ref resolves -------------------------------------------------------

_brief_profiles = st.builds(
    Profile,
    context_window=st.sampled_from([2_048, 4_096, 8_192, 16_000]),
    head_count=st.integers(0, 3),
    keep_recent_tokens=st.sampled_from([200, 500, 2_000]),
    summarizer=st.sampled_from(["extractive", "off"]),
    tool_result_chars=st.sampled_from([40, 100, 500]),
    strategy=st.sampled_from(["summary", "summary", "mask", "hybrid"]),
    threshold=st.one_of(st.none(), st.sampled_from([1_000, 3_000])),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=conversations(),
    profile=_brief_profiles,
    salt=st.text(min_size=1, max_size=80),
    reason=st.sampled_from(["threshold", "overflow", "manual"]),
)
def test_every_ref_in_a_compacted_request_resolves_against_the_request_sent(
    messages: list[dict[str, Any]], profile: Profile, salt: str, reason: str
) -> None:
    snapshot = copy.deepcopy(messages)
    request = {"model": "gpt-4o", "messages": messages}
    try:
        result = asyncio.run(
            compact(request, profile, reason=reason, counter=COUNTER, recall_salt=salt)  # type: ignore[arg-type]
        )
    except CannotFitError:  # nothing is sent, nothing to resolve
        return
    assert messages == snapshot
    for ref in _refs(result.messages):
        assert find_original(messages, salt, ref) is not None, ref


def test_a_call_nested_past_the_recursion_is_told_it_is_not_json() -> None:
    told = parse_request("[" * 1_500)  # under the length bound
    assert isinstance(told, str) and "not valid JSON" in told
