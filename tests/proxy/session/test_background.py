"""Compactions prepared in the background (proxy/session/background.py), through real servers.

The summarizer of the fake upstream answers after a delay, as a model would;
the client paces its turns as an agent does (a model's answer, a tool run).
The target: with a slow summarizer, over a 100-turn tool session at
a 16k window that condenses several times, at most one turn waits for the
summarizer, and the summarizer is asked at most once per compaction plus one
prepared for a compaction the session ends before needing. The delays are
scaled down tenfold from the bench's (a 4 s summarizer, turns 1 s apart) to
keep the suite fast; ``make bench`` runs them at full size.
"""

from __future__ import annotations

import random
import time
from typing import Any

import httpx
import orjson
import pytest

from tests.proxy.conftest import ProxyFactory
from tests.proxy.servers import FakeUpstream
from tests.synthetic import shell_step

WINDOW = 16_384
MODEL = "agent-model"
#: No pruning: every compaction of this session condenses, so each needs a summary.
PROFILE = {"context_window": WINDOW, "tool_result_chars": 1_000_000}
SUMMARY_DELAY = 0.4
TURN_PAUSE = 0.1
#: A turn that took this long waited for the summarizer; one that did not
#: takes a few milliseconds.
WAITED = SUMMARY_DELAY / 2
COMPACTED = ("pruned", "condensed", "truncated")


def _start(messages: str = "Make the test suite pass.") -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": messages},
    ]


def _post(client: httpx.Client, url: str, messages: list[dict[str, Any]]) -> httpx.Response:
    response = client.post(f"{url}/chat/completions", json={"model": MODEL, "messages": messages})
    assert response.status_code == 200, response.text
    return response


def _prefix(body: bytes) -> bytes:
    return orjson.dumps(orjson.loads(body)["messages"])[:-1]


