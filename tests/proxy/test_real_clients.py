"""Unmodified agent CLIs through the proxy: Codex (OpenAI Responses) and Claude Code
(Anthropic Messages), each against a scripted upstream of its API.

The CLIs come from npm (``.ci/run`` installs them into ``.ci/clients``; or set
``COMPACTION_TEST_CLIENTS`` to a folder holding ``codex`` and ``claude``).
Where one is not installed its test skips and says how to install it.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from config import load_settings
from proxy.app import create_app
from tests.proxy.dialects.responses_upstream import ResponsesUpstream
from tests.proxy.servers import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "npm install --prefix .ci/clients @openai/codex@0.171 @anthropic-ai/claude-code@2.1"


def _client(name: str) -> str:
    folders = [
        os.environ.get("COMPACTION_TEST_CLIENTS"),
        ROOT / ".ci/clients/node_modules/.bin",
    ]
    for folder in folders:
        if folder and (Path(folder) / name).exists():
            return str(Path(folder) / name)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed here; to run this test: {INSTALL}")
    return found


@contextmanager
def _proxy(
    upstream_url: str, model: str, profile: dict[str, Any], **upstream: Any
) -> Iterator[str]:
    settings = load_settings(
        None,
        upstream={"base_url": upstream_url + "/v1", "trust_env": False, **upstream},
        store={"url": "memory://"},
        models={model: profile},
    )
    with serve_in_thread(create_app(settings)) as url:
        yield url


def _workspace(tmp_path: Path, files: int) -> Path:
    """Files the agent is asked to read, about 1,500 tokens each."""
    work = tmp_path / "work"
    work.mkdir()
    for i in range(files):
        lines = (f"part {i} line {j}: value={j * 7919 % 10007} status=ok" for j in range(150))
        (work / f"part{i}.txt").write_text("\n".join(lines))
    return work


def test_codex_exec_runs_a_long_session_that_the_proxy_compacts(tmp_path: Path) -> None:
    codex = _client("codex")
    model = "gpt-4o-codex-e2e"
    profile = {
        "context_window": 32_768,
        "reserve_tokens": 4_096,
        "keep_recent_tokens": 6_000,
        "summarizer": "llm",
        "tool_result_chars": 1_000_000,  # outputs are condensed, not briefed
    }
    upstream = ResponsesUpstream(
        window=profile["context_window"],
        tool_turns=30,
        count_issued=True,
        arguments=lambda step: {"cmd": f"cat part{step}.txt"},
    )
    work = _workspace(tmp_path, 30)
    home = tmp_path / "codex-home"
    home.mkdir()
    with (
        serve_in_thread(upstream.app()) as upstream_url,
        _proxy(upstream_url, model, profile) as proxy,
    ):
        (home / "config.toml").write_text(
            f'model = "{model}"\n'
            'model_provider = "proxy"\n'
            "[model_providers.proxy]\n"
            'name = "compaction-proxy"\n'
            f'base_url = "{proxy}/v1"\n'
            'wire_api = "responses"\n'
            'env_key = "COMPACTION_TEST_KEY"\n'
        )
        env = {**os.environ, "CODEX_HOME": str(home), "COMPACTION_TEST_KEY": "sk-test"}
        run = subprocess.run(
            [
                codex,
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "Read every part file, one by one, and report the values.",
            ],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
    assert run.returncode == 0, run.stderr[-2000:]
    statuses = [r.status for r in upstream.received]
    assert statuses and all(s == 200 for s in statuses), statuses
    turns = upstream.turn_requests
    assert len(turns) > 30  # Codex ran every tool turn to the end
    first = turns[0].json()
    # What Codex 0.171 sends (recorded in the note): stream, store false,
    # encrypted reasoning, a cache key, the whole input on every turn.
    assert first["stream"] is True and first["store"] is False
    assert "reasoning.encrypted_content" in first["include"]
    assert "previous_response_id" not in first
    # The conversation was condensed at least twice, each time in the Responses
    # API, and every compaction shrank what the upstream received.
    assert len(upstream.summary_requests) >= 2, [r.input_tokens for r in turns]
    drops = sum(b.input_tokens < a.input_tokens for a, b in itertools.pairwise(turns))
    assert drops >= 2
