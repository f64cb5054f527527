"""Factories shared by the whole suite: small builders for chat messages, and the
one recording fake summarizer."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
from hypothesis import settings

from compaction.summary.prompts import TURN_PREFIX_SYSTEM_PROMPT

_ids = itertools.count(1)

# The proxy honours HTTP(S)_PROXY by default (upstream.trust_env); the suite's
# upstreams are on loopback and must be reached directly whatever the machine
# running it is configured with. The tests of the proxy support set their own.
for _name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
    os.environ.pop(_name, None)

# CI runs every property test on the same examples, so a run that lands or fails
# says something about the change and not about the draw; a developer's run
# keeps exploring (and remembers what it found in .hypothesis/).
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


def system(text: str = "You are a helpful assistant.") -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def tool_group(
    name: str, arguments: dict[str, Any], *results: str, call_id: str | None = None
) -> list[dict[str, Any]]:
    """An assistant message calling ``name`` once per result, followed by the results."""
    calls, replies = [], []
    for result in results or ("ok",):
        cid = call_id if call_id and len(results) <= 1 else f"call_{next(_ids)}"
        calls.append(
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        )
        replies.append({"role": "tool", "tool_call_id": cid, "content": result})
    return [{"role": "assistant", "content": None, "tool_calls": calls}, *replies]


@pytest.fixture
def messages_factory() -> Any:
    """The builders above, for tests that prefer a fixture."""
    import types

    return types.SimpleNamespace(
        system=system, user=user, assistant=assistant, tool_group=tool_group
    )


#: What :class:`RecordingSummarizer` answers by default: a summary with the
#: sections the condenser asks for, naming a command of the synthetic agent
#: sessions (a summary naming none of its span's paths, commands or errors is
#: not taken).
SUMMARY_REPLY = (
    "## Goal\n- Fix the parser\n\n## Progress\n### Done\n- Read the modules\n\n"
    "## Key Decisions\n- Keep the grammar\n\n## Next Steps\n- Run the tests with `pytest -q`"
)
#: …and to a request for a turn-prefix note (the first steps of the current turn).
PREFIX_REPLY = (
    "## Done So Far\n- Read the modules\n\n## Context Needed Next\n- The docs, `pytest -q`"
)


class SummaryCall(NamedTuple):
    """One call of the summarizer: the prompt (a copy) and the budget it was given."""

    messages: list[dict[str, Any]]
    max_tokens: int


class RecordingSummarizer:
    """The fake summarizer the suite shares: answers ``reply`` (a text, or a
    function of the call's number, 1, 2, …) or raises ``error``; records every
    call, and the thread and event loop each ran on.

    With the default reply, a turn-prefix request gets :data:`PREFIX_REPLY`,
    as a model asked that prompt answers.
    """

    def __init__(
        self,
        reply: str | Callable[[int], str] = SUMMARY_REPLY,
        *,
        error: BaseException | None = None,
    ) -> None:
        self.reply = reply
        self.error = error
        self.history: list[SummaryCall] = []
        #: Per call: the thread it ran on, and the loop running there.
        self.threads: list[int] = []
        self.loops: list[asyncio.AbstractEventLoop] = []

    async def __call__(self, messages: list[dict[str, Any]], max_tokens: int) -> str:
        self.history.append(SummaryCall(copy.deepcopy(messages), max_tokens))
        self.threads.append(threading.get_ident())
        self.loops.append(asyncio.get_running_loop())
        if self.error is not None:
            raise self.error
        if self.reply == SUMMARY_REPLY and messages[0]["content"] == TURN_PREFIX_SYSTEM_PROMPT:
            return PREFIX_REPLY
        return self.reply(len(self.history)) if callable(self.reply) else self.reply

    @property
    def calls(self) -> int:
        return len(self.history)

    @property
    def budgets(self) -> list[int]:
        return [call.max_tokens for call in self.history]

    def prompt_text(self, call: int = -1) -> str:
        """The user turn of a call's prompt: the span to summarize, as the model reads it."""
        return str(self.history[call].messages[1]["content"])


@pytest.fixture
def summarizer() -> RecordingSummarizer:
    return RecordingSummarizer()
