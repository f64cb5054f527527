"""evaluation.recall: what a model gets back through compaction_recall, in one small session."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from compaction import Profile, TokenCounter, compact
from compaction.chat.recall import RecallRequest, recalled_text, ref_of
from evaluation.corpus import Body
from evaluation.probes import request_text
from evaluation.recall import (
    AROUND,
    SALT,
    RecallCell,
    draw_output_facts,
    evaluate_recall,
    play,
    proxy_counter,
    recall_json,
    tool_tokens,
)
from proxy.cli.commands import main
from proxy.dialects.chat.recall import RECALL_TOOL

WINDOW = 8_192
MODEL = "gpt-4o"
NEEDLE_LINE = 130
NEEDLE = "    return settle_the_account(ledger_entry_4471, 'needle')  # the line the model needs"
FILE = "\n".join(
    NEEDLE if i == NEEDLE_LINE else f"    value_{i} = compute({i})" for i in range(1, 301)
)


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def session(turns: int = 12) -> dict[str, Any]:
    """A read of app.py, then enough later tool work that the read is pruned to a brief."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the settlement bug in app.py."},
        _call("read", "read_file", {"path": "app.py"}),
        {"role": "tool", "tool_call_id": "read", "content": FILE},
    ]
    for turn in range(turns):
        output = "\n".join(f"log {turn}.{i}: step ok, nothing to report" for i in range(60))
        messages += [
            _call(f"c{turn}", "bash", {"command": f"./check.sh {turn}"}),
            {"role": "tool", "tool_call_id": f"c{turn}", "content": output},
            {"role": "assistant", "content": f"Check {turn} passed."},
        ]
    messages.append({"role": "user", "content": "Now change the settlement line."})
    tool = {"type": "function", "function": {"name": "read_file", "parameters": {}}}
    return {"model": MODEL, "messages": messages, "tools": [tool]}


def profile_for(model: str | None) -> Profile:
    return Profile()


def run(request: dict[str, Any], profile: Any = profile_for) -> RecallCell:
    [cell] = asyncio.run(evaluate_recall([Body("s.json", "chat", request)], (WINDOW,), profile))
    return cell


def test_the_session_prunes_the_read_to_a_brief_carrying_its_ref() -> None:
    # The premise of the figures below: the read is shortened by the pruner, not summarized.
    profile = dataclasses.replace(Profile(), context_window=WINDOW)
    result = asyncio.run(compact(session(), profile, recall_salt=SALT))
    assert result.stage == "pruned"
    text = request_text(result.messages)
    assert NEEDLE.strip() not in text
    assert f"[ref: {ref_of(SALT, FILE)}]" in text


def test_a_line_of_a_pruned_read_is_recovered_through_recall_and_never_without() -> None:
    cell = run(session())

    assert cell.compacted == 1
    assert cell.on.removed["read"] == cell.off.removed["read"] >= 1
    assert cell.on.recovered["read"] == cell.on.removed["read"]  # 100 %
    assert cell.on.calls and max(cell.on.calls) == 1
    # Without recall the briefs carry no ref: the scripted model has nothing to ask for.
    assert cell.off.recovered["read"] == 0
    assert cell.off.ref_seen == 0
    assert cell.off.answer_tokens == []
    shares = recall_json([cell], {})["windows"][0]
    assert shares["on"]["recovered_share"] == 1.0
    assert shares["off"]["recovered_share"] == 0.0


def test_the_read_fact_is_the_longest_line_of_the_files_middle_third() -> None:
    [fact] = [f for f in draw_output_facts(session()["messages"]) if f.kind == "read"]
    assert fact.line == NEEDLE_LINE
    assert fact.needle == " ".join(NEEDLE.split())[:120]
    assert fact.output == FILE


