"""Steering a conversation through the JSON routes: edit a summary and
see the next request forward it; switch compaction off for one session; add
instructions to its summaries; compact it now. Real servers on loopback."""

from __future__ import annotations

import random
import time
from typing import Any

import httpx
import pytest

from compaction import SUMMARY_MARKER, parse_summary, session_key
from tests.proxy.conftest import ProxyFactory
from tests.proxy.servers import FakeUpstream
from tests.synthetic import agent_session, shell_step

MODELS = {"gpt-4o": {"context_window": 8192}}
ALICE, BOB = "sk-alice-0123456789", "sk-bob-9876543210"
ADMIN = "admin-secret-4242"


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _chat(url: str, messages: list[dict[str, Any]], key: str = ALICE) -> httpx.Response:
    body = {"model": "gpt-4o", "messages": messages}
    response = httpx.post(f"{url}/chat/completions", json=body, headers=_auth(key), timeout=60)
    assert response.status_code == 200, response.text
    return response


def _opened(
    url: str, messages: list[dict[str, Any]], key: str = ALICE, model: str = "gpt-4o"
) -> str:
    """The session of ``messages``, once the proxy has recorded a request of it:
    until then steering it is a 404, as for any session the caller has nothing of."""
    session = session_key(messages)
    first = {"model": model, "messages": messages[:2]}  # the system prompt and the task
    httpx.post(f"{url}/chat/completions", json=first, headers=_auth(key), timeout=60)
    for _ in range(400):  # figures are written about a second after their request
        found = httpx.get(f"{url}/compaction/sessions/{session}", headers=_auth(key))
        if found.status_code == 200:
            return session
        time.sleep(0.025)
    raise AssertionError(f"session {session} was never recorded")


def _summary_of(messages: list[dict[str, Any]]) -> str:
    """The main summary (a turn-prefix note may follow it)."""
    found = [m["content"] for m in messages if str(m.get("content", "")).startswith(SUMMARY_MARKER)]
    assert found, "a summary is forwarded"
    text: str = found[0]
    return text


