"""Unmodified agent CLIs through the proxy: Codex (OpenAI Responses) and Claude Code
(Anthropic Messages), each against a scripted upstream of its API.

The CLIs come from npm (``.ci/run`` installs them into ``.ci/clients``; or set
``COMPACTION_TEST_CLIENTS`` to a folder holding ``codex`` and ``claude``).
Where one is not installed its test skips and says how to install it.

Observed shapes (recorded in issue 11's note): Codex 0.171 streams, sends
``store: false``, ``include: ["reasoning.encrypted_content"]``,
``prompt_cache_key``, ``client_metadata``, ``parallel_tool_calls`` and the
whole input each turn; Claude Code 2.1 sends ``system`` as blocks, 24 tools,
``max_tokens: 32000``, ``thinking: {"type": "adaptive"}``,
``context_management``, ``metadata``, ``output_config``, ``stream: true`` and
``system``-role messages inside ``messages``.
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
from tests.proxy.dialects.anthropic_upstream import AnthropicUpstream
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


def _run(argv: list[str], cwd: Path, env: dict[str, str], received: list[Any]) -> None:
    """Run a CLI to its end; it must succeed, and the upstream must have taken
    every request it was sent (a refusal means the proxy broke the API's rules)."""
    run = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    statuses = [r.status for r in received]
    assert statuses and all(s == 200 for s in statuses), statuses


def _workspace(tmp_path: Path, files: int, lines: int = 150) -> Path:
    """Files the agent is asked to read, about 1,500 tokens each (150 lines)."""
    work = tmp_path / "work"
    work.mkdir()
    for i in range(files):
        text = (f"part {i} line {j}: value={j * 7919 % 10007} status=ok" for j in range(lines))
        (work / f"part{i}.txt").write_text("\n".join(text))
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
        _run(
            [
                codex,
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "Read every part file, one by one, and report the values.",
            ],
            work,
            env,
            upstream.received,
        )
    turns = upstream.turn_requests
    assert len(turns) > 30  # Codex ran every tool turn to the end
    first = turns[0].json()
    # What Codex 0.171 sends (recorded in the note): stream, store false,
    # encrypted reasoning, a cache key, the whole input on every turn.
    assert first["stream"] is True and first["store"] is False
    assert "reasoning.encrypted_content" in first["include"]
    assert "previous_response_id" not in first
    # Its headers reach the upstream unchanged.
    headers = turns[0].headers
    assert headers["originator"] == "codex_exec"
    assert headers["authorization"] == "Bearer sk-test"
    assert {"session-id", "x-codex-window-id", "x-codex-turn-metadata"} <= set(headers)
    # The conversation was condensed at least twice, each time in the Responses
    # API, and every compaction shrank what the upstream received.
    assert len(upstream.summary_requests) >= 2, [r.input_tokens for r in turns]
    drops = sum(b.input_tokens < a.input_tokens for a, b in itertools.pairwise(turns))
    assert drops >= 2


def test_claude_code_runs_a_long_session_that_the_proxy_compacts(tmp_path: Path) -> None:
    claude = _client("claude")
    model = "claude-e2e"
    profile = {
        "context_window": 100_000,
        "reserve_tokens": 8_192,
        "keep_recent_tokens": 12_000,
        "summarizer": "llm",
        "tool_result_chars": 1_000_000,  # results are condensed, not briefed
    }
    work = _workspace(tmp_path, 30, lines=500)  # ~8k tokens a file
    upstream = AnthropicUpstream(
        window=profile["context_window"],
        tool_turns=30,
        tool_use=lambda turn: ("Read", {"file_path": str(work / f"part{turn}.txt")}),
    )
    home = tmp_path / "claude-home"
    home.mkdir()
    with (
        serve_in_thread(upstream.app()) as upstream_url,
        _proxy(upstream_url, model, profile, anthropic_base_url=upstream_url + "/v1") as proxy,
    ):
        env = {
            **os.environ,
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": proxy,
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
        _run(
            [
                claude,
                "-p",
                "Read part0.txt to part29.txt one by one and report the values.",
                "--model",
                model,
                "--allowedTools",
                "Read",
                "--output-format",
                "json",
            ],
            work,
            env,
            upstream.received,
        )
    turns = upstream.message_requests
    assert len(turns) > 30  # every tool turn ran to the end
    first = turns[0].json()
    # What Claude Code 2.1 sends (recorded in the note), all of it forwarded.
    assert isinstance(first["system"], list) and first["stream"] is True
    assert {"thinking", "context_management", "metadata", "tools"} <= set(first)
    assert any(m["role"] == "system" for m in first["messages"])  # mid-conversation system
    assert len(upstream.summary_requests) >= 2
    drops = sum(b.prompt_tokens < a.prompt_tokens for a, b in itertools.pairwise(turns))
    assert drops >= 2