def test_tokens_per_answer_are_the_proxy_counters_count_of_what_the_tool_answered() -> None:
    cell = run(session())
    profile = Profile()
    expected = recalled_text(
        FILE,
        RecallRequest(ref_of(SALT, FILE), NEEDLE_LINE - AROUND, NEEDLE_LINE + AROUND),
        profile.recall_slice_chars,
    )
    counter = proxy_counter(MODEL, profile)
    assert NEEDLE in expected
    assert cell.on.answer_tokens == [counter.count_text(expected)]
    # Counted by the counter the proxy builds for the model, not characters / 4.
    assert counter.count_text(expected) != -(-len(expected) // 4)


def test_the_tools_fixed_cost_is_its_definition_counted_as_the_proxy_counts_it() -> None:
    counter = TokenCounter(MODEL)
    costs = tool_tokens(counter)
    assert set(costs) == {"chat", "anthropic", "responses"}
    assert costs["chat"] == counter.count_text(orjson.dumps(RECALL_TOOL).decode())
    assert all(cost > 50 for cost in costs.values())


def test_a_fact_whose_ref_the_compacted_request_does_not_show_is_not_asked_for() -> None:
    [fact] = [f for f in draw_output_facts(session()["messages"]) if f.kind == "read"]
    messages = session()["messages"]
    profile = Profile()
    episode = play(fact, "a brief without its ref", messages, 10_000, profile, TokenCounter())
    assert (episode.recovered, episode.ref_seen, episode.calls) == (False, False, 0)


def test_a_slice_too_small_for_the_range_is_read_on_over_more_calls() -> None:
    # Lines of about 225 characters fill a 1,200-character slice five at a
    # time: the note names the next start line, and the model calls again.
    [fact] = [f for f in draw_output_facts(session()["messages"]) if f.kind == "read"]
    long_file = "\n".join(
        NEEDLE if i == NEEDLE_LINE else f"    value_{i} = compute({i}) " + "x" * 200
        for i in range(1, 301)
    )
    fact = dataclasses.replace(fact, output=long_file)
    messages = [{"role": "tool", "tool_call_id": "read", "content": long_file}]
    profile = dataclasses.replace(Profile(), recall_slice_chars=1_200, recall_rounds=8)
    text = f"[read_file] app.py [ref: {ref_of(SALT, long_file)}]"
    episode = play(fact, text, messages, 100_000, profile, TokenCounter(MODEL))
    assert episode.recovered
    assert episode.calls == 5  # lines 110–114, 115–119, 120–124, 125–129, then 130–134
    assert len(episode.tokens) == episode.calls


def test_recall_rounds_bound_the_calls_for_one_fact() -> None:
    [fact] = [f for f in draw_output_facts(session()["messages"]) if f.kind == "read"]
    long_file = "\n".join(
        NEEDLE if i == NEEDLE_LINE else f"    value_{i} = compute({i}) " + "x" * 200
        for i in range(1, 301)
    )
    fact = dataclasses.replace(fact, output=long_file)
    messages = [{"role": "tool", "tool_call_id": "read", "content": long_file}]
    profile = dataclasses.replace(Profile(), recall_slice_chars=1_200, recall_rounds=3)
    text = f"[ref: {ref_of(SALT, long_file)}]"
    episode = play(fact, text, messages, 100_000, profile, TokenCounter(MODEL))
    assert (episode.recovered, episode.calls) == (False, 3)


def test_the_eval_command_reports_recall_in_its_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "s.json").write_bytes(orjson.dumps(session()))
    assert main(["eval", str(tmp_path), "--window", str(WINDOW), "--strategy", "summary"]) == 0
    table = capsys.readouterr().out
    assert "Recall (evaluation/recall.py)" in table
    assert f"| {WINDOW:,} | on | 1/1 |" in table
    assert main(["eval", str(tmp_path), "--window", str(WINDOW), "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    [window] = report["recall"]["windows"]
    assert window["on"]["recovered_share"] == 1.0
    assert window["off"]["recovered_share"] == 0.0
    assert report["recall"]["tool_tokens"]["chat"] > 0
