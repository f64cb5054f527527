"""A session's label is the first words its user typed, whatever client sent them."""

from __future__ import annotations

import time
from typing import Any

import pytest

from compaction import TokenCounter, read_conversation
from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.dialects.responses import RESPONSES
from proxy.flow.answered.record import TASK_CHARS, task_words
from tests.client_bodies import (
    QWEN_REQUEST,
    aider_body,
    claude_code_body,
    codex_body,
    qwen_code_body,
)
from tests.proxy.conftest import AppFactory

TASK = "Rename parse to read_input"
COUNTER = TokenCounter("gpt-4o")


def _qwen(typed: str) -> dict[str, Any]:
    if not QWEN_REQUEST.exists():
        pytest.skip(f"the recorded qwen-code body is not here: {QWEN_REQUEST}")
    return qwen_code_body(typed)


@pytest.mark.parametrize(
    ("dialect", "body"),
    [
        pytest.param(ANTHROPIC, claude_code_body, id="claude-code"),
        pytest.param(RESPONSES, codex_body, id="codex"),
        pytest.param(CHAT, aider_body, id="aider"),
        pytest.param(CHAT, _qwen, id="qwen-code"),
    ],
)
def test_the_label_is_what_the_user_typed_not_the_clients_boilerplate(
    dialect: Dialect, body: Any
) -> None:
    messages = dialect.to_engine(body(TASK)).messages
    assert task_words(messages) == TASK
    # From the request's reading, and its next request's, read against it:
    # where the client's context ends is known there.
    reading = read_conversation({}, messages, COUNTER, 2)
    assert task_words(messages, reading) == TASK
    grown = [*messages, {"role": "assistant", "content": "Done."}]
    assert task_words(grown, read_conversation({}, grown, COUNTER, 2, previous=reading)) == TASK


def test_a_long_task_is_cut_between_words() -> None:
    typed = "word " * 40
    label = task_words(CHAT.to_engine(aider_body(typed)).messages)
    assert label.endswith("…") and len(label) <= TASK_CHARS + 1
    assert "casual" not in label


def test_a_request_with_two_user_agents_is_labelled_with_the_first(start_app: AppFactory) -> None:
    """As a server reads a repeated single-value header: the first one counts."""
    proxy = start_app()
    answer = proxy.http.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]},
        headers=[("user-agent", "first-agent/1"), ("user-agent", "second-agent/2")],
    )
    assert answer.status_code == 200
    deadline = time.monotonic() + 15  # the recorder writes about once a second
    listed: list[dict[str, Any]] = []
    while not listed and time.monotonic() < deadline:
        listed = proxy.http.get("/v1/compaction/sessions").json()["data"]
        time.sleep(0.05)
    (session,) = listed
    assert session["user_agent"] == "first-agent/1"
