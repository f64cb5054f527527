"""A 300-turn agent session through the proxy: how often it compacts, and cache stability.

Each turn the agent appends a tool call and its (large) output and sends the
whole history, as real agents do. Between two compactions every forwarded
request must extend the previous one byte for byte (upstream prompt caches
keep hitting), and compactions must be rare: about the conversation's growth
divided by the room one compaction leaves, never one per request.
"""

from __future__ import annotations

import random
from typing import Any

import orjson

from compaction import TokenCounter
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.servers import FakeUpstream
from tests.synthetic import shell_step

TURNS = 300
COUNTER = TokenCounter("agent-model")
WINDOW = 16_384


def _messages_prefix_bytes(body: bytes) -> bytes:
    messages = orjson.loads(body)["messages"]
    return orjson.dumps(messages)[:-1]  # without the closing bracket


def run_session(proxy: InProcessProxy) -> dict[str, Any]:
    rng = random.Random(300)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Make the test suite pass."},
    ]
    stages: list[str] = []
    tokens_after: list[int] = []
    for i in range(TURNS):
        history.extend(shell_step(rng, i))
        response = proxy.http.post(
            f"{proxy.url}/chat/completions", json={"model": "agent-model", "messages": history}
        )
        assert response.status_code == 200, response.text
        stages.append(response.headers["x-compaction-stage"])
        tokens_after.append(int(response.headers["x-compaction-tokens-after"]))
    return {"stages": stages, "tokens_after": tokens_after, "history": history}


def test_long_session_compacts_rarely_and_keeps_requests_cache_stable(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    proxy = start_app(models={"agent-model": {"context_window": WINDOW}})
    outcome = run_session(proxy)
    sent = [r.body for r in upstream.chat_requests]
    assert len(sent) == TURNS

    # "reused": forwarded over the stored compaction, nothing compacted now.
    compactions = [i for i, s in enumerate(outcome["stages"]) if s not in ("none", "reused")]
    between = [i for i in range(1, TURNS) if outcome["stages"][i] in ("none", "reused")]
    extends = [
        i
        for i in between
        if _messages_prefix_bytes(sent[i]).startswith(_messages_prefix_bytes(sent[i - 1]))
    ]
    summary_calls = len(upstream.summary_requests)
    print(
        f"\n{TURNS} turns: {len(compactions)} compactions at {compactions}; "
        f"{summary_calls} summarizer calls; {len(extends)}/{len(between)} requests between "
        f"compactions extend the previous one byte for byte"
    )
    assert len(extends) == len(between), "a request between compactions broke the prefix"

    # Expected compactions: the growth of the conversation (what each turn
    # adds) over the room one compaction leaves (L minus the size after it).
    limit = WINDOW - WINDOW // 4
    history = outcome["history"]
    growth = COUNTER.count_request({"messages": history}) - COUNTER.count_request(
        {"messages": history[:2]}
    )
    after = [outcome["tokens_after"][i] for i in compactions]
    room = limit - sum(after) / len(after)
    expected = growth / room
    print(f"growth {growth:,} tokens, room {room:,.0f} → about {expected:.1f} compactions")
    assert len(compactions) <= 1.5 * expected + 1, "compacting more often than growth needs"
    assert summary_calls <= 2 * len(compactions)
    assert max(outcome["tokens_after"]) <= limit
