"""/metrics and the request log."""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from compaction import TokenCounter, session_key
from proxy.state.logs import REQUESTS, JsonFormatter, TextFormatter
from proxy.state.stores import EMPTY_STREAM_STATUS
from proxy.upstream.transport import ConnectFailed
from tests.proxy.conftest import AppFactory, ProxyFactory
from tests.proxy.inprocess import RecordingTransport, failure
from tests.proxy.servers import FakeUpstream
from tests.proxy.session.real_servers import _post, _prepared_session
from tests.synthetic import agent_session, shell_step


def _metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in /metrics")


def test_metrics_count_requests_compactions_tokens_and_upstream(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    proxy = start_app(models={"gpt-4o": {"context_window": 8192}})
    root = proxy.url.removesuffix("/v1")
    small = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    proxy.http.post(f"{proxy.url}/chat/completions", json=small)
    big = {"model": "gpt-4o", "messages": agent_session(seed=61, steps=120)}
    compacted = proxy.http.post(f"{proxy.url}/chat/completions", json=big)
    fake_upstream.behaviours = ["500"]
    proxy.http.post(f"{proxy.url}/chat/completions", json=small)

    response = proxy.http.get(f"{root}/metrics")
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
    # The memory store knows its checkpoints: its lookups are answered at once,
    # counted apart from the timed store calls.
    assert _metric(text, 'compaction_proxy_store_answered_at_once_total{operation="lookup"}') >= 2
    assert 'compaction_proxy_store_seconds_count{operation="lookup"}' not in text


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
    start_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "PRIVATE-WORDS-123"
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": secret}]}
    quiet = start_app()
    with caplog.at_level(logging.INFO, logger=REQUESTS):
        quiet.http.post(f"{quiet.url}/chat/completions", json=body)
    lines = [r for r in caplog.records if r.name == REQUESTS]
    assert lines and all(secret not in str(getattr(r, "fields", "")) for r in lines)
    caplog.clear()
    loud = start_app(server={"log_content": True})
    with caplog.at_level(logging.INFO, logger=REQUESTS):
        loud.http.post(f"{loud.url}/chat/completions", json=body)
    assert any(secret in str(getattr(r, "fields", "")) for r in caplog.records)


def test_every_chat_request_gets_its_log_line_whoever_answered_it(
    start_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The proxy's own 400s and 502/504s and a /compact, not only relayed answers."""
    proxy = start_app(compaction={"summarizer": "extractive"})
    # No connection can be opened: what the transport raises for a closed port.
    refusing = RecordingTransport()
    refusing.script(failure(ConnectFailed("no connection could be opened")))
    unreachable = start_app(transport=refusing)
    history = agent_session(seed=3, steps=20)
    sends = [
        (proxy, b"not json"),
        (proxy, json.dumps({"model": "gpt-4o", "messages": history}).encode()),
        (proxy, json.dumps({"model": "gpt-4o", "messages": [*history, _command()]}).encode()),
        (unreachable, json.dumps({"model": "gpt-4o", "messages": history[:3]}).encode()),
    ]
    statuses = []
    with caplog.at_level(logging.INFO, logger=REQUESTS):
        for app, body in sends:
            response = app.http.post(
                f"{app.url}/chat/completions",
                content=body,
                headers={"content-type": "application/json"},
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


# --- the dashboard's totals and /metrics, over one scripted run ---------------

AGENT, PLAIN, SMALL = "agent-model", "plain-model", "small-model"
#: No pruning: every compaction condenses, so each asks the summarizer.
PROFILE = {"context_window": 16_384, "tool_result_chars": 1_000_000}


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of /metrics by its name."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def _sum(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> int:
    return int(
        sum(
            value
            for found, value in samples.get(name, [])
            if all(found.get(k) == v for k, v in labels.items())
        )
    )


def _by(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, label: str) -> dict:
    counts: dict[str, int] = {}
    for found, value in samples.get(name, []):
        if value:
            counts[found[label]] = counts.get(found[label], 0) + int(value)
    return counts


def _grown(counter: TokenCounter, rng: random.Random, low: int) -> list[dict[str, Any]]:
    """A fresh tool session of at least ``low`` tokens, a step at a time."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Task {rng.random()}: make the build green."},
    ]
    while counter.count_request({"messages": messages}) < low:
        messages.extend(shell_step(rng, len(messages)))
    return messages


def test_the_overview_and_metrics_count_the_same_run(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    """Errors, an overflow, a compaction prepared in the background and applied,
    one made on the request path and a /compact: every total the overview shows
    is the figure /metrics gives for the same run."""
    upstream = fake_upstream
    proxy = start_app(
        models={
            AGENT: PROFILE,
            PLAIN: {**PROFILE, "precompute_share": 0},
            SMALL: {"context_window": 8192, "precompute_share": 0},
        }
    )
    root = proxy.url.removesuffix("/v1")
    rng = random.Random(19)
    counter = TokenCounter("gpt-4o")

    def post(model: str, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
        body = {"model": model, "messages": messages, **extra}
        return proxy.http.post(f"{proxy.url}/chat/completions", json=body)

    # A session whose compaction is prepared in the background, then applied.
    history = _grown(counter, rng, 0)
    for step in range(300):
        history.extend(shell_step(rng, step))
        if post(AGENT, history).headers.get("x-compaction-precomputed"):
            break
        time.sleep(0.03)  # the agent's pause: the preparation runs meanwhile
    else:
        raise AssertionError("no compaction prepared ahead was applied")
    # A compaction on the request path, then a /compact of it.
    foreground = agent_session(seed=62, steps=60)
    assert post(PLAIN, foreground).headers["x-compaction-stage"] == "condensed"
    command = [*foreground, {"role": "user", "content": "/compact"}]
    assert post(PLAIN, command).headers["x-compaction-reason"] == "manual"
    # An overflow: the upstream's window is smaller than the proxy was told.
    upstream.window = 3_000
    overflowing = _grown(counter, rng, 4_000)
    retried = post(SMALL, overflowing)
    assert retried.status_code == 200 and retried.headers["x-compaction-reason"] == "overflow"
    upstream.window = None
    # An error relayed, and a stream that ends before its first event.
    small = [{"role": "user", "content": "hi"}]
    upstream.behaviours = ["500"]
    assert post(AGENT, small).status_code == 500
    upstream.behaviours = ["empty-stream"]
    assert "upstream_empty" in post(AGENT, small, stream=True).text

    samples = _samples(proxy.http.get(f"{root}/metrics").text)
    requests = _sum(samples, "compaction_proxy_requests_total")
    deadline = time.monotonic() + 10
    while True:  # the figures are written in batches, off the request path
        totals = proxy.http.get(f"{proxy.url}/compaction/sessions").json()["totals"]
        if totals["requests"] == requests or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    assert _sum(samples, "compaction_proxy_background_jobs_total", outcome="prepared") >= 1
    assert totals["requests"] == requests
    assert totals["compactions"] == _sum(samples, "compaction_proxy_compactions_total")
    assert totals["stages"] == _by(samples, "compaction_proxy_compactions_total", "stage")
    assert totals["reasons"] == _by(samples, "compaction_proxy_compactions_total", "reason")
    assert set(totals["reasons"]) == {"threshold", "overflow", "manual"}
    errors = _by(samples, "compaction_proxy_upstream_errors_total", "kind")
    # The overflow answer (retried), the 500, the empty stream: each once, in both.
    assert errors == {"4xx": 1, "5xx": 1, "empty": 1}
    assert totals["upstream_errors"] == sum(errors.values())
    assert totals["overflow_retries"] == _sum(samples, "compaction_proxy_overflow_retries_total")
    assert totals["overflow_retries"] == 1
    assert totals["summarizer_calls"] == _sum(samples, "compaction_proxy_summarizer_calls_total")
    assert totals["summarizer_calls"] == len(upstream.summary_requests)
    sent = _sum(samples, "compaction_proxy_tokens_after_total")
    assert totals["saved"] == _sum(samples, "compaction_proxy_tokens_before_total") - sent > 0
    # What it cost: the answers' usage, the summaries (those prepared in the
    # background included) and the estimate without compaction.
    money = totals["money"]
    parts = _by(samples, "compaction_proxy_prompt_tokens_total", "part")
    assert money["prompt_tokens"] == sum(parts.values()) > 0
    assert money["cache_read_tokens"] == parts.get("cache_read", 0)
    assert money["cache_write_tokens"] == parts.get("cache_write", 0)
    assert money["output_tokens"] == _sum(samples, "compaction_proxy_output_tokens_total")
    summarized = _by(samples, "compaction_proxy_summarizer_tokens_total", "part")
    assert money["summarizer_prompt_tokens"] == summarized["prompt"] > 0
    assert money["summarizer_output_tokens"] == summarized.get("output", 0)
    assert money["cost"] == pytest.approx(_sum(samples, "compaction_proxy_cost_total"))
    assert money["cost_without"] == pytest.approx(
        _sum(samples, "compaction_proxy_cost_without_compaction_total")
    )


def test_an_empty_stream_is_counted_logged_and_recorded_as_an_upstream_error(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = fake_upstream
    proxy = start_app()
    messages = [{"role": "user", "content": "An empty stream, please."}]
    upstream.behaviours = ["empty-stream"]
    with caplog.at_level(logging.INFO, logger=REQUESTS):
        answer = proxy.http.post(
            f"{proxy.url}/chat/completions",
            json={"model": "gpt-4o", "messages": messages, "stream": True},
        )
    assert "upstream_empty" in answer.text
    [line] = [getattr(r, "fields", {}) for r in caplog.records if r.name == REQUESTS]
    assert line["upstream_status"] == EMPTY_STREAM_STATUS and line["error"] == "upstream_empty"
    text = proxy.http.get(f"{proxy.url.removesuffix('/v1')}/metrics").text
    assert _metric(text, 'compaction_proxy_upstream_errors_total{kind="empty"}') == 1
    session = session_key(messages)
    deadline = time.monotonic() + 10
    while True:
        found = proxy.http.get(f"{proxy.url}/compaction/sessions/{session}").json()
        # A 404 until the first figure is written: the session exists from then.
        if found.get("requests") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    [record] = found["requests"]
    assert (record["status"], record["error"], record["upstream_errors"]) == (
        EMPTY_STREAM_STATUS,
        "upstream_empty",
        1,
    )
    assert found["summary"]["upstream_errors"] == 1


def test_summarizer_failures_count_only_summaries_the_model_was_asked_for_and_failed(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, url, rng, history = _prepared_session(fake, start_proxy, 3)
    # Far past the prepared span: what follows it is digested without the model.
    for step in range(20):
        history.extend(shell_step(rng, len(history) + step))
    with httpx.Client(timeout=60) as client:
        applied = _post(client, url, history)
    assert applied.headers.get("x-compaction-precomputed"), "precondition: prepared and applied"
    metrics = f"{url.removesuffix('/v1')}/metrics"
    assert _metric(httpx.get(metrics).text, "compaction_proxy_summarizer_failures_total") == 0
    # A model that answers 500: a failure (a preparation that may follow fails too).
    upstream.summary_reply = "error"
    failing = agent_session(seed=64, steps=60)
    asked = len(upstream.summary_requests)
    with httpx.Client(timeout=60) as client:
        assert _post(client, url, failing).headers["x-compaction-stage"] == "condensed"
    assert len(upstream.summary_requests) > asked
    assert _metric(httpx.get(metrics).text, "compaction_proxy_summarizer_failures_total") >= 1
