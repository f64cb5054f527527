"""The proxy under test: a real ``compaction-proxy serve`` subprocess.

Started the way a user starts it, configured through the environment only (no
configuration file is read: it runs in an empty folder of its own)::

    COMPACTION_PROXY_MODELS              {"gpt-4o": {"context_window": W}}
    COMPACTION_PROXY_COMPACTION__SUMMARIZER   extractive | llm
    COMPACTION_PROXY_COMPACTION__PRICING      anthropic | openai
    COMPACTION_PROXY_STORE__URL               a SQLite file in that folder
    COMPACTION_PROXY_UPSTREAM__DISCOVER_WINDOWS  never (the window is the table's)
    COMPACTION_PROXY_UPSTREAM__TRUST_ENV      false (the upstream is on loopback)

Its log goes to a file in that folder, never to a pipe nobody reads. Every wait
is bounded: the start by :data:`START_SECONDS`, the stop by
:data:`STOP_SECONDS` after SIGTERM, then SIGKILL. :func:`serving` stops it
whatever happens in the block.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp

from evaluation.replay.sessions import REPLAY_MODEL

START_SECONDS: Final = 60.0
STOP_SECONDS: Final = 15.0
_POLL_SECONDS: Final = 0.1


class ProxyStartError(RuntimeError):
    """The proxy did not answer /healthz in time; carries the end of its log."""


@dataclass(frozen=True)
class ProxyConfig:
    """What one proxy run is started with."""

    window: int
    prices: str  #: a compaction.pricing preset name
    #: "extractive", "llm" (a model asked where its summary pays, the default
    #: rule) or "llm-always" (a model asked for every summary)
    summarizer: str

    @property
    def asks_a_model(self) -> bool:
        return self.summarizer.startswith("llm")


@dataclass(frozen=True)
class RunningProxy:
    base_url: str  #: with /v1
    root: str  #: scheme, host and port
    log: Path


def proxy_env(config: ProxyConfig, folder: Path) -> dict[str, str]:
    """The environment the proxy runs with: this one's, without any proxy setting
    of the caller's, and the run's own."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        base.pop(name, None)
        base.pop(name.lower(), None)
    # The proxy measured is the one beside this package, whatever the
    # virtualenv installed: a replay run from another checkout (an export of a
    # commit, a worktree) measures that checkout's code.
    checkout = str(Path(__file__).resolve().parents[2])
    path = [checkout, *filter(None, base.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        **base,
        "PYTHONPATH": os.pathsep.join(path),
        "COMPACTION_PROXY_MODELS": json.dumps({REPLAY_MODEL: {"context_window": config.window}}),
        "COMPACTION_PROXY_COMPACTION__SUMMARIZER": "llm" if config.asks_a_model else "extractive",
        "COMPACTION_PROXY_COMPACTION__SUMMARY_MUST_PAY": str(config.summarizer == "llm").lower(),
        "COMPACTION_PROXY_COMPACTION__PRICING": config.prices,
        "COMPACTION_PROXY_STORE__URL": f"sqlite:///{folder / 'state.db'}",
        "COMPACTION_PROXY_UPSTREAM__DISCOVER_WINDOWS": "never",
        "COMPACTION_PROXY_UPSTREAM__TRUST_ENV": "false",
    }


def _command() -> list[str]:
    script = Path(sys.executable).parent / "compaction-proxy"
    if script.exists():
        return [str(script), "serve"]
    found = shutil.which("compaction-proxy")
    return [found, "serve"] if found else [sys.executable, "-m", "proxy.cli.commands", "serve"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def serving(config: ProxyConfig, upstream: str, folder: Path) -> AsyncIterator[RunningProxy]:
    """Run the proxy in front of ``upstream`` for the block; stopped on the way out."""
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = folder / "proxy.log"
    argv = [*_command(), "--port", str(port), "--upstream", upstream, "--log-level", "warning"]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv,
            cwd=folder,
            env=proxy_env(config, folder),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    running = RunningProxy(f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{port}", log)
    try:
        await _healthy(running, process)
        yield running
    finally:
        await asyncio.to_thread(_stop, process)


async def _healthy(running: RunningProxy, process: subprocess.Popen[bytes]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_SECONDS
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        while loop.time() < deadline and process.poll() is None:
            try:
                async with client.get(f"{running.root}/healthz") as response:
                    if response.status < 500:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(_POLL_SECONDS)
    tail = running.log.read_text(errors="replace")[-1500:] if running.log.exists() else ""
    raise ProxyStartError(f"compaction-proxy serve did not start: {tail}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_SECONDS)


_GAUGE = re.compile(r"^compaction_proxy_background_running(?:\{[^}]*\})? ([0-9.e+-]+)$", re.M)
_FAILURES = re.compile(
    r"^compaction_proxy_summarizer_failures_total(?:\{[^}]*\})? ([0-9.e+-]+)$", re.M
)


async def metric_values(client: aiohttp.ClientSession, running: RunningProxy) -> tuple[int, int]:
    """The proxy's background compactions running now, and its summarizer failures so far
    (read from /metrics)."""
    async with client.get(f"{running.root}/metrics") as response:
        text = await response.text()
    running_now = sum(float(v) for v in _GAUGE.findall(text))
    failures = sum(float(v) for v in _FAILURES.findall(text))
    return int(running_now), int(failures)
