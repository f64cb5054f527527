"""Compactions prepared in the background: who waits for the summarizer, and what it costs.

Two proxy processes in front of the same scripted upstream, whose summarizer
answers after 4 s (a real model's time). One prepares compactions ahead (the
default, ``precompute_share`` 0.8); the other does not (``precompute_share`` 0:
the turn crossing the trigger waits for the summary, as before). Each runs the
same 100-turn tool session at a 16k window, one turn a second (a model's
answer and a tool run), at the same time. A turn "waited" when the proxy took
more than half the summarizer's time to answer it.

Memory: the same two processes, freshly started, each get 100 different
conversations just past the preparation share, all at once. With preparation
on, 100 preparations are then in flight (the summarizer takes 4 s); the RSS
difference between the two processes, read while they are, is what the
background work holds.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from compaction import Profile, TokenCounter, calibrated_budget
from tests.bench.processes import PROXY_CORE, Server, _base_env, free_port, proxy_command, start
from tests.proxy.servers import FakeUpstream, serve_in_thread
from tests.synthetic import shell_step

MODEL = "agent-model"
WINDOW = 16_384
SUMMARY_SECONDS = 4.0
TURN_SECONDS = 1.0
TURNS = 100
CONVERSATIONS = 100
#: No pruning: every compaction of the session condenses, so each needs a
#: summary; and the model writes every one. Left to judge whether a model's
#: summary pays for itself (``summary_must_pay``), the plan uses the extractive
#: one at these prices, and then no turn has a summarizer to wait for: what
#: this section measures would not happen (it did not, from the plan's
#: arrival until this was set).
PROFILE = {"context_window": WINDOW, "tool_result_chars": 1_000_000, "summary_must_pay": False}
COMPACTED = ("pruned", "condensed", "truncated")
COUNTER = TokenCounter(MODEL)
RUNNING = "compaction_proxy_background_running"


@dataclass(frozen=True)
class Session:
    compactions: int
    condensed: int
    prepared: int  #: compactions that applied a summary prepared ahead
    summary_calls: int
    summarizations: int  #: summary requests sent together count once
    waited: list[float]  #: seconds of each turn that waited for the summarizer
    seconds: float


@dataclass(frozen=True)
class Background:
    ahead: Session
    inline: Session  #: preparation off: every condensation waits
    rss_ahead_kib: int
    rss_inline_kib: int
    in_flight: int  #: preparations running when the RSS was read
    conversations: int


@contextmanager
def _proxy(name: str, upstream_url: str, logs: Path, share: float) -> Iterator[Server]:
    port = free_port()
    models = {MODEL: {**PROFILE, "precompute_share": share}}
    env = {
        **_base_env(),
        "COMPACTION_PROXY_STORE__URL": f"sqlite:///{logs / (name + '.db')}",
        "COMPACTION_PROXY_MODELS": orjson.dumps(models).decode(),
    }
    argv = [*proxy_command(), "--port", str(port), "--upstream", upstream_url]
    server = start(
        name, argv, port=port, core=PROXY_CORE, env=env, logs=logs, health="/healthz", timeout=60
    )
    try:
        yield server
    finally:
        server.stop()


def _post(client: httpx.Client, url: str, messages: list[dict[str, Any]]) -> httpx.Response:
    response = client.post(f"{url}/chat/completions", json={"model": MODEL, "messages": messages})
    response.raise_for_status()
    return response


def _start(task: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": task},
    ]


def _session(url: str, upstream: FakeUpstream) -> Session:
    rng = random.Random(100)
    history = _start("Make the test suite pass.")
    stages: list[str] = []
    prepared = 0
    waited: list[float] = []
    began = time.monotonic()
    with httpx.Client(timeout=120) as client:
        for i in range(TURNS):
            history.extend(shell_step(rng, i))
            sent = time.monotonic()
            response = _post(client, url, history)
            took = time.monotonic() - sent
            stages.append(response.headers["x-compaction-stage"])
            prepared += bool(response.headers.get("x-compaction-precomputed"))
            if took > SUMMARY_SECONDS / 2:
                waited.append(took)
            time.sleep(max(TURN_SECONDS - took, 0))
    return Session(
        compactions=sum(stage in COMPACTED for stage in stages),
        condensed=stages.count("condensed"),
        prepared=prepared,
        summary_calls=len(upstream.summary_requests),
        summarizations=upstream.summary_rounds(gap=SUMMARY_SECONDS / 4),
        waited=waited,
        seconds=time.monotonic() - began,
    )


def _in_the_zone(seed: int) -> list[dict[str, Any]]:
    """A conversation just past 85 % of the 16k window's trigger."""
    rng = random.Random(seed)
    history = _start(f"Task {seed}: make the test suite pass.")
    past = 0.85 * calibrated_budget(Profile(context_window=WINDOW)).trigger
    i = 0
    while COUNTER.count_request({"model": MODEL, "messages": history}) <= past:
        history.extend(shell_step(rng, i))
        i += 1
    return history


