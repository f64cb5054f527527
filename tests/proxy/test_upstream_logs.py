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
