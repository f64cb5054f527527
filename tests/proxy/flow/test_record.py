"""A session's label is the first words its user typed, whatever client sent them."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.dialects.responses import RESPONSES
from proxy.flow.record import TASK_CHARS, task_words
from tests.client_bodies import (
    QWEN_REQUEST,
    aider_body,
    claude_code_body,
    codex_body,
    qwen_code_body,
)

TASK = "Rename parse to read_input"


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


def test_a_long_task_is_cut_between_words() -> None:
    typed = "word " * 40
    label = task_words(CHAT.to_engine(aider_body(typed)).messages)
    assert label.endswith("…") and len(label) <= TASK_CHARS + 1
    assert "casual" not in label
