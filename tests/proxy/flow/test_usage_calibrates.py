"""Answers calibrate the proxy whatever shape their count comes in: a streamed
llama.cpp answer states its prompt only in its ``timings``; a count below the
text that was sent (a chat format that drops tool messages) teaches nothing;
and what one caller's answers teach is that caller's."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.edge.access import owner_of
from proxy.session.service import Conversations
from tests.proxy.inprocess import (
    RecordingTransport,
    Reply,
    json_reply,
    running,
    services_of_app,
    settings_for,
    sse_reply,
)

MODEL = "qwen2.5-coder-1.5b-instruct"
#: A prompt well above what calibrates (a chat template's tokens do not dominate it).
PROMPT = "Explain what this function does, line by line, and why. " * 150


def _llama_cpp_stream(prompt_n: int, cache_n: int) -> Reply:
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


def _state_of(app: Any) -> Conversations:
    """The conversations service of the running app."""
    return services_of_app(app).conversations


@pytest.mark.parametrize("cached", [0, 1_200])
def test_a_streamed_llama_cpp_answer_calibrates_from_its_timings(cached: int) -> None:
    transport = RecordingTransport()
    with running(settings_for(), transport) as proxy:
        state = _state_of(proxy.app)
        config = state.model_config(MODEL)
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


def _answer(prompt_tokens: int) -> Reply:
    return json_reply(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "It"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1},
        }
    )


def test_a_count_well_below_what_was_sent_leaves_the_ratio_alone() -> None:
    """The server counted 2,469 of what we estimated at 3,732 (its chat format
    dropped the tool messages): the ratio does not fall to its floor, which
    would send the next request uncompacted."""
    transport = RecordingTransport()
    with running(settings_for(), transport) as proxy:
        state = _state_of(proxy.app)
        config = state.model_config(MODEL)
        messages = [{"role": "user", "content": PROMPT}]
        estimate = state.counter(config).count_request({"messages": messages})
        counted = round(estimate * 2_469 / 3_732)
        transport.script(_answer(counted))
        body = {"model": MODEL, "messages": messages}
        assert proxy.http.post(f"{proxy.url}/chat/completions", json=body).status_code == 200
        assert state.models.ratio(config) == 1.0
        assert state.models.answered(config) == counted  # what it answered, as it counted


def test_one_callers_answers_teach_that_caller_and_not_another() -> None:
    """Two keys on one model: the upstream counts one caller's requests at twice
    our estimate, request after request; the other caller's ratio stays its own."""
    transport = RecordingTransport()
    with running(settings_for(), transport) as proxy:
        state = _state_of(proxy.app)
        config = state.model_config(MODEL)
        messages = [{"role": "user", "content": PROMPT}]
        estimate = state.counter(config).count_request({"messages": messages})
        body = {"model": MODEL, "messages": messages}
        url = f"{proxy.url}/chat/completions"
        honest, lying = {"Authorization": "Bearer sk-honest"}, {"Authorization": "Bearer sk-other"}
        transport.script(_answer(round(estimate * 1.1)))
        assert proxy.http.post(url, json=body, headers=honest).status_code == 200
        for _ in range(32):
            transport.script(_answer(2 * estimate))
            assert proxy.http.post(url, json=body, headers=lying).status_code == 200
        assert state.models.ratio(config, owner_of(lying.items())) == pytest.approx(2.0)
        assert state.models.ratio(config, owner_of(honest.items())) == pytest.approx(1.1, abs=0.01)
