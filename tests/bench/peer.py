"""LiteLLM's proxy as the peer: installed into its own virtualenv, pointed at the same upstream.

The virtualenv (``.bench-venv/``, git-ignored) is created on first use and
kept between runs; installing is never part of a timed figure. Whatever goes
wrong (no network, a failed install, a proxy that does not start in time) is
returned as a note for RESULTS.md and the bench carries on without the peer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.bench.processes import PROXY_CORE, ROOT, Server, free_port, start

VENV = ROOT / ".bench-venv"
STAMP = VENV / ".installed"
REQUIREMENT = "litellm[proxy]"
INSTALL_TIMEOUT = 900.0
START_TIMEOUT = 120.0
#: The client's key doubles as LiteLLM's master key, so the same requests pass its auth.
MASTER_KEY = "sk-bench"


@dataclass(frozen=True)
class Peer:
    server: Server | None
    version: str
    note: str  #: why there is no peer, or how it was run


def _litellm() -> Path:
    return VENV / "bin" / "litellm"


def ensure_installed() -> str | None:
    """Install LiteLLM into the bench virtualenv if needed; a note when that failed."""
    if STAMP.exists() and _litellm().exists():
        return None
    print(f"bench: installing {REQUIREMENT} into {VENV.name}/ (once) …", flush=True)
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [*pip, "--upgrade", "pip"],
        [*pip, REQUIREMENT],
    ]
    for step in steps:
        try:
            done = subprocess.run(
                step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            return f"installing {REQUIREMENT} took longer than {INSTALL_TIMEOUT:.0f} s"
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.splitlines() if "is ignored" not in ln]
            return f"`{' '.join(step[-2:])}` failed: {' '.join(lines[-3:])[:300]}"
    STAMP.touch()
    return None


def version() -> str:
    try:
        done = subprocess.run(
            [
                str(VENV / "bin" / "python"),
                "-c",
                "import importlib.metadata as m;print(m.version('litellm'))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return done.stdout.strip()


def start_peer(upstream: Server, logs: Path) -> Peer:
    """LiteLLM proxy, one worker, default logging, forwarding gpt-4o to ``upstream``."""
    problem = ensure_installed()
    if problem is not None:
        return Peer(None, "", f"LiteLLM not measured: {problem}.")
    config = logs / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: gpt-4o\n"
        "    litellm_params:\n"
        "      model: openai/gpt-4o\n"
        f"      api_base: {upstream.base_url}\n"
        "      api_key: sk-bench\n"
    )
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of the price table at start
        "LITELLM_TELEMETRY": "False",
    }
    port = free_port()
    argv = [str(_litellm()), "--config", str(config), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--num_workers", "1"]
    try:
        server = start(
            "litellm",
            argv,
            port=port,
            core=PROXY_CORE,
            env=env,
            logs=logs,
            health="/health/liveliness",
            timeout=START_TIMEOUT,
        )
    except RuntimeError as exc:
        return Peer(None, "", f"LiteLLM not measured: it did not start ({str(exc)[-300:]}).")
    return Peer(server, version(), "")
