from __future__ import annotations

import json

from compaction.chat.calls import call_for_result, key_argument, parse_arguments, shows_files
from tests.conftest import assistant, tool_group, user


def test_key_argument_prefers_known_names_then_first_short_string() -> None:
    call = tool_group("x", {"verbose": True, "path": "src/a.py", "command": "ls"})[0]
    assert key_argument(call["tool_calls"][0]) == ("path", "src/a.py")
    other = tool_group("x", {"n": 3, "flavour": "mint"})[0]
    assert key_argument(other["tool_calls"][0]) == ("flavour", "mint")
    broken = {"function": {"name": "x", "arguments": "{not json"}}
    assert key_argument(broken) == ("", "")


def test_call_for_result_finds_the_call_a_result_answers() -> None:
    group = tool_group("read_file", {"path": "a.py"}, "one", "two")
    msgs = [user("go"), *group, assistant("done")]
    assert call_for_result(msgs, 3) is group[0]["tool_calls"][1]
    assert call_for_result(msgs, 2) is group[0]["tool_calls"][0]
    orphan = [user("go"), {"role": "tool", "tool_call_id": "x", "content": "?"}]
    assert call_for_result(orphan, 1) is None


def _call(name: str, **arguments: object) -> dict[str, object]:
    return {"id": "c", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_shows_files_tells_reading_from_running() -> None:
    assert shows_files(_call("bash", command="cat src/a.py"))
    assert shows_files(_call("bash", command="cd /testbed && sed -n '1,20p' a.py"))
    assert shows_files(_call("bash", command="grep -rn foo src/"))
    assert shows_files(_call("read_file", path="a.py"))
    assert not shows_files(_call("bash", command="python repro.py"))
    assert not shows_files(_call("bash", command="sed -i 's/a/b/' a.py"))
    assert not shows_files(_call("search", query="flights"))
    assert not shows_files(None)


def test_arguments_nested_past_the_recursion_are_not_json() -> None:
    assert parse_arguments("[" * 5_000) is None
    assert parse_arguments('{"a": ' * 3_000 + "1" + "}" * 3_000) is None
