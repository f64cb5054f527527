"""Two proxy processes sharing one Redis prepare a conversation's next compaction once."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.proxy.session.real_servers import (
    MODEL,
    PROFILE,
    _events,
    _into_the_zone,
    _post,
    _prepared,
    _start,
    _wait_for,
)
from tests.proxy.state.stores.test_replicas import replica_pair


@pytest.fixture
def replicas(redis_url: str | None, tmp_path: Path) -> Any:
    models = orjson.dumps({MODEL: PROFILE}).decode()
    with replica_pair(redis_url, tmp_path, models, summary_delay=0.5) as pair:
        yield pair


def test_replicas_prepare_a_span_once(replicas: Any) -> None:
    upstream, first, second = replicas

    def both(history: list[dict[str, Any]]) -> None:
        """Every turn reaches both replicas at once (a client retrying elsewhere, say)."""

        def send(url: str) -> None:
            with httpx.Client(timeout=60) as client:
                _post(client, url, history)

        threads = [threading.Thread(target=send, args=(u,)) for u in (first.url, second.url)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    _into_the_zone(both, upstream, random.Random(8), _start())
    _wait_for(lambda: _prepared(first.url))
    time.sleep(1.0)  # a second preparation, if any, would have asked by now
    prepared = [
        e for e in _events(first.url) if e["type"] == "context.compacted" and e["background"]
    ]
    spans = [e["replaced_hashes"][-1] for e in prepared]
    # One summary per span prepared, whichever replica prepared it.
    assert len(set(spans)) == len(spans) == len(upstream.summary_requests), spans
