"""evaluation.run and ``compaction-proxy eval``: the engine's compaction, scored, and a judge."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from compaction import Profile
from evaluation import read_bodies, report_json, report_table
from evaluation.run import evaluate
from proxy.cli.commands import main
from tests.conftest import SUMMARY_REPLY, RecordingSummarizer
from tests.proxy.servers import serve_in_thread
from tests.synthetic import agent_session

FIXED = "## Goal\nFix the failing test.\n## Next Steps\n- run pytest"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for seed in range(3):
        body = {"model": "gpt-4o", "messages": agent_session(seed=seed, steps=50)}
        (tmp_path / f"chat{seed}.json").write_bytes(orjson.dumps(body))
    anthropic = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": "You are a coding agent.",
        "messages": [
            {"role": "user", "content": "Fix it."},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}],
            },
        ],
    }
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "anthropic.json").write_bytes(orjson.dumps(anthropic))
    (tmp_path / "tools.json").write_bytes(b"[]")  # not a request body: skipped
    return tmp_path


def test_bodies_of_every_api_are_read_and_lists_skipped(folder: Path) -> None:
    bodies = list(read_bodies(folder))
    assert [(b.name, b.api) for b in bodies] == [
        ("chat0.json", "chat"),
        ("chat1.json", "chat"),
        ("chat2.json", "chat"),
        ("sub/anthropic.json", "anthropic"),
    ]
    assert bodies[-1].request["messages"][0]["role"] == "system"


def test_each_strategy_is_scored_and_only_summaries_cost_summarizer_tokens(folder: Path) -> None:
    summarizer = RecordingSummarizer(FIXED)
    cells = asyncio.run(
        evaluate(
            read_bodies(folder),
            (8_192,),
            ("summary", "mask", "hybrid"),
            lambda model: Profile(summarizer="llm", summary_must_pay=False),
            summarizer,
        )
    )
    by = {cell.strategy: cell for cell in cells}
    assert all(cell.bodies == 4 and cell.compacted == 3 for cell in cells)
    assert by["mask"].summarizer_calls == 0 and by["mask"].summarizer_tokens == 0
    assert set(by["mask"].stages) <= {"masked", "truncated"}
    assert by["summary"].summarizer_calls >= 3 and by["summary"].summarizer_tokens > 0
    assert summarizer.calls == by["summary"].summarizer_calls + by["hybrid"].summarizer_calls
    for cell in cells:
        assert all(
            cell.presence[kind].total > 0 for kind in ("recall", "artifacts", "continuation")
        )
        assert cell.tokens_after < cell.tokens_before
        assert cell.tokens_after <= 3 * 8_192


def test_the_facts_are_scored_and_summaries_and_ledgers_counted(folder: Path) -> None:
    ledger = "<ledger>\nerrors:\n- ValueError: bad value\n</ledger>"
    cells = {
        reply: asyncio.run(
            evaluate(
                read_bodies(folder),
                (8_192,),
                ("summary", "mask"),
                lambda model: Profile(summarizer="llm", summary_must_pay=False),
                RecordingSummarizer(reply),
            )
        )
        for reply in (SUMMARY_REPLY, f"{SUMMARY_REPLY}\n\n{ledger}")
    }
    prose = {cell.strategy: cell for cell in cells[SUMMARY_REPLY]}
    for cell in prose.values():
        assert cell.facts["path"].total > 0 and cell.facts["typed"].total > 0
    assert prose["summary"].summary_tokens > 0 and prose["mask"].summary_tokens == 0
    # A model that writes prose only keeps no path a summary does not list:
    # the summary's file lists are what keeps them.
    assert prose["summary"].facts["path"].score == 1.0
    # Whatever ledger the engine appends, a ledger block in the summary is
    # counted, in every compacted body that has one, and only there.
    with_ledger = {cell.strategy: cell for cell in cells[f"{SUMMARY_REPLY}\n\n{ledger}"]}
    assert with_ledger["summary"].ledgers == 3 and with_ledger["mask"].ledgers == 0
    assert with_ledger["summary"].ledger_tokens > prose["summary"].ledger_tokens
    assert with_ledger["summary"].ledger_tokens < with_ledger["summary"].summary_tokens
    report = {cell["strategy"]: cell for cell in report_json(cells[SUMMARY_REPLY])["cells"]}
    assert report["mask"]["ledger_tokens_mean"] is None and report["mask"]["ledgers"] == 0
    assert set(report["summary"]["facts"]) == {"path", "error", "typed"}
    table = report_table(cells[f"{SUMMARY_REPLY}\n\n{ledger}"])
    assert re.search(
        r"^\| summary \| 8,192 \| 3/4 \| 100.0 of \d+ \|.* \| \d+ \(3\) \|$", table, re.M
    )
    assert re.search(r"^\| mask \| 8,192 \|.*\| pending \(no ledger block\) \|$", table, re.M)


def test_the_command_prints_a_table_and_json(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(folder), "--window", "8192", "--strategy", "mask"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("| strategy | window | compacted | recall |")
    assert re.search(r"^\| mask \| 8,192 \| 3/4 \|", table, re.MULTILINE)
    out = folder / "report.json"
    assert main(["eval", str(folder), "--window", "8192", "--json", "--output", str(out)]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report == orjson.loads(out.read_bytes())
    assert [c["strategy"] for c in report["cells"]] == ["summary", "mask", "hybrid"]
    assert report["cells"][0]["scores"]["artifacts"] is not None


def test_bad_options_exit_2(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(folder / "missing")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["eval", str(folder), "--window", "-1"]) == 2
    assert main(["eval", str(folder), "--summarizer", "llm"]) == 2
    assert "--summary-model" in capsys.readouterr().err


class FakeJudge:
    """Answers with the whole transcript (a perfect reader); grades CORRECT when
    the reference answer is in the candidate."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.keys: set[str] = set()

    async def chat(self, request: Request) -> JSONResponse:
        body = orjson.loads(await request.body())
        self.asked.append(body)
        self.keys.add(request.headers.get("authorization", ""))
        system, prompt = body["messages"][0]["content"], body["messages"][1]["content"]
        if system.startswith("You grade"):
            reference = re.search(r"Reference answer: (.*)\nCandidate", prompt, re.DOTALL)
            candidate = prompt.split("Candidate answer: ", 1)[1]
            flat = " ".join(candidate.split())
            text = (
                "CORRECT" if reference and " ".join(reference[1].split()) in flat else "INCORRECT"
            )
        else:
            text = prompt
        return JSONResponse(
            {
                "id": "j",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


def test_a_judge_is_asked_every_probe_and_its_grades_reported(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    judge = FakeJudge()
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    app = Starlette(routes=[Route("/v1/chat/completions", judge.chat, methods=["POST"])])
    with serve_in_thread(app) as url:
        argv = ["eval", str(folder), "--window", "8192", "--strategy", "mask", "--json"]
        argv += ["--judge", f"{url}/v1", "--judge-model", "grader", "--judge-key-env", "JUDGE_KEY"]
        assert main(argv) == 0
    cell = orjson.loads(capsys.readouterr().out)["cells"][0]
    probes = sum(cell["probes"].values())
    assert len(judge.asked) == 2 * probes  # one question and one grade per probe
    assert judge.keys == {"Bearer sk-judge"}
    assert {body["model"] for body in judge.asked} == {"grader"}
    # The perfect reader sees what presence sees: where the reference answer
    # is the needle itself (recall), the judge agrees with presence.
    assert cell["judge_scores"]["recall"] == cell["scores"]["recall"] < 1
    assert 0 < cell["judge_all"] <= 1


def test_the_proxy_never_imports_the_evaluation() -> None:
    code = (
        "import sys, proxy.app, proxy.flow.handler, proxy.cli.server, proxy.cli.commands;"
        "proxy.cli.commands.build_parser().parse_args(['serve']);"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'evaluation'], 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