def _events(url: str, key: str = ALICE) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/compaction/events", headers=_auth(key))
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def test_an_edited_summary_is_what_the_next_request_forwards(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    url = start_proxy(models=MODELS)
    messages = agent_session(seed=1, steps=60, task="Edit test: fix the parser.")
    first = _chat(url, messages)
    checkpoint_id = first.headers["x-compaction-id"]
    before = _summary_of(upstream.chat_requests[-1].json()["messages"])
    assert "Make the failing test" in before  # the fake summarizer's text

    edited = "## Goal\n- Keep the frobnicator at 42 rpm.\n\n## Next Steps\n- Ship it."
    response = httpx.put(
        f"{url}/compaction/checkpoints/{checkpoint_id}",
        json={"summary": edited},
        headers=_auth(ALICE),
    )
    assert response.status_code == 200, response.text
    assert response.json()["id"] == checkpoint_id

    follow_up = [
        *messages,
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Next?"},
    ]
    second = _chat(url, follow_up)
    assert second.headers["x-compaction-id"] == checkpoint_id
    forwarded = _summary_of(upstream.chat_requests[-1].json()["messages"])
    assert forwarded.startswith(SUMMARY_MARKER)
    assert parse_summary({"role": "user", "content": forwarded}).body == edited  # type: ignore[union-attr]
    assert "Make the failing test" not in forwarded

    [event] = [e for e in _events(url) if e["type"] == "checkpoint.edited"]
    assert event["checkpoint_id"] == checkpoint_id
    assert "Make the failing test" in event["previous_summary"]  # the old text is kept


def test_an_edited_summary_keeps_the_file_lists_out_of_its_body_and_intact_in_the_message(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    url = start_proxy(models=MODELS)
    messages = agent_session(seed=4, steps=60, task="Edit test: the file lists stay.")
    first = _chat(url, messages)
    checkpoint_id = first.headers["x-compaction-id"]
    made = parse_summary(
        {"role": "user", "content": _summary_of(upstream.chat_requests[-1].json()["messages"])}
    )
    assert made is not None and made.files, "the session read and changed files"

    target = f"{url}/compaction/checkpoints/{checkpoint_id}"
    edited = "## Goal\n- Only the goal is rewritten."
    response = httpx.put(target, json={"summary": edited}, headers=_auth(ALICE))
    assert response.status_code == 200, response.text
    stored = next(
        m
        for m in response.json()["replacement"]
        if str(m.get("content", "")).startswith(SUMMARY_MARKER)
    )
    after = parse_summary(stored)
    assert after is not None
    assert after.body == edited  # no file block slipped into what the user edits
    assert after.files == made.files
    assert after.heading == made.heading

    follow_up = [
        *messages,
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "?"},
    ]
    _chat(url, follow_up)
    forwarded = parse_summary(
        {"role": "user", "content": _summary_of(upstream.chat_requests[-1].json()["messages"])}
    )
    assert forwarded == after  # what the next request forwards, file lists and all


def test_only_the_owner_or_the_admin_may_edit_a_summary(start_proxy: ProxyFactory) -> None:
    url = start_proxy(models=MODELS, server={"admin_key": ADMIN})
    messages = agent_session(seed=2, steps=60, task="Edit test: owners.")
    checkpoint_id = _chat(url, messages).headers["x-compaction-id"]
    target = f"{url}/compaction/checkpoints/{checkpoint_id}"

    theirs = httpx.put(target, json={"summary": "mine now"}, headers=_auth(BOB))
    assert theirs.status_code == 404
    assert theirs.json()["error"]["code"] == "not_found"

    admin = {**_auth(BOB), "x-compaction-proxy-admin-key": ADMIN}
    assert httpx.put(target, json={"summary": "by the admin"}, headers=admin).status_code == 200
    # The checkpoint stays its owner's: Alice still reads it, Bob still does not.
    assert httpx.get(target, headers=_auth(ALICE)).status_code == 200
    assert httpx.get(target, headers=_auth(BOB)).status_code == 404


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"summary": 5}', "summary"),
        (b"{}", "summary"),
        (b'{"summary": "   "}', "summary"),
        (b"not json", None),
        (b"[1]", None),
    ],
)
def test_a_bad_edit_is_a_400_in_openais_shape(
    start_proxy: ProxyFactory, body: bytes, param: str | None
) -> None:
    url = start_proxy(models=MODELS)
    messages = agent_session(seed=3, steps=60, task="Edit test: bad bodies.")
    checkpoint_id = _chat(url, messages).headers["x-compaction-id"]
    response = httpx.put(
        f"{url}/compaction/checkpoints/{checkpoint_id}",
        content=body,
        headers={**_auth(ALICE), "content-type": "application/json"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_a_session_with_compaction_off_is_forwarded_whole(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    url = start_proxy(models=MODELS)
    messages = agent_session(seed=4, steps=60, task="Off test: leave me alone.")
    session = _opened(url, messages)
    response = httpx.put(
        f"{url}/compaction/sessions/{session}/settings",
        json={"enabled": False},
        headers=_auth(ALICE),
    )
    assert response.status_code == 200, response.text
    assert response.json()["enabled"] is False

    answered = _chat(url, messages)
    assert answered.headers["x-compaction-stage"] == "none"
    assert upstream.chat_requests[-1].json()["messages"] == messages
    assert upstream.summary_requests == []
    assert _events(url) == []

    # Another caller's same conversation is not switched off by Alice.
    assert _chat(url, messages, key=BOB).headers["x-compaction-stage"] != "none"


def test_a_compact_command_still_compacts_a_session_switched_off(
    start_proxy: ProxyFactory,
) -> None:
    url = start_proxy(models=MODELS)
    messages = agent_session(seed=5, steps=20, task="Off test: but /compact.")
    httpx.put(
        f"{url}/compaction/sessions/{_opened(url, messages)}/settings",
        json={"enabled": False},
        headers=_auth(ALICE),
    ).raise_for_status()
    answered = _chat(url, [*messages, {"role": "user", "content": "/compact"}])
    assert answered.headers["x-compaction-reason"] == "manual"


def test_session_instructions_reach_the_summarizer(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    url = start_proxy(models=MODELS)
    messages = agent_session(seed=6, steps=60, task="Instructions test.")
    response = httpx.put(
        f"{url}/compaction/sessions/{_opened(url, messages)}/settings",
        json={"instructions": "Keep the word PAPAYA-77 verbatim."},
        headers=_auth(ALICE),
    )
    assert response.status_code == 200, response.text
    assert _chat(url, messages).headers["x-compaction-stage"] == "condensed"
    assert upstream.summary_prompts
    assert all("PAPAYA-77" in prompt for prompt in upstream.summary_prompts)
    # The built-in prompt is still there: the instructions are added to it.
    assert all("## Goal" in prompt for prompt in upstream.summary_prompts)


def test_compact_now_compacts_the_next_request_as_compact_would(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    url = start_proxy(models=MODELS)
    messages = agent_session(seed=7, steps=6, task="Compact-now test.")
    assert _chat(url, messages).headers["x-compaction-stage"] == "none"  # below the trigger
    session = _opened(url, messages)
    response = httpx.post(f"{url}/compaction/sessions/{session}/compact", headers=_auth(ALICE))
    assert response.status_code == 202
    later = [*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    # A preview shows it and leaves it pending.
    preview = httpx.post(
        f"{url}/compaction/preview",
        json={"model": "gpt-4o", "messages": later},
        headers=_auth(ALICE),
        timeout=60,
    )
    assert preview.json()["report"]["reason"] == "manual"
    compacted = _chat(url, later)
    assert compacted.headers["x-compaction-reason"] == "manual"
    assert compacted.headers["x-compaction-stage"] != "none"
    assert upstream.chat_requests[-1].json()["messages"] != later
    # Once only: the request after it is a plain one again.
    again = _chat(url, [*later, {"role": "assistant", "content": "ok"}])
    assert again.headers["x-compaction-reason"] == "none"


def _wait_for_sessions(url: str, key: str, count: int) -> list[dict[str, Any]]:
    """The overview once the recorder has written ``count`` requests (it writes
    in the background)."""
    deadline = time.monotonic() + 10
    while True:
        response = httpx.get(f"{url}/compaction/sessions", headers=_auth(key))
        assert response.status_code == 200, response.text
        data: list[dict[str, Any]] = response.json()["data"]
        if sum(s["requests"] for s in data) >= count or time.monotonic() > deadline:
            return data
        time.sleep(0.05)


def test_every_request_leaves_its_figures_for_its_owner(start_proxy: ProxyFactory) -> None:
    url = start_proxy(models=MODELS)
    messages = agent_session(seed=8, steps=60, task="Figures test.")
    _chat(url, messages[:4])
    _chat(url, messages)
    [summary] = _wait_for_sessions(url, ALICE, 2)
    assert summary["session"] == session_key(messages)
    assert summary["requests"] == 2
    assert summary["compactions"] == 1
    assert summary["saved"] > 0
    assert summary["tokens_after"] < summary["input_limit"]
    assert _wait_for_sessions(url, BOB, 0) == []  # nothing of Alice's for Bob

    detail = httpx.get(f"{url}/compaction/sessions/{summary['session']}", headers=_auth(ALICE))
    records = detail.json()["requests"]
    assert [r["stage"] for r in records] == ["none", "condensed"]  # oldest first
    assert all("content" not in r for r in records)


#: A profile whose compactions all condense with the llm summarizer, and are
#: prepared in the background once past 80 % of the trigger (the default).
BACKGROUND_MODEL = {"agent-model": {"context_window": 16_384, "tool_result_chars": 1_000_000}}


def _agent_turns(task: str, turns: int) -> list[list[dict[str, Any]]]:
    """The successive requests of a tool-using agent session."""
    rng = random.Random(task)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": task},
    ]
    requests = []
    for i in range(turns):
        history = [*history, *shell_step(rng, i)]
        requests.append(history)
    return requests


def _send_all(url: str, requests: list[list[dict[str, Any]]], key: str) -> list[str]:
    stages = []
    with httpx.Client(headers=_auth(key), timeout=60) as client:
        for messages in requests:
            body = {"model": "agent-model", "messages": messages}
            response = client.post(f"{url}/chat/completions", json=body)
            assert response.status_code == 200, response.text
            stages.append(response.headers["x-compaction-stage"])
    return stages


def test_a_session_switched_off_is_not_prepared_in_the_background_either(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    url = start_proxy(models=BACKGROUND_MODEL)
    requests = _agent_turns("Off test: background.", 120)
    httpx.put(
        f"{url}/compaction/sessions/{_opened(url, requests[0], model='agent-model')}/settings",
        json={"enabled": False},
        headers=_auth(ALICE),
    ).raise_for_status()
    assert set(_send_all(url, requests, ALICE)) == {"none"}
    assert upstream.summary_requests == []  # nothing prepared ahead, nothing compacted
    assert _events(url, ALICE) == []
    # Bob's same conversation, not switched off, is prepared and compacted: the
    # session did cross the zone where preparing starts, and the trigger.
    assert set(_send_all(url, requests, BOB)) != {"none"}
    assert any(e["background"] for e in _events(url, BOB))
    assert upstream.summary_requests


def test_session_instructions_reach_a_summary_prepared_in_the_background(
    start_proxy: ProxyFactory, fake: tuple[FakeUpstream, str]
) -> None:
    upstream, _ = fake
    url = start_proxy(models=BACKGROUND_MODEL)
    requests = _agent_turns("Instructions test: background.", 120)
    httpx.put(
        f"{url}/compaction/sessions/{_opened(url, requests[0], model='agent-model')}/settings",
        json={"instructions": "Name the file KIWI-88 first."},
        headers=_auth(ALICE),
    ).raise_for_status()
    _send_all(url, requests, ALICE)
    events = _events(url, ALICE)
    assert any(e["background"] for e in events), "a summary was prepared in the background"
    assert upstream.summary_prompts
    assert all("KIWI-88" in prompt for prompt in upstream.summary_prompts)
