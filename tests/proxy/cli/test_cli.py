"""The command line, run as a user runs it: the installed console script."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

import pytest

from compaction import SUMMARY_MARKER, validate_tool_pairing
from compaction.summary.prompts import SUMMARY_SYSTEM_PROMPT
from tests.proxy.servers import first_health
from tests.synthetic import agent_session

SCRIPT = Path(sys.executable).with_name("compaction-proxy")


def run_cli(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> Any:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    return subprocess.run(
        [str(SCRIPT), *args],
        input=stdin,
        capture_output=True,
        env={**clean, **(env or {})},
        timeout=120,
    )


@pytest.fixture
def big_request(tmp_path: Path) -> Path:
    body = {
        "model": "gpt-4o",
        "messages": agent_session(seed=3, steps=150),
        "temperature": 0.2,
        "x_vendor": {"keep": True},
    }
    path = tmp_path / "request.json"
    path.write_text(json.dumps(body))
    return path


def test_compact_writes_same_shape_with_other_fields_untouched(
    big_request: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    done = run_cli("compact", str(big_request), "--context-window", "8192", "--report", str(report))
    assert done.returncode == 0, done.stderr
    original = json.loads(big_request.read_text())
    out = json.loads(done.stdout)
    assert {k: v for k, v in out.items() if k != "messages"} == {
        k: v for k, v in original.items() if k != "messages"
    }
    assert validate_tool_pairing(out["messages"]) == []
    assert out["messages"][:2] == original["messages"][:2]
    figures = json.loads(report.read_text())
    for key in (
        "stage",
        "reason",
        "tokens_before",
        "tokens_after",
        "input_limit",
        "messages_before",
        "messages_after",
        "notes",
    ):
        assert key in figures
    # L = W − R, less the 2 % safety margin for the estimate's error.
    assert figures["tokens_after"] <= figures["input_limit"] == int((8192 - 2048) * 0.98)
    assert figures["messages_before"] == len(original["messages"])
    assert figures["stage"] in ("condensed", "truncated")
    line = done.stderr.decode().splitlines()[0]
    assert f"{figures['tokens_before']:,}" in line and f"{figures['tokens_after']:,}" in line


def test_a_small_request_is_written_back_byte_for_byte(tmp_path: Path) -> None:
    raw = b'{"model":"gpt-4o",  "messages":[{"role":"user","content":"hi"}],"n":1}'
    done = run_cli("compact", "-", stdin=raw)
    assert done.returncode == 0
    assert done.stdout == raw
    assert done.stderr.decode().startswith("none:")


def test_bare_array_in_bare_array_out(big_request: Path) -> None:
    messages = json.loads(big_request.read_text())["messages"]
    done = run_cli("compact", "-", "--context-window", "8192", stdin=json.dumps(messages).encode())
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert isinstance(out, list) and out[0] == messages[0]


def test_manual_reason_compacts_even_under_the_trigger(big_request: Path) -> None:
    done = run_cli(
        "compact", str(big_request), "--reason", "manual", "--instructions", "focus on tests"
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert any(
        isinstance(m.get("content"), str) and m["content"].startswith(SUMMARY_MARKER)
        for m in out["messages"]
    )
    assert "reason manual" in done.stderr.decode()


@pytest.mark.parametrize(
    ("stdin", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"model": "x"}', "no 'messages'"),
        (b'{"messages": [{"content": "no role"}]}', "messages[0].role"),
        (b"42", "expected a request object"),
    ],
)
def test_invalid_input_exits_2_with_one_line(stdin: bytes, needle: str) -> None:
    done = run_cli("compact", "-", stdin=stdin)
    assert done.returncode == 2
    err = done.stderr.decode().strip()
    assert needle in err and len(err.splitlines()) == 1
    assert done.stdout == b""


def test_missing_file_exits_2() -> None:
    done = run_cli("compact", "/nonexistent/request.json")
    assert done.returncode == 2
    assert "/nonexistent/request.json" in done.stderr.decode()


def test_a_head_too_large_for_the_window_exits_3(tmp_path: Path) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "word " * 10_000},
            {"role": "user", "content": "hi"},
        ]
    }
    done = run_cli("compact", "-", "--context-window", "4096", stdin=json.dumps(body).encode())
    assert done.returncode == 3
    assert "head" in done.stderr.decode()


def test_invalid_config_file_exits_2_naming_the_key(tmp_path: Path, big_request: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[compaction]\nreserv_tokens = 5\n")
    done = run_cli("compact", str(big_request), "--config", str(config))
    assert done.returncode == 2
    assert "reserv_tokens" in done.stderr.decode()


def test_config_file_sets_the_window(tmp_path: Path, big_request: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[models."gpt-4o"]\ncontext_window = 8192\n')
    done = run_cli("compact", str(big_request), "--config", str(config), "--report", "/dev/stdout")
    assert done.returncode == 0, done.stderr
    assert "limit 6,021" in done.stderr.decode()  # (8192 − 2048) × 0.98


def test_inspect_shows_roles_groups_head_tail_and_pairing(big_request: Path) -> None:
    done = run_cli("inspect", str(big_request), "--context-window", "8192")
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    for needle in (
        "by role",
        "tool",
        "head",
        "tail",
        "largest groups",
        "tool pairing     ok",
        "would compact",
        "o200k_base",
    ):
        assert needle in text


# --- the llm summarizer against a real HTTP server on loopback --------------


class _Upstream(BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []
    reply: ClassVar[dict[str, Any]] = {}
    status = 200

    def do_POST(self) -> None:
        length = int(self.headers["content-length"])
        type(self).received.append(
            {
                "path": self.path,
                "auth": self.headers.get("authorization"),
                "body": json.loads(self.rfile.read(length)),
            }
        )
        data = json.dumps(type(self).reply).encode()
        self.send_response(type(self).status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[tuple[str, type[_Upstream]]]:
    handler = type("Handler", (_Upstream,), {"received": [], "status": 200})
    handler.reply = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    # Names a file or command of every span of the synthetic session:
                    # a summary naming none of its span's is not taken.
                    "content": "## Goal\nFix the test.\n## Progress\nRan pytest, git diff; "
                    "read routes.py, test_app.py, README.md, util.js, app.py.\n"
                    "## Key Decisions\nKeep the API.\n## Next Steps\nRun the suite again.",
                },
            }
        ]
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    finally:
        server.shutdown()
        server.server_close()


def test_llm_summarizer_calls_upstream_with_key_and_no_tools(
    big_request: Path, upstream: tuple[str, type[_Upstream]]
) -> None:
    url, handler = upstream
    done = run_cli(
        "compact",
        str(big_request),
        "--context-window",
        "8192",
        "--summarizer",
        "llm",
        "--upstream",
        url,
        env={"OPENAI_API_KEY": "sk-test-123"},
    )
    assert done.returncode == 0, done.stderr
    assert handler.received, "the summarizer was not called"
    # A tail that starts inside a turn asks for the summary (in parts, for a
    # long span) and a shorter note on the turn's first steps at once, in any
    # order: the summary's requests are told apart by their system prompt,
    # never by when they arrived.
    for call in handler.received:
        assert call["path"] == "/v1/chat/completions"
        assert call["auth"] == "Bearer sk-test-123"
        assert call["body"]["temperature"] == 0 and call["body"]["stream"] is False
        assert "tools" not in call["body"]
    summaries = [
        call
        for call in handler.received
        if call["body"]["messages"][0]["content"] == SUMMARY_SYSTEM_PROMPT
    ]
    assert summaries, "no request asked for the summary itself"
    assert all(500 <= call["body"]["max_tokens"] <= 4000 for call in summaries)
    out = json.loads(done.stdout)
    summary = next(
        m for m in out["messages"] if str(m.get("content", "")).startswith(SUMMARY_MARKER)
    )
    assert "Fix the test." in summary["content"]
    assert "summary by llm" in done.stderr.decode()


def test_llm_failure_falls_back_to_extractive(
    big_request: Path, upstream: tuple[str, type[_Upstream]]
) -> None:
    url, handler = upstream
    handler.status = 500
    done = run_cli(
        "compact",
        str(big_request),
        "--context-window",
        "8192",
        "--summarizer",
        "llm",
        "--upstream",
        url,
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr.decode()
    assert "summary by extractive" in err and "500" in err


def test_serve_runs_the_proxy_until_sigterm(tmp_path: Path) -> None:
    import signal
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    process = subprocess.Popen(
        [str(SCRIPT), "serve", "--port", str(port), "--upstream", "http://127.0.0.1:9/v1"],
        cwd=tmp_path,
        env=clean,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        health = first_health(port, process)
        assert health.json() == {"status": "ok"}
        down = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert down.status_code == 502  # the configured upstream is not there
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal it caught.
    assert process.returncode in (0, -signal.SIGTERM), err
    assert b"Application shutdown complete" in err
    assert b"127.0.0.1:9/v1" in err  # the start-up line names the upstream


# --- serve with an upstream per API --------------------------------------------


class _Recorder:
    """An upstream that answers every POST with its own name and remembers the paths."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.paths: list[str] = []

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def answer(request: Request) -> JSONResponse:
            self.paths.append(request.url.path)
            return JSONResponse({"id": "x", "served_by": self.name})

        return Starlette(routes=[Route("/{path:path}", answer, methods=["POST"])])


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _started(
    tmp_path: Path, *flags: str, output: int = subprocess.PIPE
) -> tuple[subprocess.Popen[bytes], int]:
    """``compaction-proxy serve`` with ``flags``, once it answers, and its port;
    its stdout and stderr to ``output`` (pipes of their own by default)."""
    port = _free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    clean["ANTHROPIC_API_KEY"] = clean["OPENAI_API_KEY"] = ""
    # Not the upstream's window: these tests count the requests it is sent.
    clean["COMPACTION_PROXY_UPSTREAM__DISCOVER_WINDOWS"] = "never"
    process = subprocess.Popen(
        [str(SCRIPT), "serve", "--port", str(port), *flags],
        cwd=tmp_path,
        env=clean,
        stdout=output,
        stderr=output,
    )
    try:
        first_health(port, process)
    except BaseException:
        process.kill()
        process.communicate(timeout=30)
        raise
    return process, port


