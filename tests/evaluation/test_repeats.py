"""The natural repeat rate: tool calls that repeat an earlier one with no compaction."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from compaction import Profile
from evaluation import Body, Repeats, conversation_repeats, natural_repeats
from proxy.cli.commands import main
from tests.conftest import assistant, system, tool_group, user

PROFILE = Profile()


def _conversation(*rounds: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [system(), user("the task")]
    for name, arguments in rounds:
        messages += tool_group(name, arguments, "output")
    return messages


def test_a_call_repeating_an_earlier_one_or_reading_a_read_file_counts() -> None:
    messages = _conversation(
        ("read_file", {"path": "a.py"}),
        ("bash", {"command": "pytest -q"}),
        ("bash", {"command": "pytest -q"}),  # the same call
        ("bash", {"command": "cat a.py"}),  # a file already read
        ("read_file", {"path": "b.py"}),  # new
    )
    assert conversation_repeats(messages, PROFILE) == (5, ["bash", "bash"])


def test_a_conversation_of_new_calls_repeats_nothing() -> None:
    messages = _conversation(("read_file", {"path": "a.py"}), ("read_file", {"path": "b.py"}))
    messages += [assistant("done"), user("thanks")]
    assert conversation_repeats(messages, PROFILE) == (2, [])


def test_a_call_whose_results_the_request_does_not_hold_is_not_looked_at() -> None:
    messages = _conversation(("read_file", {"path": "a.py"}))
    messages += tool_group("read_file", {"path": "a.py"}, "again")[:1]  # sent before its result
    assert conversation_repeats(messages, PROFILE) == (1, [])


def test_repeats_are_summed_overall_and_per_source_folder() -> None:
    repeated = _conversation(("grep", {"path": "a.py"}), ("grep", {"path": "a.py"}))
    fresh = _conversation(("grep", {"path": "a.py"}))
    bodies = [
        Body("agents/one.json", "chat", {"messages": repeated}),
        Body("agents/two.json", "chat", {"messages": fresh}),
        Body("top.json", "chat", {"messages": [user("no tools")]}),
    ]
    report = natural_repeats(bodies, lambda model: PROFILE)
    assert report.total == Repeats(2, 3, 1, {"grep": 1})
    assert report.by_source == {"agents": report.total}
    assert report.total.rate == pytest.approx(1 / 3)
    assert Repeats().rate is None


def test_the_eval_report_gives_the_natural_repeat_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "agents").mkdir()
    calls = [("bash", {"command": "git diff"})] * 3 + [("bash", {"command": "ls"})]
    body = {"model": "gpt-4o", "messages": _conversation(*calls)}
    (tmp_path / "agents" / "one.json").write_text(json.dumps(body))
    assert main(["eval", str(tmp_path), "--window", "8192", "--strategy", "mask"]) == 0
    table = capsys.readouterr().out
    assert re.search(r"^\| all \| 1 \| 4 \| 2 \| 50\.0 \|$", table, re.MULTILINE)
    assert re.search(r"^\| agents \| 1 \| 4 \| 2 \| 50\.0 \|$", table, re.MULTILINE)
    assert main(["eval", str(tmp_path), "--window", "8192", "--json"]) == 0
    repeats = orjson.loads(capsys.readouterr().out)["repeats"]
    assert (repeats["calls"], repeats["repeats"], repeats["rate"]) == (4, 2, 0.5)
    assert repeats["by_tool"] == {"bash": 2}
    assert repeats["by_source"]["agents"]["repeats"] == 2
