"""Two proxy processes sharing one Redis: one summary per span, whichever replica answers."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.proxy.servers import FakeUpstream, ProxyProcess, serve_in_thread
from tests.proxy.state.stores.conftest import require_redis
from tests.synthetic import agent_session

MODELS = json.dumps({"gpt-4o": {"context_window": 8192}})


def _database() -> int:
    """A database of its own (the replicas use the default key prefix), and one
    per test worker: a pair empties it first, which must not wipe the pair
    another worker is running at the same time."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return 7 + int(worker.removeprefix("gw")) % 9  # databases 7 to 15 of Redis's 16


DB = _database()


@contextmanager
def replica_pair(
    redis_url: str | None,
    cwd: Path,
    models: str,
    summary_delay: float = 0.0,
    prepare_ahead: bool = True,
) -> Iterator[tuple[FakeUpstream, ProxyProcess, ProxyProcess]]:
    """A fake upstream and two ``compaction-proxy serve`` processes in front of
    it, sharing a Redis database emptied first; with ``prepare_ahead`` off,
    neither prepares a summary in the background."""
    base = require_redis(redis_url).rsplit("/", 1)[0]
    url = f"{base}/{DB}"
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    upstream = FakeUpstream(summary_delay=summary_delay)
    env = {"COMPACTION_PROXY_STORE__URL": url, "COMPACTION_PROXY_MODELS": models}
    if not prepare_ahead:
        env["COMPACTION_PROXY_COMPACTION__PRECOMPUTE_SHARE"] = "0"
    with serve_in_thread(upstream.app()) as upstream_url:
        # Both start at once (each spends its second importing the proxy), and
        # one that did start is stopped even when the other could not.
        with ThreadPoolExecutor(2) as pool:
            starting = [
                pool.submit(ProxyProcess, upstream_url + "/v1", env, str(cwd)) for _ in range(2)
            ]
        started = [f.result() for f in starting if f.exception() is None]
        try:
            for future in starting:
                future.result()  # raises the failure of one that did not start
            first, second = started
            yield upstream, first, second
        finally:
            for process in started:
                process.stop()


@pytest.fixture
def replicas(redis_url: str | None, tmp_path: Path) -> Any:
    # These tests count the summaries of requests; when a preparation starts
    # follows the measured summary time and pace, so on a loaded machine one
    # could start within their few turns (test_background_replicas tests those).
    with replica_pair(redis_url, tmp_path, MODELS, prepare_ahead=False) as pair:
        yield pair


def _post(url: str, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions", json={"model": "gpt-4o", "messages": messages}, timeout=60
    )


def test_a_conversation_alternating_between_replicas_is_summarized_once(replicas: Any) -> None:
    upstream, first, second = replicas
    messages = agent_session(seed=41, steps=120)
    assert _post(first.url, messages).headers["x-compaction-stage"] == "condensed"
    calls = len(upstream.summary_requests)
    for turn in range(4):
        messages = [*messages, {"role": "user", "content": f"turn {turn}"}]
        replica = second if turn % 2 == 0 else first
        response = _post(replica.url, messages)
        assert response.headers["x-compaction-stage"] == "reused"
        assert response.headers.get("x-compaction-id")
    assert len(upstream.summary_requests) == calls


def test_a_burst_of_identical_requests_compacts_once(replicas: Any) -> None:
    upstream, first, second = replicas
    messages = agent_session(seed=42, steps=120)
    results: list[httpx.Response] = []

    def send(url: str) -> None:
        results.append(_post(url, messages))

    threads = [threading.Thread(target=send, args=(r.url,)) for r in (first, second) * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 8 and all(r.status_code == 200 for r in results)
    events = httpx.get(f"{first.url}/compaction/events?limit=100").json()["data"]
    compacted = [e for e in events if e["type"] == "context.compacted"]
    assert len(compacted) == 1, [e["type"] for e in events]
    assert len({r.headers["x-compaction-id"] for r in results}) == 1
    sent = {json.dumps(r.json()["messages"]) for r in upstream.chat_requests}
    assert len(sent) == 1  # every replica forwarded the same compacted request
