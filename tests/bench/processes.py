"""The processes under test: the fast upstream, the proxy, LiteLLM; pinning and RSS.

Each server runs as its own process, started the way a user starts it and
pinned to a core before it runs any code (``sched_setaffinity`` in the child,
so every thread it ever starts inherits the pin): the upstream on core 0, the
proxies on core 1. Their stderr goes to a log file, never to a pipe nobody
reads.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_CORE = 0
PROXY_CORE = 1
CLIENT_CORE = 0


def cores() -> int:
    return len(os.sched_getaffinity(0))


def core_for(wanted: int) -> set[int] | None:
    """``{wanted}`` when this machine has that core, else no pinning."""
    available = os.sched_getaffinity(0)
    return {wanted} if wanted in available and len(available) > 1 else None


def pin_self(core: int) -> bool:
    target = core_for(core)
    if target is None:
        return False
    os.sched_setaffinity(0, target)
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` from /proc (VmRSS), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pinned(core: int) -> Callable[[], None] | None:
    target = core_for(core)
    if target is None:
        return None

    def pin() -> None:
        os.sched_setaffinity(0, target)

    return pin


@dataclass
class Server:
    """A server process on a loopback port, stopped with SIGTERM then SIGKILL."""

    name: str
    process: subprocess.Popen[bytes]
    base_url: str  #: with /v1, no trailing slash
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1].split("/", 1)[0])

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def start(
    name: str,
    argv: Sequence[str],
    *,
    port: int,
    core: int,
    env: Mapping[str, str],
    logs: Path,
    health: str,
    timeout: float,
) -> Server:
    """Start ``argv`` and wait until ``health`` (a path on ``port``) answers."""
    log = logs / f"{name}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=_pinned(core),  # sched_setaffinity only: safe after fork
        )
    server = Server(name, process, f"http://127.0.0.1:{port}/v1", log)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=2).status_code < 500:
                return server
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"{name} did not start: {server.log_tail()}")
        time.sleep(0.1)


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}


def start_upstream(logs: Path, chunks: int, interval: float) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "tests.bench.upstream", "--port", str(port)]
    argv += ["--chunks", str(chunks), "--interval", str(interval)]
    return start(
        "upstream",
        argv,
        port=port,
        core=UPSTREAM_CORE,
        env=_base_env(),
        logs=logs,
        health="/healthz",
        timeout=30,
    )


#: Models the bench uses besides gpt-4o (built-in window 128k): gpt-4o's encoding, smaller
#: windows, so the same conversations compact.
MODEL_32K = "gpt-4o-bench-32k"
MODEL_16K = "gpt-4o-bench-16k"
#: A window a million-token session fits under (the 1M models' sessions, resent every turn).
MODEL_2M = "gpt-4o-bench-2m"
BENCH_MODELS = json.dumps(
    {
        MODEL_32K: {"context_window": 32_000},
        MODEL_16K: {"context_window": 16_384},
        MODEL_2M: {"context_window": 2_000_000},
    }
)


def proxy_command() -> list[str]:
    return [str(Path(sys.executable).parent / "compaction-proxy"), "serve"]


def start_proxy(
    upstream: Server,
    logs: Path,
    store: Path,
    name: str = "proxy",
    tree: Path | None = None,
    *,
    minimal: bool = False,
) -> Server:
    """``compaction-proxy serve`` with default logging, a SQLite store and extractive summaries;
    the code of ``tree`` (an exported revision) instead of this one's, if given.

    ``minimal``: only the store and the chat upstream are set, the two settings
    every revision since the first bench reads (a later one, unknown to an
    older revision, would stop it starting): enough for a small chat request.
    """
    port = free_port()
    env = {
        **_base_env(),
        **({"PYTHONPATH": str(tree)} if tree is not None else {}),
        "COMPACTION_PROXY_STORE__URL": f"sqlite:///{store}",
    }
    if not minimal:
        env["COMPACTION_PROXY_UPSTREAM__ANTHROPIC_BASE_URL"] = upstream.base_url
        env["COMPACTION_PROXY_COMPACTION__SUMMARIZER"] = "extractive"
        env["COMPACTION_PROXY_MODELS"] = BENCH_MODELS
    argv = [*proxy_command(), "--port", str(port), "--upstream", upstream.base_url]
    return start(
        name, argv, port=port, core=PROXY_CORE, env=env, logs=logs, health="/healthz", timeout=60
    )


def start_forwarder(upstream: Server, logs: Path) -> Server:
    """The bare forwarder (``tests/bench/forwarder.py``), pinned like the proxies."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.bench.forwarder", "--port", str(port)]
    argv += ["--upstream", upstream.base_url]
    return start(
        "forwarder",
        argv,
        port=port,
        core=PROXY_CORE,
        env=_base_env(),
        logs=logs,
        health="/healthz",
        timeout=30,
    )
