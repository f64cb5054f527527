"""The proxy's own errors come in the shape of the API the client speaks:
Anthropic's on its Messages routes (its SDK reads nothing else), OpenAI's
everywhere else — from the route, and from the guards in front of it."""

from __future__ import annotations

import anthropic
import pytest

from tests.proxy.conftest import AppFactory


def test_a_bad_messages_body_is_refused_in_anthropics_shape_and_its_sdk_reads_it(
    start_app: AppFactory,
) -> None:
    proxy = start_app()
    refused = proxy.http.post("/v1/messages", json={"model": "claude-x", "messages": "nope"})
    assert refused.status_code == 400
    body = refused.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    assert not proxy.transport.requests  # refused by the proxy itself
    client = anthropic.Anthropic(
        base_url=proxy.url.removesuffix("/v1"), api_key="sk-ant", http_client=proxy.http
    )
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(
            model="claude-x",
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"messages": "nope"},
        )
    # The SDK found its own shape: the error's type and message, as sent.
    assert raised.value.status_code == 400
    assert raised.value.body == body


def test_a_body_too_large_for_messages_is_refused_in_anthropics_shape(
    start_app: AppFactory,
) -> None:
    proxy = start_app(server={"max_body_bytes": 1_024})
    big = {
        "model": "claude-x",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "x" * 4_000}],
    }
    refused = proxy.http.post("/v1/messages", json=big)
    assert refused.status_code == 413
    assert refused.json() == {
        "type": "error",
        "error": {"type": "request_too_large", "message": refused.json()["error"]["message"]},
    }
    chat = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": big["messages"]})
    assert chat.status_code == 413 and "param" in chat.json()["error"]  # OpenAI's
