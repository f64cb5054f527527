"""Requests to a real proxy whose store fails, and what they should be answered.

Shared by ``tests/proxy/test_store_faults.py`` (SQLite and Redis failing) and
``tests/proxy/test_garbage_store.py`` (a Redis answering garbage): one model
with a small window, one session long enough to be condensed on it, one short
enough never to be, and the checks a degraded proxy must still pass.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.synthetic import agent_session

MODELS = {"gpt-4o": {"context_window": 8192}}
#: Condensed on an 8k window (test_durability.py uses the same session).
LONG = agent_session(seed=31, steps=120)
#: Small, but past the head: its lookup asks the store.
SHORT = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "still there?"},
]


def process_env(store_url: str) -> dict[str, str]:
    """The environment of a proxy process on ``store_url``, knowing :data:`MODELS`."""
    return {
        "COMPACTION_PROXY_STORE__URL": store_url,
        "COMPACTION_PROXY_MODELS": json.dumps(MODELS),
    }


def chat(url: str, messages: list[dict[str, Any]]) -> httpx.Response:
    """A Chat Completions request to the proxy's ``/v1`` at ``url``."""
    return httpx.post(
        f"{url}/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"authorization": "Bearer sk-test"},
        timeout=60,
    )


def answered(response: httpx.Response, stage: str) -> None:
    """The request was served, by the upstream, after compaction ``stage``."""
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-stage"] == stage
    body = response.json()
    assert body["choices"][0]["message"]["role"] == "assistant"


def healthz(url: str) -> dict[str, Any]:
    """What ``/healthz`` says of the proxy whose ``/v1`` is at ``url``."""
    response = httpx.get(f"{url.removesuffix('/v1')}/healthz", timeout=10)
    assert response.status_code == 200  # degraded still serves
    body: dict[str, Any] = response.json()
    return body
