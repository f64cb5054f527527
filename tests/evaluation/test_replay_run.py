"""The replay end to end (evaluation/replay/run.py): two real sessions through a real
``compaction-proxy serve`` in front of the loopback upstream, at a window small
enough that the proxy must compact."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from compaction import load_encoding
from compaction.budget.pricing import PRESETS
from evaluation.replay.baselines import input_limit
from evaluation.replay.cache import SegmentTokens
from evaluation.replay.report import compacted, markdown, rows
from evaluation.replay.run import Options, Run, replay
from evaluation.replay.sessions import load_sessions
from proxy.cli import main

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
SESSIONS = ("mini-swe-agent/astropy__astropy-7336.json", "mini-swe-agent/django__django-14559.json")
WINDOW = 8_192

pytestmark = pytest.mark.corpus


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Run]:
    if not FIXTURES.is_dir():
        pytest.skip(f"the real conversations are not here: {FIXTURES} is absent")
    sessions = load_sessions(FIXTURES, patterns=SESSIONS)
    assert [s.name for s in sessions] == sorted(SESSIONS)
    encoding = load_encoding("o200k_base")
    assert encoding is not None
    options = Options(
        windows=(WINDOW,),
        prices=("anthropic",),
        workdir=tmp_path_factory.mktemp("replay"),
    )
    return asyncio.run(replay(sessions, options, SegmentTokens(encoding)))


def by_name(runs: list[Run], strategy: str) -> Run:
    return next(run for run in runs if run.strategy == strategy)


def test_every_strategy_ran_every_turn_of_both_sessions(runs: list[Run]) -> None:
    turns = sum(len(s.cuts) for s in load_sessions(FIXTURES, patterns=SESSIONS))
    names = [run.strategy for run in runs]
    assert names == [
        "unlimited",
        "truncation",
        "masking",
        "claude-code",
        "proxy (extractive)",
        "proxy (llm)",
        "proxy (llm-always)",
    ]
    for run in runs:
        chats = [c for c in run.calls if c.kind == "chat"]
        assert len({(c.session, c.turn) for c in chats}) == turns, run.strategy
        assert run.failures == () and run.refused == 0, run.strategy


def test_the_proxy_compacts_and_forwards_every_prompt_under_the_input_limit(
    runs: list[Run],
) -> None:
    for strategy in ("proxy (extractive)", "proxy (llm)", "proxy (llm-always)"):
        chats = [c for c in by_name(runs, strategy).calls if c.kind == "chat"]
        assert any(compacted(c) for c in chats)
        assert max(c.tokens for c in chats) <= input_limit(WINDOW)
    unlimited = [c for c in by_name(runs, "unlimited").calls if c.kind == "chat"]
    assert max(c.tokens for c in unlimited) > input_limit(WINDOW)


def test_the_llm_summarizer_is_asked_and_billed_to_the_session(runs: list[Run]) -> None:
    summaries = [c for c in by_name(runs, "proxy (llm-always)").calls if c.kind == "summary"]
    assert summaries
    assert {c.session for c in summaries} <= set(SESSIONS)
    assert all(c.output > 0 for c in summaries)
    # The proxy puts the model's reply in the prompt as written: the upstream finds it.
    assert any(c.used for c in summaries)
    assert all(c.summary_kind in ("main", "turn-prefix") for c in summaries)
    assert not [c for c in by_name(runs, "proxy (extractive)").calls if c.kind == "summary"]


def test_costs_are_positive_and_the_requests_add_up_to_the_total(runs: list[Run]) -> None:
    table = rows(runs, ["anthropic"])
    unlimited = next(r for r in table if r.strategy == "unlimited")
    assert unlimited.relative_cost == pytest.approx(1.0)
    for row, run in zip(table, runs, strict=True):
        assert row.cost > 0
        assert row.cost == pytest.approx(sum(c.cost(PRESETS["anthropic"]) for c in run.calls))
        assert row.relative_cost == pytest.approx(row.cost / unlimited.cost)
        for call in run.calls:
            assert 0 <= call.cached <= call.tokens and call.written == call.tokens - call.cached
    proxy = next(r for r in table if r.strategy == "proxy (extractive)")
    assert proxy.facts > 0 and proxy.facts_kept is not None
    assert proxy.facts_reachable is not None and proxy.facts_reachable >= proxy.facts_kept
    assert "| 8,192 | anthropic | proxy (llm) |" in markdown(table)


def test_the_command_line_reports_the_same_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    if not FIXTURES.is_dir():
        pytest.skip(f"the real conversations are not here: {FIXTURES} is absent")
    output = tmp_path / "replay.md"
    argv = ["eval", "--replay", "--fixtures", str(FIXTURES), "--window", "8192"]
    argv += ["--prices", "openai", "--summarizer", "extractive", "--baseline", "truncation"]
    argv += ["--session", SESSIONS[0], "--synthetic", "0", "--quiet", "--output", str(output)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| 8,192 | openai | unlimited | 1.000 |" in printed
    assert "| 8,192 | openai | proxy (extractive) |" in printed
    assert output.read_text().strip() == printed.strip()
