"""The window the client works with is the one the proxy budgets for: Claude
Code's default model, and its long-context beta header, against an Anthropic
upstream on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson

from config import load_settings
from tests.proxy.dialects.anthropic.upstream import AnthropicUpstream
from tests.proxy.inprocess import UPSTREAM_URL, InProcessProxy, RecordingTransport, running

BETA = "interleaved-thinking-2025-05-14,context-1m-2025-08-07"
_WORDS = "the parser reads each header line and keeps the numbers it finds there".split()


def _long_conversation(model: str, turns: int = 34) -> dict[str, Any]:
    """A Claude Code-sized conversation: about 175k tokens (just under 1 MiB)
    with Claude Code's 32k of output asked for: a 200k window must compact it."""
    messages = []
    for turn in range(turns):
        text = " ".join(_WORDS[(turn + i) % len(_WORDS)] for i in range(2_600))
        messages += [
            {"role": "user", "content": f"Question {turn}: {text}"},
            {"role": "assistant", "content": f"Answer {turn}: {text}"},
        ]
    messages.append({"role": "user", "content": "Go on."})
    return {
        "model": model,
        "max_tokens": 32_000,
        "system": "You are Claude Code.",
        "messages": messages,
    }


@contextmanager
def _proxy(**models: Any) -> Iterator[tuple[InProcessProxy, AnthropicUpstream]]:
    upstream = AnthropicUpstream()
    settings = load_settings(
        None,
        upstream={"anthropic_base_url": UPSTREAM_URL, "trust_env": False},
        store={"url": "memory://"},
        compaction={"summarizer": "extractive"},
        models=models,
    )
    with running(settings, RecordingTransport(app=upstream.app())) as proxy:
        yield proxy, upstream


def _send(proxy: InProcessProxy, body: dict[str, Any], beta: str | None) -> httpx.Response:
    headers = {
        "x-api-key": "sk-ant-test",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    if beta is not None:
        headers["anthropic-beta"] = beta
    response = proxy.http.post(f"{proxy.url}/messages", content=orjson.dumps(body), headers=headers)
    assert response.status_code == 200, response.text
    return response


def _preview(proxy: InProcessProxy, body: dict[str, Any], beta: str | None) -> dict[str, Any]:
    headers = {"x-api-key": "sk-ant-test"}
    if beta is not None:
        headers["anthropic-beta"] = beta
    chat = {"model": body["model"], "max_tokens": body["max_tokens"], "messages": body["messages"]}
    response = proxy.http.post(f"{proxy.url}/compaction/preview", json=chat, headers=headers)
    assert response.status_code == 200, response.text
    report: dict[str, Any] = response.json()["report"]
    return report


def test_claude_codes_default_model_with_the_1m_beta_is_forwarded_whole() -> None:
    body = _long_conversation("claude-opus-4-8")
    with _proxy() as (proxy, upstream):
        answered = _send(proxy, body, BETA)
        assert answered.headers["x-compaction-stage"] == "none"
        assert int(answered.headers["x-compaction-tokens-before"]) > 160_000
        assert upstream.message_requests[-1].json() == body


def test_the_1m_beta_header_lifts_a_200k_model_and_explicit_settings_still_win() -> None:
    body = _long_conversation("claude-sonnet-4-5")
    with _proxy() as (proxy, _):
        assert _send(proxy, body, None).headers["x-compaction-stage"] != "none"  # 200k
        assert _send(proxy, body, BETA).headers["x-compaction-stage"] == "none"
        report = _preview(proxy, body, BETA)
        assert (report["context_window"], report["window_source"]) == (1_000_000, "client")
        assert report["trigger"] <= report["input_limit"] < report["context_window"]
    with _proxy(**{"claude-sonnet-4-5": {"context_window": 100_000}}) as (proxy, _):
        assert _send(proxy, body, BETA).headers["x-compaction-stage"] != "none"
        report = _preview(proxy, body, BETA)
        assert (report["context_window"], report["window_source"]) == (100_000, "override")
