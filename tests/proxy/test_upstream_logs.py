"""The log lines of a 502 or 504 name the upstream that failed, never a secret."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.proxy.conftest import ProxyFactory
from tests.proxy.servers import FakeUpstream


def test_a_504_log_line_names_the_upstream_that_did_not_answer(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str], caplog: pytest.LogCaptureFixture
) -> None:
    upstream, base = fake
    upstream.behaviours = ["hang"]
    url = start_proxy(upstream={"read_timeout": 0.5})
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    with caplog.at_level(logging.INFO):
        answered = httpx.post(f"{url}/chat/completions", json=body, timeout=30)
    assert answered.status_code == 504
    assert base not in answered.text  # the client's body reveals nothing internal
    lines = [r for r in caplog.records if getattr(r, "fields", {}).get("status") == 504]
    assert len(lines) == 2  # the upstream's failure, and the request refused
    assert all(r.fields["upstream"] == base for r in lines)  # type: ignore[attr-defined]


def test_the_start_up_line_names_every_upstream_without_its_secrets() -> None:
    from config import load_settings
    from proxy.cli.server import startup_line

    settings = load_settings(
        None,
        upstream={
            "base_url": "https://user:sk-in-url@openai.example/v1?key=sk-in-query",
            "anthropic_base_url": "http://127.0.0.1:18902/v1",
        },
        models={"llama3.1:8b": {"upstream": "http://127.0.0.1:11434/v1"}},
    )
    line = startup_line(settings)
    assert "chat and responses https://openai.example/v1" in line
    assert "anthropic http://127.0.0.1:18902/v1" in line
    assert "llama3.1:8b http://127.0.0.1:11434/v1" in line
    assert "sk-in" not in line
