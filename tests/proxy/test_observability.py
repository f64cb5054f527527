"""/metrics and the request log."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from proxy.logs import REQUESTS, JsonFormatter, TextFormatter
from tests.proxy.conftest import ProxyFactory
from tests.proxy.servers import FakeUpstream
from tests.synthetic import agent_session


def _metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in /metrics")


def test_metrics_count_requests_compactions_tokens_and_upstream(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    url = start_proxy(models={"gpt-4o": {"context_window": 8192}})
    root = url.removesuffix("/v1")
    small = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    httpx.post(f"{url}/chat/completions", json=small)
    big = {"model": "gpt-4o", "messages": agent_session(seed=61, steps=120)}
    compacted = httpx.post(f"{url}/chat/completions", json=big, timeout=60)
    fake[0].behaviours = ["500"]
    httpx.post(f"{url}/chat/completions", json=small)

    response = httpx.get(f"{root}/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    stage = compacted.headers["x-compaction-stage"]
    assert _metric(text, 'compaction_proxy_requests_total{model="gpt-4o",stage="none"}') == 2
    assert _metric(text, f'compaction_proxy_requests_total{{model="gpt-4o",stage="{stage}"}}') == 1
    assert (
        _metric(text, f'compaction_proxy_compactions_total{{reason="threshold",stage="{stage}"}}')
        == 1
    )
    before = _metric(text, 'compaction_proxy_tokens_before_total{model="gpt-4o"}')
    after = _metric(text, 'compaction_proxy_tokens_after_total{model="gpt-4o"}')
    assert before > after > 0
    assert _metric(text, "compaction_proxy_summarizer_calls_total") >= 1
    assert _metric(text, 'compaction_proxy_upstream_errors_total{kind="5xx"}') == 1
    assert _metric(text, 'compaction_proxy_upstream_seconds_count{route="chat"}') >= 3
    assert _metric(text, 'compaction_proxy_store_seconds_count{operation="lookup"}') >= 2


def _record(fields: dict[str, object]) -> logging.LogRecord:
    record = logging.LogRecord(REQUESTS, logging.INFO, __file__, 1, "chat", None, None)
    record.fields = fields
    return record


def test_json_log_lines_carry_the_request_fields() -> None:
    line = JsonFormatter().format(_record({"model": "gpt-4o", "stage": "pruned", "ms": 3.5}))
    entry = json.loads(line)
    assert entry["message"] == "chat" and entry["level"] == "info"
    assert entry["model"] == "gpt-4o" and entry["stage"] == "pruned" and entry["ms"] == 3.5
    text = TextFormatter().format(_record({"model": "gpt-4o", "stage": "none"}))
    assert text.endswith("chat model=gpt-4o stage=none")


def test_log_content_is_off_unless_asked(
    start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "PRIVATE-WORDS-123"
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": secret}]}
    quiet = start_proxy()
    with caplog.at_level(logging.INFO, logger=REQUESTS):
        httpx.post(f"{quiet}/chat/completions", json=body)
    lines = [r for r in caplog.records if r.name == REQUESTS]
    assert lines and all(secret not in str(getattr(r, "fields", "")) for r in lines)
    caplog.clear()
    loud = start_proxy(server={"log_content": True})
    with caplog.at_level(logging.INFO, logger=REQUESTS):
        httpx.post(f"{loud}/chat/completions", json=body)
    assert any(secret in str(getattr(r, "fields", "")) for r in caplog.records)


def test_every_chat_request_gets_its_log_line_whoever_answered_it(
    start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The proxy's own 400s and 502/504s and a /compact, not only relayed answers."""
    url = start_proxy(compaction={"summarizer": "extractive"})
    unreachable = start_proxy(upstream={"base_url": "http://127.0.0.1:9/v1"})
    history = agent_session(seed=3, steps=20)
    sends = [
        (url, b"not json"),
        (url, json.dumps({"model": "gpt-4o", "messages": history}).encode()),
        (url, json.dumps({"model": "gpt-4o", "messages": [*history, _command()]}).encode()),
        (unreachable, json.dumps({"model": "gpt-4o", "messages": history[:3]}).encode()),
    ]
    statuses = []
    with caplog.at_level(logging.INFO, logger=REQUESTS):
        for base, body in sends:
            response = httpx.post(
                f"{base}/chat/completions",
                content=body,
                headers={"content-type": "application/json"},
                timeout=30,
            )
            statuses.append(response.status_code)
    assert statuses == [400, 200, 200, 502]
    fields = [getattr(r, "fields", {}) for r in caplog.records if r.name == REQUESTS]
    assert len(fields) == len(sends)
    assert fields[0]["status"] == 400 and fields[3]["status"] == 502
    assert fields[1]["upstream_status"] == 200
    assert fields[2]["status"] == 200 and fields[2]["reason"] == "manual"
    assert all("ms" in f for f in fields)


def _command() -> dict[str, str]:
    return {"role": "user", "content": "/compact keep the file names"}
