"""Where the proxy's CPU goes: a proxy process of its own under cProfile, on the CPU clock.

``python -m tests.bench.profiling OUT.prof serve …`` runs ``compaction-proxy``
with cProfile ready on its main thread, on ``time.thread_time`` (only CPU the
thread used counts, not time it waited or was preempted by other processes):
SIGUSR1 starts profiling, SIGUSR2 stops it and writes the stats. So start-up
and warm-up stay out. :func:`profile_load` does all that around a load and
reads the stats back into the functions that cost most. cProfile's own
overhead inflates call-heavy code: the shares say where to look, not exact
costs. Work the proxy moves to threads (large token counts, SQLite) is not in
the main thread's profile.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.bench.client import Target
from tests.bench.processes import (
    BENCH_MODELS,
    PROXY_CORE,
    ROOT,
    Server,
    free_port,
    proxy_command,
    start,
)

#: Files whose functions count as the project's own code.
OWN = (f"{os.sep}proxy{os.sep}", f"{os.sep}compaction{os.sep}", f"{os.sep}config{os.sep}")


@dataclass(frozen=True)
class Cost:
    function: str  #: ``module.py:function``
    seconds: float
    share: float  #: of all profiled CPU


@dataclass(frozen=True)
class Profile:
    label: str
    requests: int
    cpu_ms_per_request: float
    own: list[Cost]  #: cumulative, the project's functions
    packages: list[Cost]  #: self time by package, builtins counted with their callers


Key = tuple[str, int, str]

#: Packages reported together: one HTTP client stack, one web framework.
_GROUPS = {
    "httpx": "httpx client (httpx, httpcore, h11, anyio, sniffio)",
    "httpcore": "httpx client (httpx, httpcore, h11, anyio, sniffio)",
    "h11": "httpx client (httpx, httpcore, h11, anyio, sniffio)",
    "anyio": "httpx client (httpx, httpcore, h11, anyio, sniffio)",
    "sniffio": "httpx client (httpx, httpcore, h11, anyio, sniffio)",
    "starlette": "FastAPI / Starlette",
    "fastapi": "FastAPI / Starlette",
    "uvicorn": "uvicorn (HTTP server)",
}


def _name(key: Key) -> str:
    filename, _, function = key
    if filename == "~":
        return function  # a builtin
    path = Path(filename)
    return f"{path.parent.name}/{path.name}:{function}"


def _package(filename: str) -> str:
    parts = Path(filename).parts
    if "site-packages" in parts:
        name = parts[parts.index("site-packages") + 1].split(".")[0].split("-")[0]
        return _GROUPS.get(name, name)
    root = Path(ROOT).parts
    if parts[: len(root)] == root and len(parts) > len(root):
        return f"{parts[len(root)]}/ (this project)"
    if filename.startswith("<"):
        return "other (generated code, imports)"
    path = Path(filename)
    module = path.stem if path.parent.name.startswith("python3") else path.parent.name
    return f"stdlib {module}"


def _by_package(table: dict[Key, tuple[Any, ...]]) -> dict[str, float]:
    """Self time per package; a builtin's time goes to the packages that called it."""
    found: dict[str, float] = {}
    for key, (_, _, self_time, _, callers) in table.items():
        if key[0] != "~":
            package = _package(key[0])
            found[package] = found.get(package, 0.0) + self_time
            continue
        for caller, figures in callers.items():
            package = _package(caller[0]) if caller[0] != "~" else "builtins"
            found[package] = found.get(package, 0.0) + figures[2]
    return found


def read(path: Path, label: str, requests: int, top: int = 10) -> Profile:
    table: dict[Key, tuple[Any, ...]] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in table.values()) or 1.0
    own = sorted(
        ((key, entry[3]) for key, entry in table.items() if any(p in key[0] for p in OWN)),
        key=lambda item: -item[1],
    )
    packages = sorted(_by_package(table).items(), key=lambda item: -item[1])
    return Profile(
        label=label,
        requests=requests,
        cpu_ms_per_request=total * 1000 / max(requests, 1),
        own=[Cost(_name(k), s, s / total) for k, s in own[:top]],
        packages=[Cost(name, s, s / total) for name, s in packages[:top]],
    )


def start_profiled(upstream: Server, logs: Path, output: Path) -> Server:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")},
        "COMPACTION_PROXY_STORE__URL": f"sqlite:///{logs / 'profile.db'}",
        "COMPACTION_PROXY_COMPACTION__SUMMARIZER": "extractive",
        "COMPACTION_PROXY_MODELS": BENCH_MODELS,
    }
    argv = [sys.executable, "-m", "tests.bench.profiling", str(output)]
    argv += [*proxy_command()[1:], "--port", str(port), "--upstream", upstream.base_url]
    return start(
        "proxy-profiled",
        argv,
        port=port,
        core=PROXY_CORE,
        env=env,
        logs=logs,
        health="/healthz",
        timeout=60,
    )


def profile_load(
    upstream: Server,
    logs: Path,
    label: str,
    load: Callable[[Target], int],
) -> Profile:
    """Profile a fresh proxy during ``load`` (which returns how many requests it sent).

    ``load`` runs twice: once unprofiled to warm the proxy up (encodings,
    token cache, connections), then profiled.
    """
    output = logs / f"profile-{len(list(logs.glob('profile-*.prof')))}.prof"
    server = start_profiled(upstream, logs, output)
    try:
        target = Target("proxy-profiled", "127.0.0.1", server.port)
        load(target)
        begin(server, output)
        requests = load(target)
        end(server, output)
    finally:
        server.stop()
    return read(output, label, requests)


def begin(server: Server, output: Path) -> None:
    """Start ``server``'s profiler (started by :func:`start_profiled` with
    ``output``), and wait until it runs: nothing but the load is profiled."""
    _signal(server, signal.SIGUSR1, _started(output))


def end(server: Server, output: Path) -> None:
    """Stop ``server``'s profiler and wait until it has written ``output``."""
    _signal(server, signal.SIGUSR2, output)


def _started(output: Path) -> Path:
    """The file the profiled process writes once its profiler runs."""
    return output.with_name(output.name + ".started")


def _signal(server: Server, signum: int, written: Path, timeout: float = 15.0) -> None:
    """Send ``signum``, and wait until the handler has written ``written``.

    No request is sent to make the process run its handler (one would be
    profiled with the load): a Python handler runs as soon as the main
    thread runs Python again, at the latest on uvicorn's next tick.
    """
    os.kill(server.pid, signum)
    deadline = time.monotonic() + timeout
    while not written.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the profiled proxy did not answer signal {signum}")
        time.sleep(0.02)


def main() -> None:
    output, argv = sys.argv[1], sys.argv[2:]
    sys.path.insert(0, str(ROOT))
    from proxy.cli.commands import main as cli

    profiler = cProfile.Profile(time.thread_time)

    def started(signum: int, frame: object) -> None:
        profiler.enable()
        _started(Path(output)).touch()

    def ended(signum: int, frame: object) -> None:
        profiler.disable()
        profiler.dump_stats(output + ".part")
        os.replace(output + ".part", output)  # whole when it appears

    signal.signal(signal.SIGUSR1, started)
    signal.signal(signal.SIGUSR2, ended)
    cli(argv)


if __name__ == "__main__":
    main()
