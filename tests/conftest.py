"""Factories shared by the whole suite: small builders for chat messages."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import pytest

_ids = itertools.count(1)

# The proxy honours HTTP(S)_PROXY by default (upstream.trust_env); the suite's
# upstreams are on loopback and must be reached directly whatever the machine
# running it is configured with. The tests of the proxy support set their own.
for _name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
    os.environ.pop(_name, None)


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
