"""Re-reads through the proxy: an agent fetches again a file whose output a
compaction pruned, and the metric, the session's figures and its dashboard
page count it. The app in-process (tests.proxy.inprocess)."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import httpx
import pytest

from compaction import session_key
from proxy.state.logs import REQUESTS
from proxy.state.metrics import MAX_LABEL_CHARS, MAX_TOOLS, Metrics
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy

#: A small window, the summarizer off: the pruner turns the old, long
#: read_file output into a brief, and that is the compaction applied next.
MODELS = {
    "gpt-4o": {
        "context_window": 16_000,
        "reserve_tokens": 2_000,
        "keep_recent_tokens": 1_500,
        "threshold": 6_000,
        "summarizer": "off",
    }
}
BIG_FILE = "\n".join(f"def function_{i}(x):\n    return x * {i}  # step {i}" for i in range(900))


def _round(call_id: str, name: str, arguments: dict[str, Any], output: str) -> list[dict[str, Any]]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def _history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Re-reads: find why function_7 is wrong."},
        *_round("c_big", "read_file", {"path": "src/big.py"}, BIG_FILE),
    ]
    for step in range(8):  # newer work, so the long read is old enough to prune
        messages += _round(f"c_{step}", "bash", {"command": f"ls dir{step}"}, f"file_{step}.py")
    return messages


def _chat(proxy: InProcessProxy, messages: list[dict[str, Any]]) -> httpx.Response:
    response = proxy.http.post(
        f"{proxy.url}/chat/completions", json={"model": "gpt-4o", "messages": messages}
    )
    assert response.status_code == 200, response.text
    return response


def _summary_when(proxy: InProcessProxy, session: str, requests: int) -> dict[str, Any]:
    """The session's figures once ``requests`` requests are recorded (written in batches)."""
    deadline = time.monotonic() + 10
    while True:
        found = proxy.http.get(f"{proxy.url}/compaction/sessions/{session}").json()
        summary = found.get("summary")
        if (summary and summary["requests"] >= requests) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _rereads_metric(proxy: InProcessProxy) -> dict[str, float]:
    text = proxy.http.get(proxy.url.removesuffix("/v1") + "/metrics").text
    found = re.findall(
        r'^compaction_proxy_rereads_total\{model="([^"]*)",tool="([^"]*)"\} (\S+)$', text, re.M
    )
    return {f"{model}/{tool}": float(value) for model, tool, value in found}


def test_an_agent_reading_a_pruned_file_again_is_counted_everywhere(
    start_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = start_app(models=MODELS)
    messages = _history()
    first = _chat(proxy, messages)
    assert first.headers["x-compaction-stage"] == "pruned"
    # The model answered the pruned request by reading the file again.
    messages += [
        *_round("c_again", "read_file", {"path": "src/big.py", "start_line": 7}, "def f"),
    ]
    with caplog.at_level(logging.INFO, logger=REQUESTS):
        second = _chat(proxy, messages)
    lines = [getattr(r, "fields", {}) for r in caplog.records if r.name == REQUESTS]
    assert [line.get("rereads") for line in lines] == [1]
    assert second.headers["x-compaction-stage"] in ("reused", "pruned")
    assert _rereads_metric(proxy) == {"gpt-4o/read_file": 1.0}

    session = session_key(messages)
    found = _summary_when(proxy, session, 2)
    assert found["summary"]["rereads"] == 1
    assert [r["rereads"] for r in found["requests"]] == [0, 1]

    page = proxy.http.get(proxy.url.removesuffix("/v1") + f"/ui/sessions/{session}").text
    card = re.search(r'id="rereads"[^>]*><div class="value">([^<]*)</div>', page)
    assert card is not None and card.group(1) == "1"
    assert "re-reads after compaction" in page

    # The next request carries no new tool round: nothing more is counted.
    messages += [{"role": "assistant", "content": "found it"}, {"role": "user", "content": "ok"}]
    _chat(proxy, messages)
    assert _summary_when(proxy, session, 3)["summary"]["rereads"] == 1
    assert _rereads_metric(proxy) == {"gpt-4o/read_file": 1.0}


def test_a_file_read_again_when_nothing_was_compacted_is_no_reread(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models={"gpt-4o": {"context_window": 128_000}})
    messages = _history()
    assert _chat(proxy, messages).headers["x-compaction-stage"] == "none"
    messages += _round("c_again", "read_file", {"path": "src/big.py"}, "def f")
    _chat(proxy, messages)
    found = _summary_when(proxy, session_key(messages), 2)
    assert found["summary"]["rereads"] == 0
    assert _rereads_metric(proxy) == {}


def test_the_tool_label_is_bounded_like_the_model_label() -> None:
    metrics = Metrics()
    for i in range(MAX_TOOLS + 5):
        metrics.record_rereads("m", {f"tool_{i}": 1})
    metrics.record_rereads("m", {"x" * (MAX_LABEL_CHARS + 1): 2, "": 1, "tool_0": 1})
    counted = {
        sample.labels["tool"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "compaction_proxy_rereads"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert len(counted) == MAX_TOOLS + 1
    assert counted["other"] == 5 + 2 + 1 and counted["tool_0"] == 2
