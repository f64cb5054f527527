"""The background-preparation session driven through real servers, for the
tests where processes or the network are the point (replicas sharing a
store, a metrics scrape of a running server): a summarizer with a delay, a
client that paces its turns."""

from __future__ import annotations

import random
import time
from typing import Any

import httpx
import orjson

from tests.proxy.conftest import ProxyFactory
from tests.proxy.servers import FakeUpstream
from tests.synthetic import shell_step

WINDOW = 16_384
MODEL = "agent-model"
#: No pruning: every compaction of this session condenses, so each needs a summary.
PROFILE = {"context_window": WINDOW, "tool_result_chars": 1_000_000}
COMPACTED = ("pruned", "condensed", "truncated")


def _start(messages: str = "Make the test suite pass.") -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": messages},
    ]


def _post(client: httpx.Client, url: str, messages: list[dict[str, Any]]) -> httpx.Response:
    response = client.post(f"{url}/chat/completions", json={"model": MODEL, "messages": messages})
    assert response.status_code == 200, response.text
    return response


def _prefix(body: bytes) -> bytes:
    return orjson.dumps(orjson.loads(body)["messages"])[:-1]


def _events(url: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/compaction/events", params={"limit": 1000}, timeout=10)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["data"]
    return sorted(events, key=lambda event: event["created_at"])


def _wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _into_the_zone(
    send: Any,
    upstream: FakeUpstream,
    rng: random.Random,
    history: list[dict[str, Any]],
    asked: int = 0,
) -> None:
    """Grow ``history`` a turn at a time (``send`` posts it) until the proxy
    starts preparing a compaction: the upstream is asked for a summary (more
    than ``asked`` in all)."""
    for i in range(200):
        history.extend(shell_step(rng, len(history) + i))
        send(history)
        time.sleep(0.05)  # the agent's own pause; the preparation starts meanwhile
        if len(upstream.summary_requests) > asked:
            return
    raise AssertionError("the conversation never came near its trigger")


def _over_the_trigger(
    client: httpx.Client, url: str, rng: random.Random, history: list[dict[str, Any]]
) -> httpx.Response:
    for i in range(200):
        history.extend(shell_step(rng, len(history) + i))
        response = _post(client, url, history)
        if response.headers["x-compaction-stage"] in COMPACTED:
            return response
    raise AssertionError("the conversation never crossed its trigger")


def _prepared(url: str) -> bool:
    return any(e["type"] == "context.compacted" and e["background"] for e in _events(url))


def _prepared_session(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory, seed: int
) -> tuple[FakeUpstream, str, random.Random, list[dict[str, Any]]]:
    """A session grown until the proxy prepared its next compaction (summaries
    numbered: ``(summary #1)`` is the prepared one)."""
    upstream, _ = fake
    upstream.summary_text += "\n- (summary #{call})"
    url = start_proxy(models={MODEL: PROFILE})
    rng = random.Random(seed)
    history = _start()
    with httpx.Client(timeout=60) as client:
        _into_the_zone(lambda h: _post(client, url, h), upstream, rng, history)
    _wait_for(lambda: _prepared(url))
    return upstream, url, rng, history
