from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction.budget.profile import Profile
from compaction.chat.groups import validate_tool_pairing
from compaction.stages.pruner import PruneResult, prune, tool_brief
from compaction.text.cuts import shrink_arguments
from tests.conftest import assistant, system, tool_group, user

#: Arguments cut at 200 characters, so that the tests below reach the cut.
PROFILE = Profile(tool_args_chars=200)


def _json_len(message: dict[str, Any]) -> int:
    return len(json.dumps(message, ensure_ascii=False))


def _brief(name: str, arguments: dict[str, Any], output: str) -> str:
    call, result = tool_group(name, arguments, output)
    return str(tool_brief(call["tool_calls"][0], result))


def _pruned_result(name: str, arguments: dict[str, Any], output: str) -> dict[str, Any]:
    messages = [system(), user("task"), *tool_group(name, arguments, output)]
    return prune(messages, 2, len(messages), PROFILE).messages[-1]


# --- briefs ------------------------------------------------------------------


def test_brief_for_a_file_read_names_tool_path_and_size() -> None:
    assert _brief("read_file", {"path": "src/app.py"}, "x" * 45_210) == (
        "[read_file] src/app.py (45,210 chars)"
    )


def test_brief_for_a_search_quotes_the_query() -> None:
    assert _brief("search", {"query": "token limit"}, "y" * 12_400) == (
        '[search] "token limit" (12,400 chars)'
    )


def test_brief_for_a_command_counts_output_lines_and_reports_the_return_code() -> None:
    body = "\n".join(f"line {i}" for i in range(32))
    output = f"<returncode>1</returncode>\n<output>\n{body}\n</output>"
    assert _brief("execute", {"command": "npm test"}, output) == (
        '[execute] "npm test" → 32 lines output (exit code 1)'
    )


@pytest.mark.parametrize(
    ("output", "status"),
    [
        ("out\n" * 200 + "Process finished with exit code 2", "exit code 2"),
        ("Exit status: 1\n" + "out\n" * 200, "exit code 1"),
        ("out\n" * 200 + "error: could not compile `app`", "error: could not compile `app`"),
        ("out\n" * 200 + "fatal: not a git repository", "fatal: not a git repository"),
    ],
)
def test_brief_reports_a_visible_status(output: str, status: str) -> None:
    assert _brief("bash", {"command": "make"}, output).endswith(f"({status})")


def test_brief_reports_the_exception_that_ended_a_traceback() -> None:
    output = (
        "collecting\n" * 100
        + "Traceback (most recent call last):\n"
        + '  File "app.py", line 3, in <module>\n    main()\n'
        + "ValueError: bad input\n"
    )
    assert _brief("bash", {"command": "python app.py"}, output) == (
        '[bash] "python app.py" → 104 lines output (ValueError: bad input)'
    )


def test_brief_ignores_status_words_inside_a_file_being_read() -> None:
    source = "    x = 1\n" * 50 + "    if proc.returncode == 0:\n" + "    y = 2\n" * 50
    assert _brief("read_file", {"path": "run.py"}, source) == (
        f"[read_file] run.py ({len(source):,} chars)"
    )


def test_brief_shortens_a_long_command_to_one_line() -> None:
    command = "for f in $(ls); do\n  echo $f\ndone && " + "grep -rn pattern src/ && " * 20
    brief = _brief("bash", {"command": command}, "z\n" * 600)
    shown = brief.split('"')[1]
    assert "\n" not in brief
    assert len(shown) <= 80 and shown.endswith("…")
    assert shown.startswith("for f in $(ls); do echo $f done")


def test_brief_names_an_argument_without_a_telling_name() -> None:
    assert _brief("get_order", {"order_id": "A1"}, "o" * 900) == (
        '[get_order] order_id="A1" (900 chars)'
    )


def test_brief_gives_the_gist_of_the_other_short_arguments() -> None:
    arguments = {"command": "view", "path": "src/a.py", "view_range": [1, 40], "n": 3}
    assert _brief("str_replace_editor", arguments, "o" * 900) == (
        "[str_replace_editor] src/a.py command=view n=3 (900 chars)"
    )
    many = {"user_id": "mia_li_3668", **{f"field{i}": f"value{i}" for i in range(20)}}
    brief = _brief("book_reservation", many, "o" * 900)
    assert brief.startswith('[book_reservation] user_id="mia_li_3668" field0=value0 field1=value1')
    assert "field19" not in brief  # the gist stays short
    long_text = {"path": "a.py", "new_str": "x" * 200}
    assert _brief("edit", long_text, "o" * 900) == "[edit] a.py (900 chars)"


