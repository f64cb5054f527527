"""Two proxy processes sharing one Redis: one summary per span, whichever replica answers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
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
DB = 7  # a database of its own: the replicas use the default key prefix


@contextmanager
def replica_pair(
    redis_url: str | None, cwd: Path, models: str, summary_delay: float = 0.0
) -> Iterator[tuple[FakeUpstream, ProxyProcess, ProxyProcess]]:
    """A fake upstream and two ``compaction-proxy serve`` processes in front of
    it, sharing a Redis database emptied first."""
    base = require_redis(redis_url).rsplit("/", 1)[0]
    url = f"{base}/{DB}"
    redis.Redis.from_url(url).flushdb()
    upstream = FakeUpstream(summary_delay=summary_delay)
    env = {"COMPACTION_PROXY_STORE__URL": url, "COMPACTION_PROXY_MODELS": models}
    with serve_in_thread(upstream.app()) as upstream_url:
        first = ProxyProcess(upstream_url + "/v1", env, str(cwd))
        second = ProxyProcess(upstream_url + "/v1", env, str(cwd))
        try:
            yield upstream, first, second
        finally:
            first.stop()
            second.stop()


@pytest.fixture
def replicas(redis_url: str | None, tmp_path: Path) -> Any:
    with replica_pair(redis_url, tmp_path, MODELS) as pair:
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
