"""How a compaction prepared ahead ends once the model has answered
(proxy/session/ahead.py): stored, or superseded — never failed.

A small window with pruning on, and a session whose user turns carry system
reminders (kept verbatim beside every summary): some preparations condense
so little that the summary is refused as no shorter than what it replaces
(the compaction ends pruned), or condense nothing a later request can reuse.
Either way the model answered and nothing failed.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from tests.conftest import system, user
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.servers import FakeUpstream
from tests.proxy.session.conftest import proxy_state
from tests.synthetic import shell_step

MODEL = "gpt-4o"
TURNS = 80


def _quiet(proxy: InProcessProxy) -> None:
    """Until the preparations the last request started are over (a deadline, not a measure)."""

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while len(proxy_state(proxy).background):
            assert loop.time() < deadline, "a preparation never ended"
            await asyncio.sleep(0.005)

    proxy.http.portal.call(wait)


def _session(proxy: InProcessProxy, seed: int) -> None:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [system(), user("Fix the bug.")]
    for i in range(TURNS):
        if i % 4 == 3:
            messages += [
                {"role": "assistant", "content": "Done step."},
                {"role": "system", "content": "Reminder: " + "be careful " * rng.randint(1, 40)},
                user(f"Now please do thing {i} " + "and more " * rng.randint(1, 80)),
            ]
        messages += shell_step(rng, i)
        body = {"model": MODEL, "messages": messages}
        response = proxy.http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        # The agent's pause: the preparation this request started is over.
        _quiet(proxy)


def _events(proxy: InProcessProxy) -> list[dict[str, Any]]:
    response = proxy.http.get("/v1/compaction/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["data"]
    return sorted(events, key=lambda event: event["created_at"])


@pytest.mark.parametrize("seed", [1, 2])
def test_a_preparation_whose_summary_came_back_never_ends_failed(
    start_app: AppFactory, fake_upstream: FakeUpstream, seed: int
) -> None:
    proxy = start_app(models={MODEL: {"context_window": 4096}})
    _session(proxy, seed)
    events = _events(proxy)

    assert [e for e in events if e["type"] == "compaction.failed"] == []
    lifecycles: dict[str, list[str]] = {}
    for event in events:
        if event["background"]:
            lifecycles.setdefault(event["compaction_id"], []).append(event["type"])
    ends = [types[-1] for types in lifecycles.values()]
    assert "compaction.superseded" in ends  # the case is met
    for types in lifecycles.values():
        assert types[:2] == ["compaction.queued", "compaction.started"]
        assert types[2:] in (["context.compacted"], ["compaction.superseded"])
    superseded = [e for e in events if e["type"] == "compaction.superseded"]
    assert all(e["error"].startswith("not kept:") for e in superseded)


def test_a_span_prepared_for_nothing_is_not_prepared_again(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    proxy = start_app(models={MODEL: {"context_window": 4096}})
    _session(proxy, seed=1)
    events = _events(proxy)

    # Between two compactions on the request path (one span), the model is
    # asked for nothing at most once: a second preparation would get the same.
    per_span: list[int] = [0]
    for event in events:
        if not event["background"] and event["type"] == "context.compacted":
            per_span.append(0)
        elif event["type"] == "compaction.superseded":
            per_span[-1] += 1
    assert max(per_span) == 1, per_span
    metrics = proxy.http.get("/metrics").text
    assert 'compaction_proxy_background_jobs_total{outcome="spent"}' in metrics