def test_brief_keeps_the_first_error_line_whole_and_the_last_one_too() -> None:
    first = "AssertionError: " + " ".join(f"item{i}" for i in range(25))  # ~190 chars
    output = "\n".join(
        [
            "<returncode>1</returncode>",
            "<output>",
            "Traceback (most recent call last):",
            '  File "t.py", line 3, in test',
            first,
            "",
            "FAILED (failures=1)",
            "</output>",
        ]
    )
    brief = _brief("bash", {"command": "python -m unittest t"}, output + "\n" * 300)
    assert "\n" not in brief
    assert brief.endswith(f"(exit code 1, {first}; last: FAILED (failures=1))")
    # Within a threshold the first line is cut between words and the last left out.
    short = tool_brief(
        {
            "id": "c",
            "function": {"name": "bash", "arguments": '{"command": "python -m unittest t"}'},
        },
        {"role": "tool", "content": output},
        limit=160,
    )
    assert len(short) <= 160 + 60 and "last:" not in short
    kept = short.split("exit code 1, ")[1].removesuffix(")")
    assert kept.endswith("…") and kept[:-1].split()[-1] in first.split()


def test_brief_takes_the_first_error_line_without_a_traceback() -> None:
    output = "building\nsrc/a.c:3:5: error: unknown type name 'foo'\n"
    brief = _brief("bash", {"command": "make"}, output * 30)
    assert brief.endswith("(src/a.c:3:5: error: unknown type name 'foo')")  # the same: no "last"
    output = "fatal: not a git repository\nerror: pathspec 'x' did not match\n" + "." * 600
    assert "(fatal: not a git repository; last: error: pathspec 'x' did not match)" in _brief(
        "bash", {"command": "git checkout x"}, output
    )


def test_brief_without_a_call_uses_the_result_name() -> None:
    result = {"role": "function", "name": "lookup", "content": "r" * 700}
    assert tool_brief(None, result) == "[lookup] (700 chars)"
    assert tool_brief(None, {"role": "tool", "content": "r" * 700}) == "[tool] (700 chars)"


def test_brief_counts_images_of_a_result_given_as_parts() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    result = {"role": "tool", "content": [{"type": "text", "text": "s" * 600}, image, image]}
    call = {"id": "c", "function": {"name": "screenshot", "arguments": "{}"}}
    assert tool_brief(call, result) == "[screenshot] (600 chars, 2 images)"


def test_brief_stays_short_whatever_the_input() -> None:
    call = {"id": "c", "function": {"name": "n" * 500, "arguments": json.dumps({"k" * 300: "v"})}}
    result = {"role": "tool", "content": "Traceback (most recent call last)\nE" + "r" * 5_000}
    assert len(tool_brief(call, result)) < 400


# --- tool results ------------------------------------------------------------


def test_long_result_is_replaced_by_its_brief_and_keeps_its_other_keys() -> None:
    messages = [system(), user("task"), *tool_group("read_file", {"path": "a.py"}, "c" * 900)]
    messages[-1]["name"] = "read_file"
    messages[-1]["x_vendor"] = {"keep": True}
    result = prune(messages, 2, len(messages), PROFILE)
    pruned = result.messages[-1]
    assert pruned == {**messages[-1], "content": "[read_file] a.py (900 chars)"}
    assert result.pruned == 1


def test_short_result_is_left_alone() -> None:
    messages = [*tool_group("read_file", {"path": "a.py"}, "c" * 500)]
    result = prune(messages, 0, len(messages), PROFILE)
    assert result.pruned == 0
    assert all(a is b for a, b in zip(result.messages, messages, strict=True))


def test_result_given_as_parts_becomes_a_brief_string() -> None:
    call, result = tool_group("read_file", {"path": "a.py"})
    result["content"] = [{"type": "text", "text": "p" * 300}, {"type": "text", "text": "q" * 300}]
    pruned = prune([call, result], 0, 2, PROFILE).messages[1]
    assert pruned["content"] == "[read_file] a.py (601 chars)"


def test_legacy_function_result_is_briefed_from_its_function_call() -> None:
    messages = [
        user("task"),
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "fetch", "arguments": '{"url": "https://x.org"}'},
        },
        {"role": "function", "name": "fetch", "content": "<html>" * 200},
    ]
    pruned = prune(messages, 0, 3, PROFILE).messages[2]
    assert pruned == {
        "role": "function",
        "name": "fetch",
        "content": "[fetch] https://x.org (1,200 chars)",
    }
    assert validate_tool_pairing(prune(messages, 0, 3, PROFILE).messages) == []