def _events(url: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/compaction/events", params={"limit": 1000}, timeout=10)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["data"]
    return sorted(events, key=lambda event: event["created_at"])


def _wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_100_turn_session_waits_for_the_summarizer_at_most_once(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, _ = fake
    upstream.summary_delay = SUMMARY_DELAY
    url = start_proxy(models={MODEL: PROFILE})
    rng = random.Random(12)
    history = _start()
    stages: list[str] = []
    took: list[float] = []
    precomputed: list[str | None] = []
    with httpx.Client(timeout=60) as client:
        for i in range(100):
            history.extend(shell_step(rng, i))
            began = time.monotonic()
            response = _post(client, url, history)
            took.append(time.monotonic() - began)
            stages.append(response.headers["x-compaction-stage"])
            precomputed.append(response.headers.get("x-compaction-precomputed"))
            time.sleep(TURN_PAUSE)  # the model answers, the tool runs

    compactions = [i for i, stage in enumerate(stages) if stage in COMPACTED]
    waited = [i for i, seconds in enumerate(took) if seconds >= WAITED]
    calls = len(upstream.summary_requests)
    summaries = upstream.summary_rounds(gap=SUMMARY_DELAY / 4)
    prepared = [i for i in compactions if precomputed[i]]
    print(
        f"\n100 turns, summarizer {SUMMARY_DELAY} s: {len(compactions)} compactions at "
        f"{compactions} ({len(prepared)} prepared ahead), {summaries} summarizations "
        f"({calls} summarizer calls), "
        f"turns that waited: {waited} ({[round(took[i], 2) for i in waited]} s)"
    )
    assert len(compactions) >= 4, stages
    assert all(stages[i] == "condensed" for i in compactions), stages
    assert len(waited) <= 1, f"turns {waited} waited for the summarizer"
    assert summaries <= len(compactions) + 1
    assert calls <= 2 * (len(compactions) + 1)
    assert len(prepared) >= len(compactions) - 1

    # Between compactions the forwarded requests extend each other byte for
    # byte: a prepared compaction changes nothing until it is applied.
    sent = [r.body for r in upstream.chat_requests]
    between = [i for i in range(1, len(sent)) if stages[i] not in COMPACTED]
    broken = [i for i in between if not _prefix(sent[i]).startswith(_prefix(sent[i - 1]))]
    assert not broken, f"requests {broken} changed bytes already forwarded"


def _into_the_zone(
    send: Any,
    upstream: FakeUpstream,
    rng: random.Random,
    history: list[dict[str, Any]],
    asked: int = 0,
) -> None:
    """Grow ``history`` a turn at a time (``send`` posts it) until the proxy
    starts preparing a compaction: the upstream is asked for a summary (more
    than ``asked`` in all)."""
    for i in range(200):
        history.extend(shell_step(rng, len(history) + i))
        send(history)
        time.sleep(0.05)  # the agent's own pause; the preparation starts meanwhile
        if len(upstream.summary_requests) > asked:
            return
    raise AssertionError("the conversation never came near its trigger")


def _over_the_trigger(
    client: httpx.Client, url: str, rng: random.Random, history: list[dict[str, Any]]
) -> httpx.Response:
    for i in range(200):
        history.extend(shell_step(rng, len(history) + i))
        response = _post(client, url, history)
        if response.headers["x-compaction-stage"] in COMPACTED:
            return response
    raise AssertionError("the conversation never crossed its trigger")


def _prepared(url: str) -> bool:
    return any(e["type"] == "context.compacted" and e["background"] for e in _events(url))


def _prepared_session(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory, seed: int
) -> tuple[FakeUpstream, str, random.Random, list[dict[str, Any]]]:
    """A session grown until the proxy prepared its next compaction (summaries
    numbered: ``(summary #1)`` is the prepared one)."""
    upstream, _ = fake
    upstream.summary_text += "\n- (summary #{call})"
    url = start_proxy(models={MODEL: PROFILE})
    rng = random.Random(seed)
    history = _start()
    with httpx.Client(timeout=60) as client:
        _into_the_zone(lambda h: _post(client, url, h), upstream, rng, history)
    _wait_for(lambda: _prepared(url))
    return upstream, url, rng, history


def test_background_work_is_logged_like_foreground_and_applied_at_the_trigger(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, url, rng, history = _prepared_session(fake, start_proxy, 3)
    background = [e for e in _events(url) if e["background"]]
    assert [e["type"] for e in background] == [
        "compaction.queued",
        "compaction.started",
        "context.compacted",
    ]
    assert len(upstream.summary_requests) == 1
    with httpx.Client(timeout=60) as client:
        response = _over_the_trigger(client, url, rng, history)

    assert response.headers["x-compaction-stage"] == "condensed"
    assert response.headers["x-compaction-precomputed"] == background[-1]["checkpoint_id"]
    assert len(upstream.summary_requests) == 1, "the model was asked twice for one compaction"
    foreground = [e for e in _events(url) if not e["background"]]
    assert [e["type"] for e in foreground][-1] == "context.compacted"
    # The summary prepared ahead is what the upstream received.
    assert "(summary #1)" in upstream.chat_requests[-1].body.decode()


def test_a_prepared_compaction_of_an_edited_history_is_never_applied(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, url, rng, history = _prepared_session(fake, start_proxy, 4)
    stale = [e for e in _events(url) if e["type"] == "context.compacted"][-1]
    # The client rewrites an early step (an edited history, a rewind).
    history[3] = {**history[3], "content": "Step 0 was redone differently."}
    with httpx.Client(timeout=60) as client:
        response = _over_the_trigger(client, url, rng, history)

    assert response.headers["x-compaction-stage"] == "condensed"
    # What is applied was prepared for the edited history (or made now), never the stale one.
    assert response.headers.get("x-compaction-precomputed") != stale["checkpoint_id"]
    forwarded = upstream.chat_requests[-1].body.decode()
    assert "(summary #1)" not in forwarded, "the stale summary was applied"
    assert "(summary #2)" in forwarded
    assert "Step 0 was redone differently." in upstream.summary_prompts[-1]
    assert len(upstream.summary_requests) == 2


def test_the_crossing_turn_waits_for_a_preparation_in_flight_rather_than_asking_twice(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, _ = fake
    upstream.summary_delay = 1.0
    url = start_proxy(models={MODEL: PROFILE})
    rng = random.Random(5)
    history = _start()
    with httpx.Client(timeout=60) as client:
        _into_the_zone(lambda h: _post(client, url, h), upstream, rng, history)
        assert not _prepared(url)
        response = _over_the_trigger(client, url, rng, history)  # at once: still preparing

    assert response.headers["x-compaction-stage"] == "condensed"
    assert response.headers.get("x-compaction-precomputed")
    assert len(upstream.summary_requests) == 1


def test_a_client_leaving_does_not_cancel_the_preparation(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, _ = fake
    upstream.summary_delay = 0.5
    upstream.chunk_delay = 0.05
    url = start_proxy(models={MODEL: PROFILE})

    def abandon(history: list[dict[str, Any]]) -> None:
        """A streamed turn the client leaves after the first chunk."""
        body = {"model": MODEL, "messages": history, "stream": True}
        with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as stream:
            next(stream.iter_bytes())

    _into_the_zone(abandon, upstream, random.Random(6), _start())
    _wait_for(lambda: _prepared(url))
    assert len(upstream.summary_requests) == 1


def test_a_summary_edited_after_a_preparation_is_not_lost_to_it(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory
) -> None:
    upstream, url, rng, history = _prepared_session(fake, start_proxy, 9)
    with httpx.Client(timeout=60) as client:
        first = _over_the_trigger(client, url, rng, history)
        in_use = first.headers["x-compaction-id"]
        # The next compaction is prepared over the summary in use…
        before = len(upstream.summary_requests)
        _into_the_zone(lambda h: _post(client, url, h), upstream, rng, history, before)
        _wait_for(
            lambda: (
                sum(e["background"] and e["type"] == "context.compacted" for e in _events(url)) == 2
            )
        )
        stale = [e for e in _events(url) if e["type"] == "context.compacted"][-1]
        # …then the user corrects that summary.
        edit = client.put(
            f"{url}/compaction/checkpoints/{in_use}", json={"summary": "EDITED BY HAND"}
        )
        assert edit.status_code == 200, edit.text
        asked = len(upstream.summary_prompts)
        response = _over_the_trigger(client, url, rng, history)

    assert response.headers.get("x-compaction-precomputed") != stale["checkpoint_id"]
    # The summary made since folds in the edited text (a turn's note, asked
    # at the same time, may arrive after it).
    assert any("EDITED BY HAND" in prompt for prompt in upstream.summary_prompts[asked:])


@pytest.mark.parametrize("ahead", [True, False], ids=["prepared", "on-the-request-path"])
def test_the_dashboard_counts_what_summaries_cost_and_no_request_for_a_preparation(
    fake: tuple[FakeUpstream, str], start_proxy: ProxyFactory, ahead: bool
) -> None:
    if ahead:
        upstream, url, rng, history = _prepared_session(fake, start_proxy, 10)
    else:
        upstream = fake[0]
        url = start_proxy(models={MODEL: {**PROFILE, "precompute_share": 0}})
        rng, history = random.Random(10), _start()
    with httpx.Client(timeout=60) as client:
        _over_the_trigger(client, url, rng, history)
    asked = upstream.summary_requests
    # What the fake upstream's usage said each summary cost: its prompt count + 5.
    cost = sum((r.prompt_tokens or 0) + 5 for r in asked)
    sent = len(upstream.chat_requests)

    def totals() -> dict[str, Any]:
        answer = httpx.get(f"{url}/compaction/sessions", timeout=10).json()
        sessions: list[dict[str, Any]] = answer["data"]
        return sessions[0] if sessions else {}

    _wait_for(lambda: totals().get("requests") == sent)  # the figures are written in batches
    session = totals()
    assert session["summarizer_calls"] == len(asked) >= 1
    assert session["summarizer_tokens"] == cost > 0
    assert session["requests"] == sent  # the preparation is no request
