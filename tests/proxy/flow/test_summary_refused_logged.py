"""A model's summary the proxy does not use is said in the log, where an operator
reads: a warning line and a field of the request's line; its reason, which
quotes the conversation, only with ``--log-content``."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from compaction.summary.prompts import SUMMARY_SYSTEM_PROMPT
from proxy.state.logs import REQUESTS
from tests.proxy.inprocess import Asked, RecordingTransport, json_reply, running, settings_for
from tests.synthetic import agent_session

MODEL = "refusing-model"


def _reply(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
    }


def _summary_asked(asked: Asked) -> bool:
    messages = orjson.loads(asked.body).get("messages") or [{}]
    return str(messages[0].get("content", "")).startswith(SUMMARY_SYSTEM_PROMPT[:40])


@pytest.mark.parametrize("log_content", [False, True])
def test_a_model_summary_not_used_is_logged(
    caplog: pytest.LogCaptureFixture, log_content: bool
) -> None:
    caplog.set_level(logging.INFO)
    transport = RecordingTransport()
    # Not a summary: no sections, nothing of the span: refused by the checks.
    transport.script(*[json_reply(_reply("ok")) for _ in range(6)], when=_summary_asked)
    transport.script(json_reply(_reply("done")), when=lambda asked: not _summary_asked(asked))
    settings = settings_for(
        models={MODEL: {"context_window": 8_192, "summarizer": "llm", "recall": False}},
        server={"log_content": log_content},
    )
    messages = agent_session(seed=4, steps=40, output_chars=3_000)
    with running(settings, transport) as proxy:
        reply = proxy.http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert reply.status_code == 200
    assert reply.headers["x-compaction-stage"] == "condensed"
    assert any(_summary_asked(asked) for asked in transport.requests)
    warnings = [r for r in caplog.records if r.getMessage().startswith("model summary not used")]
    assert len(warnings) == 1
    found = warnings[0].fields  # type: ignore[attr-defined]
    assert found["model"] == MODEL and found["session"]
    assert ("why" in found) is log_content
    if log_content:
        assert "llm summary unusable" in found["why"]
    (line,) = [r for r in caplog.records if r.name == REQUESTS and r.getMessage() == "chat"]
    assert line.fields["summary_refused"] is True  # type: ignore[attr-defined]
