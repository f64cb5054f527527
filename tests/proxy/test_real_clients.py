"""Unmodified agent CLIs through the proxy: Codex (OpenAI Responses) and Claude Code
(Anthropic Messages), each against a scripted upstream of its API.

The CLIs come from npm (``.ci/run`` installs them into ``.ci/clients``; or set
``COMPACTION_TEST_CLIENTS`` to a folder holding ``codex`` and ``claude``).
Where one is not installed its test skips and says how to install it.

Observed shapes (the CLIs' own requests, recorded through the proxy): Codex 0.171 streams, sends
``store: false``, ``include: ["reasoning.encrypted_content"]``,
``prompt_cache_key``, ``client_metadata``, ``parallel_tool_calls`` and the
whole input each turn; Claude Code 2.1 sends ``system`` as blocks, 24 tools,
``max_tokens: 32000``, ``thinking: {"type": "adaptive"}``,
``context_management``, ``metadata``, ``output_config``, ``stream: true`` and
``system``-role messages inside ``messages``.

Beyond ``-p`` and ``exec``, the sessions here use each CLI's headless input
mode (``real_clients_sessions.py``): Claude Code's stream-json input, where the
user types while a tool runs, and the Codex app server (``turn/start``,
``turn/steer``), the protocol its IDE extension speaks. The proxy's answers
are recorded too (``real_clients_upstreams.py``, with the scripted upstreams),
so the ``x-compaction-*`` figures the CLIs never show can be compared with
what they do show.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compaction import SUMMARY_MARKER
from config import load_settings
from proxy.app import create_app
from proxy.state.stores import SessionSummary, open_store
from tests.proxy.dialects.anthropic.upstream import AnthropicUpstream
from tests.proxy.dialects.responses.upstream import ResponsesUpstream
from tests.proxy.real_clients_sessions import ClaudeStream, CodexAppServer, gate
from tests.proxy.real_clients_upstreams import (
    AgentChatUpstream,
    Answered,
    FocusAnthropicUpstream,
    FocusResponsesUpstream,
    ParallelResponsesUpstream,
    RecordingApp,
    ToolSearchAnthropicUpstream,
    compacted_figures,
    focus_of,
)
from tests.proxy.servers import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
INSTALL = {
    "npm": "npm install --prefix .ci/clients"
    " @openai/codex@0.171 @anthropic-ai/claude-code@2.1 @qwen-code/qwen-code@0.24",
    # aider's pins would fight the project's: a virtualenv of its own.
    "aider": "python3 -m venv .ci/clients/aider"
    " && .ci/clients/aider/bin/pip install aider-chat==0.86.2",
}


def _client(name: str) -> str:
    """The CLI ``name``: from ``COMPACTION_TEST_CLIENTS`` (folders, separated as
    in PATH), else from where ``.ci/run`` installs it, else on the PATH."""
    listed = os.environ.get("COMPACTION_TEST_CLIENTS", "")
    folders = [Path(f) for f in listed.split(os.pathsep) if f]
    folders += [ROOT / ".ci/clients/node_modules/.bin", ROOT / ".ci/clients/aider/bin"]
    for folder in folders:
        if (folder / name).exists():
            return str(folder / name)
    found = shutil.which(name)
    if found is None:
        install = INSTALL["aider" if name == "aider" else "npm"]
        pytest.skip(f"{name} is not installed here; to run this test: {install}")
    return found


@dataclass
class _Proxy:
    url: str
    answers: RecordingApp


@contextmanager
def _proxy(
    upstream_url: str,
    model: str,
    profile: dict[str, Any],
    *,
    store: str = "memory://",
    **upstream: Any,
) -> Iterator[_Proxy]:
    settings = load_settings(
        None,
        upstream={"base_url": upstream_url + "/v1", "trust_env": False, **upstream},
        store={"url": store},
        models={model: profile},
    )
    recording = RecordingApp(create_app(settings))
    with serve_in_thread(recording) as url:
        yield _Proxy(url, recording)


def _run(argv: list[str], cwd: Path, env: dict[str, str], received: list[Any]) -> str:
    """Run a CLI to its end; it must succeed, and the upstream must have taken
    every request it was sent (a refusal means the proxy broke the API's rules).
    Returns what it printed."""
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
    _all_taken(received)
    return run.stdout


def _all_taken(received: list[Any]) -> None:
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


#: A small window for Claude Code: it asks for max_tokens 32000, so the input
#: limit is 64k - 32k = 32k, about half of it its system prompt and tool schemas.
_CLAUDE_64K: dict[str, Any] = {
    "context_window": 64_000,
    "reserve_tokens": 4_096,
    "keep_recent_tokens": 4_000,
}


def _codex_env(home: Path, model: str, proxy: str) -> dict[str, str]:
    """Codex pointed at the proxy by a provider of its own (``CODEX_HOME``)."""
    (home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "proxy"\n'
        "[model_providers.proxy]\n"
        'name = "compaction-proxy"\n'
        f'base_url = "{proxy}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "COMPACTION_TEST_KEY"\n'
    )
    return {**os.environ, "CODEX_HOME": str(home), "COMPACTION_TEST_KEY": "sk-test"}


def _claude_env(home: Path, proxy: str) -> dict[str, str]:
    """Claude Code pointed at the proxy, in a home of its own."""
    return {
        **os.environ,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": proxy,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }


def test_codex_exec_runs_a_long_session_that_the_proxy_compacts(tmp_path: Path) -> None:
    codex = _client("codex")
    model = "gpt-4o-codex-e2e"
    profile: dict[str, Any] = {
        "context_window": 32_768,
        "reserve_tokens": 4_096,
        "keep_recent_tokens": 6_000,
        "summarizer": "llm",
        "summary_must_pay": False,  # a model asked for every summary
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
        env = _codex_env(home, model, proxy.url)
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
    # What Codex 0.171 was seen to send through the proxy: stream, store false,
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


def _claude_print(
    tmp_path: Path,
    upstream: AnthropicUpstream,
    model: str,
    profile: dict[str, Any],
    prompt: str,
    tools: list[str],
    **env: str,
) -> _Proxy:
    """Run ``claude -p prompt`` in ``tmp_path/work`` through a proxy in front of
    ``upstream``, allowed ``tools``, with ``env`` added to its environment; it must
    succeed with every request taken. Returns the proxy (its answers)."""
    home = tmp_path / "claude-home"
    home.mkdir()
    argv = [_client("claude"), "-p", prompt, "--model", model]
    argv += ["--allowedTools", ",".join(tools), "--output-format", "json"]
    with (
        serve_in_thread(upstream.app()) as upstream_url,
        _proxy(upstream_url, model, profile, anthropic_base_url=upstream_url + "/v1") as proxy,
    ):
        _run(argv, tmp_path / "work", {**_claude_env(home, proxy.url), **env}, upstream.received)
    return proxy


def test_claude_code_runs_a_long_session_that_the_proxy_compacts(tmp_path: Path) -> None:
    model = "claude-e2e"
    profile: dict[str, Any] = {
        "context_window": 100_000,
        "reserve_tokens": 8_192,
        "keep_recent_tokens": 12_000,
        "summarizer": "llm",
        "summary_must_pay": False,  # a model asked for every summary
        "tool_result_chars": 1_000_000,  # results are condensed, not briefed
    }
    work = _workspace(tmp_path, 30, lines=500)  # ~8k tokens a file
    upstream = AnthropicUpstream(
        window=profile["context_window"],
        tool_turns=30,
        tool_use=lambda turn: ("Read", {"file_path": str(work / f"part{turn}.txt")}),
    )
    prompt = "Read part0.txt to part29.txt one by one and report the values."
    _claude_print(tmp_path, upstream, model, profile, prompt, ["Read"])
    turns = upstream.message_requests
    assert len(turns) > 30  # every tool turn ran to the end
    first = turns[0].json()
    # What Claude Code 2.1 was seen to send through the proxy, all of it forwarded.
    assert isinstance(first["system"], list) and first["stream"] is True
    assert {"thinking", "context_management", "metadata", "tools"} <= set(first)
    assert any(m["role"] == "system" for m in first["messages"])  # mid-conversation system
    assert len(upstream.summary_requests) >= 2
    sizes = [r.prompt_tokens or 0 for r in turns]
    drops = sum(b < a for a, b in itertools.pairwise(sizes))
    assert drops >= 2


# --- a ToolSearch result through a condensation ----------------------------------
#
# Claude Code's tool search (the API's advanced-tool-use beta): the CLI offers a
# ``ToolSearch`` tool, the model calls it, and the CLI answers with a
# ``tool_result`` of ``tool_reference`` blocks; on the real API those blocks are
# what loads the deferred tools (sent with ``defer_loading: true``) the model
# calls next. Claude Code turns tool search off when ANTHROPIC_BASE_URL is not
# Anthropic's own host unless ENABLE_TOOL_SEARCH is set (both 2.1.197 and
# 2.1.332 then send the blocks).


def _tool_result(body: dict[str, Any], call_id: str) -> tuple[int, dict[str, Any]] | None:
    """The index of the message holding the ``tool_result`` for ``call_id``, and the block."""
    for index, message in enumerate(body["messages"]):
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if block.get("type") == "tool_result" and block.get("tool_use_id") == call_id:
                return index, block
    return None


def _summary_at(body: dict[str, Any]) -> int | None:
    """The index of the first message holding one of the proxy's summaries, if any."""
    for index, message in enumerate(body["messages"]):
        if any(t.startswith(SUMMARY_MARKER) for t in _texts(message.get("content"))):
            return index
    return None


def test_claude_code_tool_search_results_reach_the_upstream_after_their_span_is_condensed(
    tmp_path: Path,
) -> None:
    model = "claude-e2e"
    profile: dict[str, Any] = {
        **_CLAUDE_64K,
        "summarizer": "llm",
        "summary_must_pay": False,  # a model asked for every summary
        "tool_result_chars": 1_000_000,  # results are condensed, not briefed
    }
    work = _workspace(tmp_path, 12, lines=300)
    searched_at = 2  # a Read before the search and after it: the span around it is condensed
    upstream = ToolSearchAnthropicUpstream(
        window=profile["context_window"],
        tool_turns=11,
        search_at=searched_at,
        tool_use=lambda turn: ("Read", {"file_path": str(work / f"part{turn}.txt")}),
    )
    prompt = "Read part1.txt to part11.txt one by one and report the values."
    proxy = _claude_print(
        tmp_path,
        upstream,
        model,
        profile,
        prompt,
        ["Read", "ToolSearch"],
        ENABLE_TOOL_SEARCH="true",
    )
    search = upstream.search_id
    assert search is not None, "Claude Code offered no ToolSearch tool"
    bodies = [r.json() for r in upstream.message_requests]
    # What Claude Code sent for the search, as it sent it.
    sent = next(found for b in bodies if (found := _tool_result(b, search)))[1]
    references = [b for b in sent["content"] if b.get("type") == "tool_reference"]
    assert [r["tool_name"] for r in references] == list(upstream.select), sent
    assert proxy.answers.compactions("/messages"), "the session never crossed the trigger"

    # The first request whose summary stands for the span around the search: the
    # Read before it and the one after it are gone, the summary is there.
    def condensed_around_search(body: dict[str, Any]) -> bool:
        text = json.dumps(body)
        return _summary_at(body) is not None and not any(
            f"part {turn} line 1:" in text for turn in (searched_at - 1, searched_at + 1)
        )

    first = next((i for i, b in enumerate(bodies) if condensed_around_search(b)), None)
    assert first is not None, "the span holding the ToolSearch result was never condensed"
    assert upstream.summary_requests
    for number, body in enumerate(bodies[first:], first):
        found = _tool_result(body, search)
        assert found is not None, (number, "the ToolSearch result was condensed away")
        at, block = found
        # The blocks reach the upstream byte for byte, with the call they answer,
        # riding right after the summary that stands for the span around them.
        assert [b for b in block["content"] if b.get("type") == "tool_reference"] == references
        summary = _summary_at(body)
        assert summary is not None and summary < at, number
        calls = [
            b["id"]
            for b in body["messages"][at - 1]["content"]
            if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
        assert search in calls, number


# --- sessions from the client's own id ---------------------------------------------


def _sessions(store_url: str) -> list[SessionSummary]:
    async def read() -> list[SessionSummary]:
        store = open_store(store_url)
        try:
            return await store.sessions()
        finally:
            await store.close()

    return asyncio.run(read())


def test_two_runs_of_one_prompt_are_two_sessions_in_each_cli(tmp_path: Path) -> None:
    """Two ``codex exec`` runs and two ``claude -p`` runs of one prompt: each run
    is a session of its own (the client's session id names it), holding every
    request of that run."""
    codex, claude = _client("codex"), _client("claude")
    work = _workspace(tmp_path, 2)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    prompt = "Read part0.txt and part1.txt and report the values."
    responses = ResponsesUpstream(tool_turns=2, arguments=lambda step: {"cmd": "echo ok"})
    messages = AnthropicUpstream(tool_turns=2, tool_use=lambda turn: ("Bash", {"command": "ls"}))
    with (
        serve_in_thread(responses.app()) as responses_url,
        serve_in_thread(messages.app()) as messages_url,
        _proxy(
            responses_url,
            "claude-e2e",  # gpt-4o's window is in the built-in table
            {"context_window": 200_000},
            store=store,
            anthropic_base_url=messages_url + "/v1",
        ) as proxy,
    ):
        asked: dict[str, list[int]] = {"responses": [], "anthropic": []}
        for run in range(2):
            home = tmp_path / f"codex-home-{run}"
            home.mkdir()
            argv = [codex, "exec", "--skip-git-repo-check"]
            argv += ["--dangerously-bypass-approvals-and-sandbox", prompt]
            before = len(responses.received)
            _run(argv, work, _codex_env(home, "gpt-4o", proxy.url), responses.received)
            asked["responses"].append(len(responses.received) - before)
        for run in range(2):
            home = tmp_path / f"claude-home-{run}"
            home.mkdir()
            argv = [claude, "-p", prompt, "--model", "claude-e2e", "--allowedTools", "Bash"]
            before = len(messages.received)
            _run(argv, work, _claude_env(home, proxy.url), messages.received)
            asked["anthropic"].append(len(messages.received) - before)
    found = _sessions(store)
    # Each run is one session with every request of that run, and no more.
    for api, counts in asked.items():
        assert sorted(s.requests for s in found if s.api == api) == sorted(counts), found


# --- what the user adds while a tool runs ----------------------------------------
#
# Claude Code (stream-json input): a message typed while a tool runs is queued and
# sent after that tool's result ("The user sent a new message while you were
# working: …") — by 2.1.197 as a ``system``-role message, by 2.1.332 as a text
# block beside the ``tool_result``; a PostToolUse hook's ``additionalContext``
# came as a ``<system-reminder>`` text block beside the result it follows
# (2.1.197) and comes as a ``system``-role message right after it (2.1.332).
# The tests hold the behaviour, whichever the layout: the typed text and each
# note reach every later request, the note still with its result. Codex
# (app-server ``turn/steer``, what its TUI sends when the user types during a
# turn): a user message item right after the running call's
# ``function_call_output``, before the turn's next calls.

TYPED = "While you read: the values of part3 matter most, quote them exactly."

_HOOK = """\
import json, os, sys
event = json.load(sys.stdin)
name = os.path.basename(event.get("tool_input", {}).get("file_path", ""))
note = f"Reviewer note on {name}: keep its status lines in the report."
output = {"hookEventName": "PostToolUse", "additionalContext": note}
print(json.dumps({"hookSpecificOutput": output}))
"""


def _hook_note(turn: int) -> str:
    return f"Reviewer note on part{turn}.txt: keep its status lines in the report."


def _texts(content: Any) -> list[str]:
    """Every text of a message's content (string, text blocks, tool results)."""
    if isinstance(content, str):
        return [content]
    texts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        if block.get("type") == "tool_result":
            texts.extend(_texts(block.get("content")))
    return texts


def _results(body: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """tool_use_id → (the result's content as JSON, the texts that come with it:
    beside it in its message and in the messages after it up to the model's
    next turn)."""
    found: dict[str, tuple[str, list[str]]] = {}
    following: list[str] = []  # the results the texts met now come with
    for message in body["messages"]:
        content = message.get("content")
        if message.get("role") == "assistant":
            following = []
            continue
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        results = [b for b in blocks if b.get("type") == "tool_result"]
        for block in results:
            found[block["tool_use_id"]] = (json.dumps(block.get("content")), [])
        if results:
            following = [block["tool_use_id"] for block in results]
        texts = [content] if isinstance(content, str) else []
        texts += [b["text"] for b in blocks if b.get("type") == "text"]
        for call in following:
            found[call][1].extend(texts)
    return found


def test_claude_code_keeps_text_the_user_adds_during_tool_runs_after_the_results_are_pruned(
    tmp_path: Path,
) -> None:
    claude = _client("claude")
    model = "claude-e2e"
    # No summarizer: every compaction of this session prunes, so what is kept
    # must be kept verbatim.
    profile: dict[str, Any] = {**_CLAUDE_64K, "summarizer": "off"}
    work = _workspace(tmp_path, 12, lines=200)
    typed_at, flag = 3, tmp_path / "typed.flag"

    def tool_use(turn: int) -> tuple[str, dict[str, Any]]:
        if turn == typed_at:  # a command that runs until the user has typed
            command = gate(flag, f"cat part{turn}.txt")
            return "Bash", {"command": command, "description": f"Print part{turn}.txt"}
        return "Read", {"file_path": str(work / f"part{turn}.txt")}

    upstream = AnthropicUpstream(window=64_000, tool_turns=11, tool_use=tool_use)
    hook = tmp_path / "hook.py"
    hook.write_text(_HOOK)
    settings = {
        "hooks": {
            "PostToolUse": [
                {
                    "matcher": "Read",
                    "hooks": [{"type": "command", "command": f"{sys.executable} {hook}"}],
                }
            ]
        }
    }
    home = tmp_path / "claude-home"
    home.mkdir()
    with (
        serve_in_thread(upstream.app()) as upstream_url,
        _proxy(upstream_url, model, profile, anthropic_base_url=upstream_url + "/v1") as proxy,
    ):
        args = ["--model", model, "--allowedTools", "Read,Bash", "--settings", json.dumps(settings)]
        session = ClaudeStream(claude, args, work, _claude_env(home, proxy.url))
        session.type("Read part1.txt to part11.txt one by one and report the values.")
        while session.tool_use()["name"] != "Bash":
            pass
        session.type(TYPED)
        flag.touch()
        result = session.result()
        status = session.close()
    assert status == 0 and result.get("subtype") == "success", session.stderr()
    _all_taken(upstream.received)
    bodies = [r.json() for r in upstream.message_requests]
    assert len(bodies) == 12 and not upstream.summary_requests
    assert proxy.answers.compactions("/messages"), "the session never crossed the trigger"

    # The typed message reaches every request after the one it first rode in.
    typed_from = next(
        i
        for i, b in enumerate(bodies)
        if any(TYPED in t for m in b["messages"] for t in _texts(m["content"]))
    )
    (bash,) = [
        b["id"]
        for m in bodies[typed_from]["messages"]
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_use" and b.get("name") == "Bash"
    ]
    output = _results(bodies[typed_from])[bash][0]
    bash_pruned = 0
    for number, body in enumerate(bodies[typed_from:], typed_from):
        assert any(TYPED in t for m in body["messages"] for t in _texts(m["content"])), number
        bash_pruned += _results(body)[bash][0] != output
    assert bash_pruned, "the output of the command the user typed during was never pruned"

    # Each hook note stays with its tool result in every later request, also
    # once that result is pruned to a brief.
    pruned_beside = 0
    for turn in (1, 2, 4, 5):
        note = _hook_note(turn)
        first = next(
            i
            for i, b in enumerate(bodies)
            if any(note in t for _, ts in _results(b).values() for t in ts)
        )
        (call,) = [
            c for c, (_, ts) in _results(bodies[first]).items() if any(note in t for t in ts)
        ]
        original = _results(bodies[first])[call][0]
        for number, body in enumerate(bodies[first:], first):
            result_now, beside = _results(body)[call]
            assert any(note in t for t in beside), (number, turn, beside)
            pruned_beside += result_now != original
    assert pruned_beside, "no tool result with a note beside it was pruned"


def test_codex_keeps_a_message_the_user_types_during_a_tool_run_after_the_outputs_are_pruned(
    tmp_path: Path,
) -> None:
    codex = _client("codex")
    model = "gpt-4o-codex-e2e"
    profile: dict[str, Any] = {
        "context_window": 32_768,
        "reserve_tokens": 4_096,
        "keep_recent_tokens": 4_000,
        "summarizer": "off",
    }
    work = _workspace(tmp_path, 16)
    steered_at, flag = 3, tmp_path / "typed.flag"

    def command(step: int) -> dict[str, Any]:
        cat = f"cat part{step}.txt"
        return {"cmd": gate(flag, cat) if step == steered_at else cat}

    upstream = ParallelResponsesUpstream(
        window=profile["context_window"],
        tool_turns=16,
        count_issued=True,
        arguments=command,
        beside_at=steered_at,  # a second command runs beside the one the user types during
        beside={"cmd": "echo beside"},
    )
    home = tmp_path / "codex-home"
    home.mkdir()
    with (
        serve_in_thread(upstream.app()) as upstream_url,
        _proxy(upstream_url, model, profile) as proxy,
    ):
        server = CodexAppServer(codex, work, _codex_env(home, model, proxy.url))
        thread = server.start_thread(work)
        turn = server.start_turn(thread, "Read every part file, one by one, and report the values.")
        while str(flag) not in server.command_started()["command"]:
            pass
        server.steer(thread, turn, TYPED)
        flag.touch()
        server.turn_completed()
        status = server.close()
    assert status == 0, server.stderr()
    _all_taken(upstream.received)
    bodies = [r.json()["input"] for r in upstream.turn_requests]
    assert proxy.answers.compactions("/responses"), "the session never crossed the trigger"

    def typed(item: Any) -> bool:
        return item.get("role") == "user" and TYPED in json.dumps(item)

    first = next(i for i, items in enumerate(bodies) if any(typed(x) for x in items))
    (sent,) = [x for x in bodies[first] if typed(x)]
    # Where Codex puts it: after the output of the call that was running.
    (steered,) = [
        x for x in bodies[first] if x.get("type") == "function_call" and str(flag) in x["arguments"]
    ]
    kinds = [(x.get("type"), x.get("call_id")) for x in bodies[first]]
    output_at = kinds.index(("function_call_output", steered["call_id"]))
    beside_at = kinds.index(("function_call_output", steered["call_id"] + "_beside"))
    # After the outputs of both calls (Codex 0.171 never puts it between them).
    assert bodies[first].index(sent) == max(output_at, beside_at) + 1
    original = bodies[first][output_at]["output"]
    pruned = 0
    for number, items in enumerate(bodies[first:], first):
        assert sent in items, number  # the item as Codex sent it, byte for byte
        outputs = [x for x in items if x.get("call_id") == steered["call_id"] and "output" in x]
        pruned += bool(outputs) and outputs[0]["output"] != original
    assert pruned, "the output beside the typed message was never pruned"


# --- /compact <focus> after an automatic compaction --------------------------------
#
# Neither CLI sends its own ``/compact``: Claude Code runs its own compaction
# (a "Respond with TEXT ONLY" summary request with the focus as additional
# instructions; with --disable-slash-commands it answers "/compact isn't
# available in this environment" and sends nothing), and Codex's TUI runs its
# own compaction task. What reaches the proxy is the text as a prompt: Claude
# Code sends a prompt that starts with a space as it is (" /compact …"), and the
# Codex app server sends a turn's text as it is. The proxy reads either as its
# command (the text is stripped first).

FOCUS = "keep the err= numbers exactly"
_WORDS = "the window header parser returns a string where the caller wants a number".split()
#: A chat with long answers: the automatic compaction keeps only the newest
#: question, and the answer to it is all that follows its span when the user
#: types /compact (where the proxy once found nothing to do).
_CHAT_PROFILE = {
    "reserve_tokens": 4_096,
    "keep_recent_tokens": 1_000,
    "summarizer": "llm",
    "summary_must_pay": False,  # a model asked for every summary
    "precompute_share": 0,  # compacted by the request that crosses the trigger
    "assistant_text_chars": 1_000_000,  # long answers are condensed, not briefed
}


def _check_manual_compaction(
    answer: Answered, reply: str, auto: list[Answered], summaries: list[Any]
) -> None:
    """The ``/compact`` reply states this compaction's figures: those of its own
    headers, from a summary asked for now with the focus, not the automatic
    compaction's."""
    assert auto, "no automatic compaction before /compact"
    headers = answer.headers
    assert (headers.get("x-compaction-stage"), headers.get("x-compaction-reason")) == (
        "condensed",
        "manual",
    ), (reply, headers)
    before, after, condensed = compacted_figures(reply)
    assert (before, after) == answer.tokens(), (reply, headers)
    assert condensed > 0 and after < before
    # Summarized now, with the user's focus in the summarizer's prompt.
    focuses = [focus_of(r.json()) for r in summaries]
    assert FOCUS in focuses, focuses
    # Not the compaction made before: a checkpoint of its own, other figures.
    last = auto[-1]
    assert headers["x-compaction-id"] != last.headers["x-compaction-id"]
    assert (before, after) != last.tokens()


def _long_answer(turn: int) -> str:
    """An answer longer than the verbatim tail, naming its own error number."""
    words = " ".join(_WORDS[(turn + i) % len(_WORDS)] for i in range(2_400))
    return f"Turn {turn}: the run failed with err={1000 + turn}. {words}"


def _question(turn: int) -> str:
    return f"And what about case {turn}?"


def test_claude_code_compact_with_a_focus_right_after_an_automatic_compaction_compacts_again(
    tmp_path: Path,
) -> None:
    claude = _client("claude")
    model = "claude-e2e"
    profile = {**_CHAT_PROFILE, "context_window": 64_000}  # 32k input: max_tokens is 32000
    upstream = FocusAnthropicUpstream(window=64_000, tool_turns=0, answer=_long_answer)
    work = _workspace(tmp_path, 0)
    home = tmp_path / "claude-home"
    home.mkdir()
    with (
        serve_in_thread(upstream.app()) as upstream_url,
        _proxy(upstream_url, model, profile, anthropic_base_url=upstream_url + "/v1") as proxy,
    ):
        session = ClaudeStream(claude, ["--model", model], work, _claude_env(home, proxy.url))
        for turn in itertools.count():
            assert turn < 20, "the conversation never crossed the trigger"
            session.type(_question(turn))
            session.result()
            if proxy.answers.compactions("/messages"):
                break
        auto = proxy.answers.compactions("/messages")
        summaries_before = len(upstream.summary_requests)
        answers_before = len(proxy.answers.answered)
        # A leading space: Claude Code sends the text instead of running its own /compact.
        session.type(f" /compact {FOCUS}")
        reply = session.result()["result"]
        (manual,) = proxy.answers.on("/v1/messages", since=answers_before)
        summaries = upstream.summary_requests[summaries_before:]
        turns_before = len(upstream.message_requests)
        session.type("Go on.")
        session.result()
        status = session.close()
    assert status == 0, session.stderr()
    _all_taken(upstream.received)
    _check_manual_compaction(manual, reply, auto, summaries)
    # The next request is sent over this compaction: its summary is the focused one.
    (after,) = upstream.message_requests[turns_before:]
    assert f"Focus: {FOCUS}" in after.body.decode()
    last = proxy.answers.answered[-1]
    assert last.headers["x-compaction-id"] == manual.headers["x-compaction-id"], last.headers


def test_codex_compact_with_a_focus_right_after_an_automatic_compaction_compacts_again(
    tmp_path: Path,
) -> None:
    codex = _client("codex")
    model = "gpt-4o-codex-e2e"
    profile = {**_CHAT_PROFILE, "context_window": 24_576}
    upstream = FocusResponsesUpstream(window=24_576, tool_turns=0, answer=_long_answer)
    work = _workspace(tmp_path, 0)
    home = tmp_path / "codex-home"
    home.mkdir()
    with (
        serve_in_thread(upstream.app()) as upstream_url,
        _proxy(upstream_url, model, profile) as proxy,
    ):
        server = CodexAppServer(codex, work, _codex_env(home, model, proxy.url))
        thread = server.start_thread(work)
        for turn in itertools.count():
            assert turn < 20, "the conversation never crossed the trigger"
            server.start_turn(thread, _question(turn))
            server.turn_completed()
            if proxy.answers.compactions("/responses"):
                break
        auto = proxy.answers.compactions("/responses")
        summaries_before = len(upstream.summary_requests)
        answers_before = len(proxy.answers.answered)
        # The app server sends a turn's text as it is (the TUI would run its own compaction).
        server.start_turn(thread, f"/compact {FOCUS}")
        server.turn_completed()
        reply = server.agent_messages()[-1]
        (manual,) = [
            a for a in proxy.answers.answered[answers_before:] if a.path == "/v1/responses"
        ]
        summaries = upstream.summary_requests[summaries_before:]
        turns_before = len(upstream.turn_requests)
        server.start_turn(thread, "Go on.")
        server.turn_completed()
        status = server.close()
    assert status == 0, server.stderr()
    _all_taken(upstream.received)
    _check_manual_compaction(manual, reply, auto, summaries)
    (after,) = upstream.turn_requests[turns_before:]
    assert f"Focus: {FOCUS}" in after.body.decode()
    last = proxy.answers.answered[-1]
    assert last.headers["x-compaction-id"] == manual.headers["x-compaction-id"], last.headers


# --- qwen-code ----------------------------------------------------------------------


def _qwen_env(home: Path, model: str, proxy: str) -> dict[str, str]:
    """qwen-code pointed at the proxy as its docs say (``OPENAI_*``), in a home of its own."""
    return {
        **os.environ,
        "HOME": str(home),
        "OPENAI_BASE_URL": proxy + "/v1",
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": model,
    }


def test_qwen_code_runs_a_long_session_that_the_proxy_compacts(tmp_path: Path) -> None:
    qwen = _client("qwen")
    model = "qwen-e2e"
    # qwen-code 0.24 asks for max_tokens 32768 on every request of this model and
    # its head (system prompt, reminders, tool schemas) is ~17k tokens: a 64k
    # window leaves about 15k for the conversation.
    profile: dict[str, Any] = {
        "context_window": 65_536,
        "reserve_tokens": 4_096,
        "keep_recent_tokens": 6_000,
        "summarizer": "llm",
        "summary_must_pay": False,  # a model asked for every summary
        "tool_result_chars": 1_000_000,  # results are condensed, not briefed
    }
    work = _workspace(tmp_path, 20)
    upstream = AgentChatUpstream(
        window=65_536,
        counting="chat-template",
        tool_turns=20,
        tool_call=lambda step: ("read_file", {"file_path": str(work / f"part{step}.txt")}),
    )
    home = tmp_path / "qwen-home"
    home.mkdir()
    with (
        serve_in_thread(upstream.app()) as upstream_url,
        _proxy(upstream_url, model, profile) as proxy,
    ):
        _run(
            [qwen, "--yolo", "Read part0.txt to part19.txt one by one and report the values."],
            work,
            _qwen_env(home, model, proxy.url),
            upstream.received,
        )
    turns = upstream.chat_requests
    assert upstream.issued == 20 and len(turns) > 20  # every tool turn ran to the end
    first = turns[0].json()
    # What qwen-code 0.24 was seen to send, all of it forwarded.
    assert first["stream"] is True and first["max_tokens"] >= 16_384
    assert first["stream_options"] == {"include_usage": True} and len(first["tools"]) >= 10
    assert not any(r.overflowed for r in turns), "a request went over the window"
    assert len(upstream.summary_requests) >= 2
    sizes = [r.prompt_tokens or 0 for r in turns]
    assert sum(b < a for a, b in itertools.pairwise(sizes)) >= 2
