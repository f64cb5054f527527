"""Checkpoints are scoped: another caller, another model or another window never
reuses a conversation's stored compaction: it holds one caller's words, sized for one window."""

from __future__ import annotations

from typing import Any

import httpx

from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.servers import FakeUpstream
from tests.synthetic import agent_session

MODELS = {"small": {"context_window": 8_192}, "huge": {"context_window": 1_000_000}}


def _post(
    proxy: InProcessProxy, key: str, model: str, messages: list[dict[str, Any]]
) -> httpx.Response:
    return proxy.http.post(
        f"{proxy.url}/chat/completions",
        json={"model": model, "messages": messages},
        headers={"authorization": f"Bearer {key}"},
    )


def _proxy(start_app: AppFactory) -> InProcessProxy:
    return start_app(models=MODELS, compaction={"summarizer": "extractive"})


def test_the_same_caller_reuses_its_compaction(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    proxy = _proxy(start_app)
    messages = agent_session(seed=61, steps=80)
    first = _post(proxy, "sk-alice", "small", messages)
    assert first.headers["x-compaction-stage"] in ("condensed", "truncated")
    again = _post(proxy, "sk-alice", "small", [*messages, {"role": "user", "content": "next?"}])
    assert again.headers["x-compaction-stage"] == "reused"
    assert again.headers["x-compaction-id"] == first.headers["x-compaction-id"]


def test_another_key_never_gets_a_conversations_summary(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    proxy = _proxy(start_app)
    messages = agent_session(seed=62, steps=80)
    alice = _post(proxy, "sk-alice", "small", messages)
    bob = _post(proxy, "sk-bob", "small", messages)  # the very same messages
    assert bob.headers["x-compaction-stage"] != "reused"
    assert bob.headers.get("x-compaction-id") != alice.headers["x-compaction-id"]
    assert len(upstream.chat_requests) == 2


def test_another_model_of_the_same_caller_forwards_its_own_conversation(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    proxy = _proxy(start_app)
    messages = agent_session(seed=63, steps=80)
    assert _post(proxy, "sk-alice", "small", messages).headers["x-compaction-stage"] != "none"
    big = _post(proxy, "sk-alice", "huge", messages)  # far under its trigger
    assert big.headers["x-compaction-stage"] == "none"
    assert "x-compaction-id" not in big.headers
    assert len(upstream.chat_requests[-1].json()["messages"]) == len(messages)