def _burst(url: str, conversations: list[list[dict[str, Any]]]) -> None:
    def send(messages: list[dict[str, Any]]) -> None:
        with httpx.Client(timeout=120) as client:
            _post(client, url, messages)

    threads = [threading.Thread(target=send, args=(m,)) for m in conversations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure(logs: Path) -> Background:
    ahead_upstream = FakeUpstream(summary_delay=SUMMARY_SECONDS, count_tokens=False)
    inline_upstream = FakeUpstream(summary_delay=SUMMARY_SECONDS, count_tokens=False)
    results: dict[str, Session] = {}
    with (
        serve_in_thread(ahead_upstream.app()) as ahead_url,
        serve_in_thread(inline_upstream.app()) as inline_url,
        _proxy("proxy-ahead", ahead_url + "/v1", logs, 0.8) as ahead,
        _proxy("proxy-inline", inline_url + "/v1", logs, 0.0) as inline,
    ):

        def run(name: str, proxy: Server, upstream: FakeUpstream) -> None:
            results[name] = _session(proxy.base_url, upstream)

        threads = [
            threading.Thread(target=run, args=("ahead", ahead, ahead_upstream)),
            threading.Thread(target=run, args=("inline", inline, inline_upstream)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    conversations = [_in_the_zone(seed) for seed in range(CONVERSATIONS)]
    # A summarizer that takes its time: every preparation is still running
    # when the RSS is read.
    slow = 15.0
    with (
        serve_in_thread(FakeUpstream(summary_delay=slow).app()) as ahead_url,
        serve_in_thread(FakeUpstream(summary_delay=slow).app()) as inline_url,
        _proxy("proxy-ahead-memory", ahead_url + "/v1", logs, 0.8) as ahead,
        _proxy("proxy-inline-memory", inline_url + "/v1", logs, 0.0) as inline,
    ):
        # Warm both (tokenizer, first request), then the burst.
        _burst(ahead.base_url, conversations[:1])
        _burst(inline.base_url, conversations[:1])
        _burst(ahead.base_url, conversations[1:])
        _burst(inline.base_url, conversations[1:])
        time.sleep(1.0)
        running = _metric(ahead.base_url, RUNNING)
        rss_ahead, rss_inline = ahead.rss_kib(), inline.rss_kib()
        deadline = time.monotonic() + 2 * slow
        while _metric(ahead.base_url, RUNNING) and time.monotonic() < deadline:
            time.sleep(0.5)  # let them finish: nothing is cut off at shutdown
    return Background(
        ahead=results["ahead"],
        inline=results["inline"],
        rss_ahead_kib=rss_ahead,
        rss_inline_kib=rss_inline,
        in_flight=int(running),
        conversations=CONVERSATIONS,
    )


def _metric(base_url: str, name: str) -> float:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def report(figures: Background) -> list[str]:
    """The section's lines for RESULTS.md."""

    def row(name: str, session: Session) -> str:
        waits = ", ".join(f"{s:.1f}" for s in session.waited) or "none"
        return (
            f"| {name} | {session.compactions} ({session.condensed} condensed) | "
            f"{session.prepared} | {session.summarizations} ({session.summary_calls} calls) | "
            f"{len(session.waited)} ({waits}) | "
            f"{session.seconds:.0f} s |"
        )

    added = (figures.rss_ahead_kib - figures.rss_inline_kib) / 1024
    return [
        f"{TURNS}-turn tool session at a {WINDOW // 1024}k window, one turn a second, a "
        f"summarizer that answers in {SUMMARY_SECONDS:.0f} s; a turn waited when it took "
        f"over {SUMMARY_SECONDS / 2:.0f} s. A compaction whose tail starts inside a turn asks "
        "for its summary and a note on that turn together: one summary asked, two calls.",
        "",
        "| proxy | compactions | prepared ahead | summaries asked | turns that waited (s) | "
        "session |",
        "|---|---|---|---|---|---|",
        row("preparing ahead (default, share 0.8)", figures.ahead),
        row("not preparing (share 0)", figures.inline),
        "",
        f"Memory: {figures.conversations} conversations past the share at once; "
        f"{figures.in_flight} preparations were in flight when RSS was read: "
        f"{figures.rss_ahead_kib / 1024:.0f} MiB preparing vs "
        f"{figures.rss_inline_kib / 1024:.0f} MiB not → **{added:+.1f} MiB** (target < 50 MiB).",
    ]


if __name__ == "__main__":  # python -m tests.bench.background: this section alone
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        print("\n".join(report(measure(Path(folder)))))
        sys.stdout.flush()
