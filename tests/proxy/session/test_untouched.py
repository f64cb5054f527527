"""A request forwarded as it came without the engine's reading
(:func:`proxy.session.untouched.as_sent`): only where the full way would have
forwarded it too, with the same figures; just past its bound, the full way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction import TokenCounter, session_key
from config import load_settings
from proxy.flow import summaries
from proxy.flow.read import Call
from proxy.flow.services import Services
from proxy.session.conversation import compact_if_needed
from proxy.session.request import BareRequest, request_budget
from proxy.session.service import Conversations
from proxy.session.untouched import EARLY_SHARE, as_sent
from proxy.state.observability import Observability
from proxy.state.stores import MemoryStore
from proxy.upstream.service import Upstream
from tests.proxy.conftest import AppFactory
from tests.synthetic import agent_session

WINDOW = 8192


def _state(**profile: Any) -> tuple[Conversations, Any]:
    models = {"m": {"context_window": WINDOW, **profile}}
    settings = load_settings(None, store={"url": "memory://"}, models=models)
    state = Conversations(settings, MemoryStore(), Upstream(settings), Observability())
    return state, state.model_config("m")


@settings(deadline=None, max_examples=40)  # each example reads and counts a conversation
@given(
    steps=st.integers(min_value=1, max_value=14),
    summarizer=st.sampled_from(["extractive", "llm"]),
    max_tokens=st.sampled_from([0, 500, 3_000]),
    broken=st.booleans(),
)
def test_what_goes_as_it_came_is_what_the_full_way_forwards(
    steps: int, summarizer: str, max_tokens: int, broken: bool
) -> None:
    async def run() -> None:
        state, config = _state(summarizer=summarizer)
        messages = agent_session(seed=steps, steps=steps)
        if broken:  # a tool result answering no call: the full way repairs it
            messages = [*messages, {"role": "tool", "tool_call_id": "nowhere", "content": "x"}]
        body: dict[str, Any] = {"model": "m", "messages": messages}
        if max_tokens:
            body["max_tokens"] = max_tokens
        ask = BareRequest(body, messages, config)
        quick = await as_sent(state, ask)
        # A budget given is the full way's: the decision, on the store's answer.
        full = await compact_if_needed(state, ask, None, budget=request_budget(state, ask))
        if quick is not None:
            assert not broken
            assert full.stage == "none" and full.untouched and full.checkpoint is None
            assert quick.result == full.result
            assert (quick.messages, quick.untouched, quick.session) == (
                full.messages,
                full.untouched,
                full.session,
            )
            assert quick.headers() == full.headers()
        else:
            counted = TokenCounter(encoding="o200k_base").count_request(body)
            assert broken or counted >= request_budget(state, ask).trigger * EARLY_SHARE / 1.1
        await state.upstream.aclose()

    asyncio.run(run())


def _padded(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You help."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + "word " * 40})
        messages.append({"role": "assistant", "content": f"Answer {turn}."})
    return messages


def test_a_request_just_past_its_bound_goes_the_full_way() -> None:
    async def run() -> None:
        state, config = _state(summarizer="extractive")
        bound = request_budget(state, BareRequest({}, [], config)).trigger * EARLY_SHARE
        counter = state.counter(config)
        turns = 1
        while counter.count_request({"messages": _padded(turns + 1)}) < bound:
            turns += 1
        under, over = _padded(turns), _padded(turns + 1)
        assert await as_sent(state, BareRequest({"messages": under}, under, config)) is not None
        assert await as_sent(state, BareRequest({"messages": over}, over, config)) is None
        full = await compact_if_needed(state, BareRequest({"messages": over}, over, config), None)
        assert full.stage == "none"  # still far under the trigger: the full way forwards it
        await state.upstream.aclose()

    asyncio.run(run())


def test_a_compact_now_waiting_sends_every_request_the_full_way() -> None:
    async def run() -> None:
        state, config = _state()
        messages = _padded(1)
        assert (
            await as_sent(state, BareRequest({"messages": messages}, messages, config)) is not None
        )
        state.compact_now.add(("someone", "another session"))
        assert await as_sent(state, BareRequest({"messages": messages}, messages, config)) is None
        await state.upstream.aclose()

    asyncio.run(run())


def test_a_small_conversation_compacted_by_hand_is_forwarded_over_its_checkpoint(
    start_app: AppFactory,
) -> None:
    """Its later requests are still small: the store, asked by session, says a
    checkpoint may apply, and the full way applies it."""
    proxy = start_app(
        models={"gpt-4o": {"context_window": 32_000, "keep_recent_tokens": 500}},
        compaction={"summarizer": "extractive"},
    )
    messages = agent_session(seed=3, steps=8, output_chars=600)
    asked = [*messages, {"role": "user", "content": "/compact"}]
    compacted = proxy.http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": asked})
    assert compacted.status_code == 200, compacted.text
    assert compacted.headers["x-compaction-reason"] == "manual"
    made = compacted.headers["x-compaction-id"]
    reply = compacted.json()["choices"][0]["message"]["content"]
    later = [*asked, {"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
    answer = proxy.http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": later})
    assert answer.status_code == 200, answer.text
    assert int(answer.headers["x-compaction-tokens-before"]) < 32_000 * EARLY_SHARE / 2
    assert answer.headers["x-compaction-stage"] == "reused"
    assert answer.headers["x-compaction-id"] == made
    assert session_key(later) == session_key(messages)


def test_a_small_request_builds_no_summarizer(
    start_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The llm summarizer (the default) is built only for a request that goes
    the full way: a small one is answered before it would be."""
    built: list[Call] = []
    summarizer = summaries.summarizer_for

    def recording(services: Services, call: Call) -> Any:
        built.append(call)
        return summarizer(services, call)

    # Where the handler calls it from.
    monkeypatch.setattr("proxy.flow.exchange.summarizer_for", recording)
    proxy = start_app(models={"gpt-4o": {"context_window": 128_000, "summarizer": "llm"}})
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello?"}]}
    answer = proxy.http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-compaction-stage"] == "none"
    assert built == []