@contextlib.contextmanager
def _serving(tmp_path: Path, *flags: str) -> Iterator[tuple[str, list[str]]]:
    """``compaction-proxy serve`` with ``flags``; its /v1 URL, then its stderr lines."""
    import signal

    process, port = _started(tmp_path, *flags)
    lines: list[str] = []
    try:
        yield f"http://127.0.0.1:{port}/v1", lines
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        lines.extend(err.decode().splitlines())


_CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
_MESSAGES = {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
_RESPONSES = {"model": "gpt-4o", "input": [{"role": "user", "content": "hi"}]}


def test_serve_sends_each_api_to_its_own_upstream(tmp_path: Path) -> None:
    import httpx

    from tests.proxy.servers import serve_in_thread

    openai_side, anthropic_side = _Recorder("openai"), _Recorder("anthropic")
    with (
        serve_in_thread(openai_side.app()) as openai_url,
        serve_in_thread(anthropic_side.app()) as anthropic_url,
    ):
        flags = ("--upstream", openai_url + "/v1", "--anthropic-upstream", anthropic_url + "/v1")
        with _serving(tmp_path, *flags) as (proxy, lines):
            served = {
                path: httpx.post(f"{proxy}{path}", json=body, timeout=30).json()["served_by"]
                for path, body in (
                    ("/chat/completions", _CHAT),
                    ("/responses", _RESPONSES),
                    ("/messages", _MESSAGES),
                    ("/messages/count_tokens", _MESSAGES),
                )
            }
    assert served == {
        "/chat/completions": "openai",
        "/responses": "openai",
        "/messages": "anthropic",
        "/messages/count_tokens": "anthropic",
    }
    assert openai_side.paths == ["/v1/chat/completions", "/v1/responses"]
    assert anthropic_side.paths == ["/v1/messages", "/v1/messages/count_tokens"]
    [startup] = [line for line in lines if "compaction-proxy on" in line]
    assert f"chat and responses {openai_url}/v1" in startup
    assert f"anthropic {anthropic_url}/v1" in startup


#: Chat requests sent while nobody reads the proxy's log: their lines are many
#: times what the pipe below holds.
_UNREAD_REQUESTS = 300


def test_serve_answers_while_nobody_reads_its_log_and_writes_every_line_later(
    tmp_path: Path,
) -> None:
    """A log output nobody reads (a stalled pipe, a paused terminal) fills up;
    written from the event loop, the next line stopped every request."""
    import fcntl
    import signal

    import httpx

    from tests.proxy.servers import serve_in_thread

    upstream = _Recorder("openai")
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # full after some twenty lines
    with serve_in_thread(upstream.app()) as upstream_url:
        try:
            process, port = _started(tmp_path, "--upstream", upstream_url + "/v1", output=write_end)
        finally:
            os.close(write_end)
        log = bytearray()
        reader = threading.Thread(target=lambda: log.extend(_read_all(read_end)), daemon=True)
        try:
            with httpx.Client(timeout=10) as client:
                statuses = [
                    client.post(
                        f"http://127.0.0.1:{port}/v1/chat/completions", json=_CHAT
                    ).status_code
                    for _ in range(_UNREAD_REQUESTS)
                ]
        finally:
            process.send_signal(signal.SIGTERM)
            reader.start()  # the log is read only now
            returncode = process.wait(timeout=30)
            reader.join(timeout=30)
    assert statuses == [200] * _UNREAD_REQUESTS
    assert returncode in (0, -signal.SIGTERM)
    lines = log.decode().splitlines()
    # Every line waited for the reader and none was dropped, the shutdown's last
    # too: written before uvicorn raised the SIGTERM again, which ends the process.
    assert sum("compaction_proxy.requests: chat " in line for line in lines) == _UNREAD_REQUESTS
    assert not any("dropped" in line for line in lines)
    assert "Finished server process" in lines[-1]


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as pipe:
        return pipe.read()


def test_a_502_log_line_names_the_upstream_that_could_not_be_reached(tmp_path: Path) -> None:
    import httpx

    openai_url = f"http://127.0.0.1:{_free_port()}/v1"
    # A key in the URL's user part is never printed.
    anthropic_url = f"http://user:sk-secret-in-url@127.0.0.1:{_free_port()}/v1"
    flags = ("--upstream", openai_url, "--anthropic-upstream", anthropic_url)
    with _serving(tmp_path, *flags) as (proxy, lines):
        for path, body in (
            ("/chat/completions", _CHAT),
            ("/messages", _MESSAGES),
            ("/models", None),
        ):
            if body is None:
                assert httpx.get(f"{proxy}{path}", timeout=30).status_code == 502
            else:
                assert httpx.post(f"{proxy}{path}", json=body, timeout=30).status_code == 502
    shown_anthropic = anthropic_url.replace("user:sk-secret-in-url@", "")
    failures = [line for line in lines if "status=502" in line]
    assert failures
    named = (f"upstream={openai_url}", f"upstream={shown_anthropic}")
    assert all(any(name in f for name in named) for f in failures)
    assert any(f"upstream={shown_anthropic}" in f for f in failures)
    assert sum(f"upstream={openai_url}" in f for f in failures) >= 2  # chat, and /v1/models
    assert not any("sk-secret-in-url" in line for line in lines)


def test_inspect_shows_the_window_its_source_the_limit_and_the_trigger_apart() -> None:
    body = json.dumps(
        {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}
    )
    plain = run_cli("inspect", "-", stdin=body.encode())
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.decode().splitlines()
    window, limit, trigger = (
        next(line for line in lines if line.startswith(p))
        for p in ("context window", "input limit", "trigger")
    )
    assert "200,000" in window and "built-in model table" in window
    assert "reserve 16,384" in limit
    assert trigger.split()[1].replace(",", "").isdigit()

    beta = run_cli(
        "inspect",
        "-",
        "--anthropic-beta",
        "interleaved-thinking-2025-05-14,context-1m-2025-08-07",
        stdin=body.encode(),
    )
    text = beta.stdout.decode()
    assert "context window   1,000,000   (asked for by the client's anthropic-beta header)" in text


def test_version_names_the_installed_distribution() -> None:
    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == f"compaction-proxy {version('compaction-proxy')}"


def test_serve_on_a_port_in_use_says_so_in_one_line_before_starting_anything() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("serve", "--port", str(port))
    assert done.returncode == 2
    said = done.stderr.decode().strip().splitlines()
    assert said == [f"compaction-proxy: cannot listen on 127.0.0.1:{port}: Address already in use"]


ANTHROPIC_BODY = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1024,
    "system": "You are Claude Code.",
    "messages": [
        {"role": "user", "content": "Fix app.py"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "tu1", "name": "Read", "input": {"file_path": "app.py"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "x = 1\n" * 200}],
        },
    ],
}
RESPONSES_BODY = {
    "model": "gpt-5",
    "input": [
        {"role": "user", "content": "Fix app.py"},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "shell",
            "arguments": json.dumps({"cmd": "cat app.py"}),
        },
        {"type": "function_call_output", "call_id": "c1", "output": "x = 1\n" * 200},
    ],
}


@pytest.mark.parametrize(
    ("body", "api", "call"),
    [
        (ANTHROPIC_BODY, "Anthropic Messages", "Read(app.py)"),
        (RESPONSES_BODY, "OpenAI Responses", "shell(cat app.py)"),
    ],
)
def test_inspect_reads_other_apis_as_the_proxy_maps_them(
    tmp_path: Path, body: dict[str, Any], api: str, call: str
) -> None:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(body))
    done = run_cli("inspect", str(path))
    assert done.returncode == 0, done.stderr
    report = done.stdout.decode()
    assert api in report
    assert f"assistant → {call}" in report  # the tool call, named
