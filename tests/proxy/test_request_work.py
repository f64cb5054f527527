"""How much work one small pass-through chat request makes, counted, not timed.

Two figures of the request path's length (docs/architecture.md, "One request's
trip"), each held to a ceiling so that it only ever goes down:

* the distinct project functions (``proxy/``, ``compaction/``, ``config/``) a
  small request far under its trigger runs in a real ``serve`` process, under
  the bench's cProfile harness (``tests/bench/profiling.py``): warmed up with
  requests first, the bookkeeping after the answer included (the recorder's
  batch written);
* the project types the request's data is copied into between the route and
  the upstream call, counted in-process with a profile hook on the event
  loop's thread: every project object whose ``__init__`` ran there and that
  holds the raw body, the parsed body or its messages as one of its own fields.
"""

from __future__ import annotations

import pstats
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from tests.bench import profiling
from tests.bench.client import Target, run, sequential
from tests.bench.processes import start_upstream
from tests.bench.workloads import small_body
from tests.proxy import inprocess
from tests.proxy.conftest import AppFactory

#: Distinct project functions of one small pass-through request, bookkeeping
#: included, where it stands (it was 244 before the pass-through skipped what
#: cannot matter to it, 216 before a request far under its trigger was
#: forwarded without the engine's reading and /compact was looked for by a
#: byte search first, 185 before the edge, the store, the usage read, the
#: traffic count and the model knowledge each took one straight path: a chat
#: body parsed and checked in one pass, a bodyless GET not watched, a healthy
#: store's call one frame and its deadline, a usage object read once, no
#: wrapper around the upstream's answer; 150 before the upstream's head was
#: read in one pass, its size and its lower-cased names together, 148 before
#: a request's budget was made once, already calibrated, 147 before it was
#: made holding back the tools' room too, 146 before the usage tap parsed
#: the object it cut out where it closed it, 145 before a request with no
#: anthropic-beta header skipped reading a client window from it, 143
#: before the log handler was the log writer itself, 142 before a request's
#: figures read whether its bill is priced off the bill's usage, 141
#: before the resolver held a model's window to its working limit, from
#: its cache, 140 before a user request asked whether its upstream has one
#: slot only when a summary to it is in flight, 139 before the SQLite worker
#: settled what the loop knows after its own commits on its thread: the
#: recorder's write no longer makes a second trip to learn nothing changed,
#: 138 before the usage tap parsed a usage object whole in its chunk at
#: once instead of opening it and following it byte by byte, 137 before a
#: request's configuration read its three windows in place and an answer's
#: head was filtered in one loop, and before the harness stopped counting
#: its own /healthz: it now waits for the profiler's file instead, 132
#: before a bill without a dollar price worked out no dollars, the relay
#: stopped aborting an answer read to its end, and the client's headers were
#: read in one pass instead of four).
#: The aim is 108: half of what it was before the services. What is left is mostly
#: the edge's checks, the relay, the transport, the usage read off the
#: answer, the bill and the figures — and the server's connection callbacks.
MAX_FUNCTIONS = 129
#: Project types the request's data is copied into on its way upstream, where
#: it stands: the dialect's Reading, the Call and the CompactionResult that
#: says it went as it came (the engine's Conversation and the reading
#: cache's _State, the Decision and Resolved's own copy are gone). The aim,
#: three, is met.
MAX_COPIES = 3
WARM_UP = 30
_SEAM = inprocess.__file__
JSON = {"content-type": "application/json"}


def _own_functions(stats_file: Path) -> set[tuple[str, str]]:
    table = pstats.Stats(str(stats_file)).stats  # type: ignore[attr-defined]
    return {
        (f"{Path(key[0]).parent.name}/{Path(key[0]).name}", key[2])
        for key in table
        if any(part in key[0] for part in profiling.OWN)
    }


def test_a_small_pass_through_request_runs_at_most_the_ceiling_of_project_functions(
    tmp_path: Path,
) -> None:
    upstream = start_upstream(tmp_path, 1, 0.0)
    try:
        out = tmp_path / "request.prof"
        server = profiling.start_profiled(upstream, tmp_path, out)
        try:
            target = Target("proxy", "127.0.0.1", server.port)
            body = target.request("/chat/completions", small_body())
            run(sequential(target, body, WARM_UP, 0))
            time.sleep(1.5)  # the warm-up's figures written before profiling starts
            profiling.begin(server, out)
            run(sequential(target, body, 1, 0))
            time.sleep(1.5)  # the recorder gathers a second before it writes
            profiling.end(server, out)
        finally:
            server.stop()
    finally:
        upstream.stop()
    functions = _own_functions(out)
    assert len(functions) <= MAX_FUNCTIONS, sorted(functions)


class _Copies:
    """A profile hook: the project types built on the loop's thread holding the
    request's data, until the transport is asked to send it."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.types: set[str] = set()
        self.sent = False

    def _holds_the_request(self, value: Any) -> bool:
        if isinstance(value, bytes):
            return value == self.raw
        if isinstance(value, dict):
            return "messages" in value
        if isinstance(value, list) and value:
            return isinstance(value[0], dict) and "role" in value[0]
        return False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.sent or event not in ("call", "return"):
            return
        name = frame.f_code.co_name
        # The transport seam's one method: the request is on its way upstream.
        if event == "call" and name == "request" and frame.f_code.co_filename == _SEAM:
            self.sent = True
            return
        if event != "return" or name != "__init__":
            return
        made = frame.f_locals.get("self")
        module = type(made).__module__
        if made is None or not module.startswith(("proxy.", "compaction.")):
            return
        fields = getattr(made, "__dict__", None) or {
            slot: getattr(made, slot, None) for slot in getattr(type(made), "__slots__", ())
        }
        if any(self._holds_the_request(value) for value in fields.values()):
            self.types.add(type(made).__qualname__)


def test_the_request_data_is_copied_into_at_most_the_ceiling_of_types(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models={"gpt-4o": {"context_window": 128_000}})
    raw = small_body()
    for _ in range(3):  # warmed up: caches filled as on a running proxy
        proxy.http.post(f"{proxy.url}/chat/completions", content=raw, headers=JSON)
    copies = _Copies(raw)
    proxy.http.portal.call(sys.setprofile, copies)  # type: ignore[union-attr]
    try:
        answer = proxy.http.post(f"{proxy.url}/chat/completions", content=raw, headers=JSON)
    finally:
        proxy.http.portal.call(sys.setprofile, None)  # type: ignore[union-attr]
    assert answer.status_code == 200
    assert copies.sent, "the hook saw the upstream call"
    assert len(copies.types) <= MAX_COPIES, ", ".join(sorted(copies.types))