def test_a_brief_with_an_error_is_within_the_threshold_and_idempotent() -> None:
    error = "ValueError: " + "long words here " * 40
    output = f"<returncode>1</returncode>\n<output>\n{error}\n" + "x\n" * 400 + "</output>"
    messages = [system(), user("task"), *tool_group("bash", {"command": "python run.py"}, output)]
    once = prune(messages, 2, len(messages), PROFILE).messages
    brief = once[-1]["content"]
    assert len(brief) <= PROFILE.tool_result_chars
    assert "ValueError: long words here" in brief and "\n" not in brief
    assert prune(once, 2, len(once), PROFILE).messages == once


def test_tiny_result_limit_still_gives_an_idempotent_brief() -> None:
    profile = Profile(tool_result_chars=10)
    messages = tool_group("read_file", {"path": "src/deep/module.py"}, "c" * 50)
    once = prune(messages, 0, 2, profile)
    assert len(once.messages[1]["content"]) <= 10
    assert prune(once.messages, 0, 2, profile).pruned == 0


# --- tool-call arguments -----------------------------------------------------


def test_long_arguments_are_cut_inside_the_json() -> None:
    arguments = {"path": "src/app.py", "content": "line\n" * 400, "mode": {"append": True}}
    messages = tool_group("write_file", arguments, "ok")
    call = prune(messages, 0, 2, PROFILE).messages[0]["tool_calls"][0]
    shrunk = call["function"]["arguments"]
    parsed = json.loads(shrunk)
    assert len(shrunk) <= PROFILE.tool_args_chars
    assert parsed["path"] == "src/app.py" and parsed["mode"] == {"append": True}
    assert parsed["content"].startswith("line\nline\n")
    assert parsed["content"].endswith("chars cut]")
    assert call["id"] == messages[0]["tool_calls"][0]["id"]


def test_short_arguments_are_left_alone() -> None:
    messages = tool_group("read_file", {"path": "a.py"}, "ok")
    assert prune(messages, 0, 2, PROFILE).messages[0] is messages[0]


def test_legacy_function_call_arguments_are_cut() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "write", "arguments": json.dumps({"text": "t" * 1_000})},
    }
    pruned = prune([message], 0, 1, PROFILE).messages[0]
    assert len(pruned["function_call"]["arguments"]) <= PROFILE.tool_args_chars
    assert json.loads(pruned["function_call"]["arguments"])["text"].startswith("ttt")


# --- assistant text ----------------------------------------------------------


def test_long_assistant_text_keeps_its_start_and_end() -> None:
    text = "S" * 800 + "M" * 12_345 + "E" * 400
    pruned = prune([assistant(text)], 0, 1, PROFILE).messages[0]["content"]
    assert pruned == "S" * 800 + "\n[… 12,345 characters cut …]\n" + "E" * 400


def test_assistant_text_parts_are_cut_one_by_one_and_images_kept() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://x/img.png"}}
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": "a" * 9_000}, image, {"type": "text", "text": "b"}],
    }
    parts = prune([message], 0, 1, PROFILE).messages[0]["content"]
    assert len(parts[0]["text"]) < 1_300
    assert parts[1] is image and parts[2] is message["content"][2]


def test_an_agents_reasoning_of_a_few_thousand_characters_is_kept_whole() -> None:
    """A coding agent's turn (a THOUGHT and its command) names the functions and
    line numbers its next turns use, in the middle as often as at the ends: on
    the replay benchmark cutting it past 2,000 characters lost those facts."""
    thought = "THOUGHT: " + "the formset calls _construct_form at line 412. " * 120
    assert 5_000 < len(thought) < Profile().assistant_text_chars
    messages = [assistant(thought)]
    assert prune(messages, 0, 1, Profile()).messages[0] is messages[0]


def test_user_text_is_never_cut() -> None:
    messages = [user("u" * 10_000)]
    assert prune(messages, 0, 1, PROFILE).messages[0] is messages[0]


# --- the contract ------------------------------------------------------------


def _session() -> list[dict[str, Any]]:
    return [
        system(),
        user("Fix the bug " * 300),
        *tool_group("read_file", {"path": "a.py"}, "x" * 5_000),
        assistant("thinking " * 1_000),
        *tool_group("bash", {"command": "pytest " + "-k t " * 100}, "o\n" * 800, "p" * 700, "q"),
        user("and the docs"),
        *tool_group("read_file", {"path": "b.py"}, "y" * 5_000),
        assistant("done " * 600),
    ]


