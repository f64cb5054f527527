"""Answers calibrate the proxy whatever shape their count comes in: a streamed
llama.cpp answer states its prompt only in its ``timings``."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.state.runtime import ProxyState
from tests.proxy.inprocess import RecordingTransport, running, settings_for, sse_reply

MODEL = "qwen2.5-coder-1.5b-instruct"
#: A prompt well above what calibrates (a chat template's tokens do not dominate it).
PROMPT = "Explain what this function does, line by line, and why. " * 150


def _llama_cpp_stream(prompt_n: int, cache_n: int) -> object:
    """llama.cpp server's stream: no ``usage`` event, its last chunk with ``timings``."""
    return sse_reply(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "It"}}]},
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "timings": {
                "cache_n": cache_n,
                "prompt_n": prompt_n,
                "prompt_ms": 812.4,
                "predicted_n": 1,
                "predicted_ms": 20.1,
            },
        },
    )


def _state_of(app: Any) -> ProxyState:
    """The running proxy's state, inside the middleware that wraps its app."""
    while not hasattr(app, "state"):
        app = app.app
    state: ProxyState = app.state.proxy
    return state


@pytest.mark.parametrize("cached", [0, 1_200])
def test_a_streamed_llama_cpp_answer_calibrates_from_its_timings(cached: int) -> None:
    transport = RecordingTransport()
    with running(settings_for(), transport) as proxy:
        state = _state_of(proxy.app)
        config = state.resolve(MODEL)
        estimate = state.counter(config).count_request(
            {"messages": [{"role": "user", "content": PROMPT}]}
        )
        upstream = round(estimate * 1.15)  # how much more its tokenizer counts
        transport.script(_llama_cpp_stream(prompt_n=upstream - cached, cache_n=cached))
        body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
        with proxy.http.stream("POST", f"{proxy.url}/chat/completions", json=body) as reply:
            assert reply.status_code == 200
            reply.read()
        learned = state.models.of(config).ratio
    assert learned == pytest.approx(1.15, abs=0.01)
