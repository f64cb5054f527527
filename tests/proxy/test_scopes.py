"""Checkpoints are scoped: another caller, another model or another window never
reuses a conversation's stored compaction: it holds one caller's words, sized for one window."""

from __future__ import annotations

from typing import Any

import httpx

from tests.proxy.conftest import ProxyFactory
from tests.proxy.servers import FakeUpstream
from tests.synthetic import agent_session

MODELS = {"small": {"context_window": 8_192}, "huge": {"context_window": 1_000_000}}


def _post(url: str, key: str, model: str, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions",
        json={"model": model, "messages": messages},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


def _proxy(start_proxy: ProxyFactory) -> str:
    return start_proxy(models=MODELS, compaction={"summarizer": "extractive"})


def test_the_same_caller_reuses_its_compaction(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    url = _proxy(start_proxy)
    messages = agent_session(seed=61, steps=80)
    first = _post(url, "sk-alice", "small", messages)
    assert first.headers["x-compaction-stage"] in ("condensed", "truncated")
    again = _post(url, "sk-alice", "small", [*messages, {"role": "user", "content": "next?"}])
    assert again.headers["x-compaction-stage"] == "reused"
    assert again.headers["x-compaction-id"] == first.headers["x-compaction-id"]


def test_another_key_never_gets_a_conversations_summary(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, _ = fake
    url = _proxy(start_proxy)
    messages = agent_session(seed=62, steps=80)
    alice = _post(url, "sk-alice", "small", messages)
    bob = _post(url, "sk-bob", "small", messages)  # the very same messages
    assert bob.headers["x-compaction-stage"] != "reused"
    assert bob.headers.get("x-compaction-id") != alice.headers["x-compaction-id"]
    assert len(upstream.chat_requests) == 2


def test_another_model_of_the_same_caller_forwards_its_own_conversation(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, _ = fake
    url = _proxy(start_proxy)
    messages = agent_session(seed=63, steps=80)
    assert _post(url, "sk-alice", "small", messages).headers["x-compaction-stage"] != "none"
    big = _post(url, "sk-alice", "huge", messages)  # far under its trigger
    assert big.headers["x-compaction-stage"] == "none"
    assert "x-compaction-id" not in big.headers
    assert len(upstream.chat_requests[-1].json()["messages"]) == len(messages)