def test_only_the_given_range_changes() -> None:
    messages = _session()
    result = prune(messages, 2, 9, PROFILE)
    assert all(result.messages[i] is messages[i] for i in (0, 1, 9, 10, 11, 12))
    assert result.pruned == 5  # read, thinking, bash args, two bash results
    assert result.messages[11]["content"] == "y" * 5_000


def test_prune_does_not_mutate_its_input() -> None:
    messages = _session()
    snapshot = copy.deepcopy(messages)
    prune(messages, 0, len(messages), PROFILE)
    assert messages == snapshot


def test_prune_is_idempotent_never_grows_and_keeps_pairing() -> None:
    messages = _session()
    once = prune(messages, 0, len(messages), PROFILE)
    twice = prune(once.messages, 0, len(messages), PROFILE)
    assert twice == PruneResult(once.messages, 0)
    assert all(a is b for a, b in zip(twice.messages, once.messages, strict=True))
    assert validate_tool_pairing(once.messages) == []
    for before, after in zip(messages, once.messages, strict=True):
        assert _json_len(after) <= _json_len(before)


def test_out_of_range_bounds_are_clamped() -> None:
    messages = _session()
    assert prune(messages, -5, 100, PROFILE).pruned == prune(messages, 0, 13, PROFILE).pruned
    assert prune(messages, 8, 3, PROFILE).pruned == 0


# --- properties --------------------------------------------------------------

_texts = st.one_of(
    st.text(max_size=300),
    st.integers(400, 6_000).map(lambda n: ('word ü "q" \\ line\n' * (n // 18 + 1))[:n]),
)
_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        _texts,
        st.integers(),
        st.booleans(),
        st.none(),
        st.floats(allow_nan=False, allow_infinity=False),
    ),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)


@st.composite
def _conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [system(), user(draw(_texts))]
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["user", "assistant", "tool"]))
        if kind == "user":
            messages.append(user(draw(_texts)))
        elif kind == "assistant":
            messages.append(assistant(draw(_texts)))
        else:
            name = draw(st.sampled_from(["bash", "read_file", "search", "other"]))
            arguments = draw(st.dictionaries(st.sampled_from(["command", "path", "x"]), _values))
            results = draw(st.lists(_texts, min_size=1, max_size=3))
            messages.extend(tool_group(name, arguments, *results))
    return messages


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=_conversations(), data=st.data())
def test_pruning_invariants(messages: list[dict[str, Any]], data: Any) -> None:
    start = data.draw(st.integers(0, len(messages)))
    end = data.draw(st.integers(start, len(messages)))
    snapshot = copy.deepcopy(messages)

    once = prune(messages, start, end, PROFILE)
    assert messages == snapshot
    twice = prune(once.messages, start, end, PROFILE)
    assert twice.messages == once.messages and twice.pruned == 0
    assert validate_tool_pairing(once.messages) == []
    for i, (before, after) in enumerate(zip(messages, once.messages, strict=True)):
        if not start <= i < end:
            assert after is before
        assert _json_len(after) <= _json_len(before)
        for call in after.get("tool_calls") or ():
            arguments = call["function"]["arguments"]
            json.loads(arguments)  # valid JSON in, valid JSON out


@settings(max_examples=100, deadline=None)
@given(value=_values, limit=st.integers(1, 400))
def test_shrunk_arguments_stay_valid_json_and_are_stable(value: Any, limit: int) -> None:
    arguments = json.dumps(value)
    shrunk = shrink_arguments(arguments, limit)
    json.loads(shrunk)
    assert len(shrunk) <= len(arguments)
    assert shrink_arguments(shrunk, limit) == shrunk


def test_a_brief_keeps_the_parts_it_cannot_stand_for_after_it() -> None:
    reference = {"type": "tool_reference", "tool_name": "fetch"}
    call, result = tool_group("tool_search", {"query": "fetch"}, "")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    text = {"type": "text", "text": "schema line\n" * 2_000}
    result = {**result, "content": [text, image, reference]}
    messages = [system(), user("task"), call, result]
    pruned = prune(messages, 2, 4, PROFILE).messages[-1]
    brief, *rest = pruned["content"]
    assert brief["type"] == "text" and brief["text"].startswith("[tool_search]")
    assert "1 image" in brief["text"]
    assert rest == [reference] and rest[0] is reference
    again = prune([*messages[:3], pruned], 2, 4, PROFILE).messages[-1]
    assert again is pruned
