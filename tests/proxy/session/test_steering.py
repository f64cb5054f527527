"""Steering a conversation through the JSON routes: edit a summary and
see the next request forward it; switch compaction off for one session; add
instructions to its summaries; compact it now. The proxy in-process, in
front of the fake upstream (through the recording transport)."""

from __future__ import annotations

import random
import time
from typing import Any

import httpx
import pytest

from compaction import SUMMARY_MARKER, parse_summary, session_key
from compaction.chat.own import recorded
from tests.conftest import user
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.servers import FakeUpstream
from tests.proxy.session.conftest import figures_written
from tests.synthetic import agent_session, shell_step

MODELS = {"gpt-4o": {"context_window": 8192}}
ALICE, BOB = "sk-alice-0123456789", "sk-bob-9876543210"
ADMIN = "admin-secret-4242"


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _chat(
    proxy: InProcessProxy, messages: list[dict[str, Any]], key: str = ALICE
) -> httpx.Response:
    body = {"model": "gpt-4o", "messages": messages}
    response = proxy.http.post("/v1/chat/completions", json=body, headers=_auth(key))
    assert response.status_code == 200, response.text
    return response


def _opened(
    proxy: InProcessProxy, messages: list[dict[str, Any]], key: str = ALICE, model: str = "gpt-4o"
) -> str:
    """The session of ``messages``, once the proxy has recorded a request of it:
    until then steering it is a 404, as for any session the caller has nothing of."""
    session = session_key(messages)
    first = {"model": model, "messages": messages[:2]}  # the system prompt and the task
    proxy.http.post("/v1/chat/completions", json=first, headers=_auth(key))
    for _ in range(100):  # the figure is queued as the answer ends
        figures_written(proxy)
        found = proxy.http.get(f"/v1/compaction/sessions/{session}", headers=_auth(key))
        if found.status_code == 200:
            return session
        time.sleep(0.01)
    raise AssertionError(f"session {session} was never recorded")


def _summary_of(messages: list[dict[str, Any]]) -> str:
    """The main summary (a turn-prefix note may follow it)."""
    found = [m["content"] for m in messages if str(m.get("content", "")).startswith(SUMMARY_MARKER)]
    assert found, "a summary is forwarded"
    text: str = found[0]
    return text


def _events(proxy: InProcessProxy, key: str = ALICE) -> list[dict[str, Any]]:
    response = proxy.http.get("/v1/compaction/events", headers=_auth(key))
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def test_an_edited_summary_is_what_the_next_request_forwards(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    upstream = fake_upstream
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=1, steps=60, task="Edit test: fix the parser.")
    first = _chat(proxy, messages)
    checkpoint_id = first.headers["x-compaction-id"]
    before = _summary_of(upstream.chat_requests[-1].json()["messages"])
    assert "Make the failing test" in before  # the fake summarizer's text

    edited = "## Goal\n- Keep the frobnicator at 42 rpm.\n\n## Next Steps\n- Ship it."
    response = proxy.http.put(
        f"/v1/compaction/checkpoints/{checkpoint_id}",
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
    second = _chat(proxy, follow_up)
    assert second.headers["x-compaction-id"] == checkpoint_id
    forwarded = _summary_of(upstream.chat_requests[-1].json()["messages"])
    assert forwarded.startswith(SUMMARY_MARKER)
    assert parse_summary(recorded(user(forwarded))).body == edited  # type: ignore[union-attr]
    assert "Make the failing test" not in forwarded

    [event] = [e for e in _events(proxy) if e["type"] == "checkpoint.edited"]
    assert event["checkpoint_id"] == checkpoint_id
    assert "Make the failing test" in event["previous_summary"]  # the old text is kept


def test_an_edited_summary_keeps_the_file_lists_out_of_its_body_and_intact_in_the_message(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    upstream = fake_upstream
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=4, steps=60, task="Edit test: the file lists stay.")
    first = _chat(proxy, messages)
    checkpoint_id = first.headers["x-compaction-id"]
    made = parse_summary(recorded(user(_summary_of(upstream.chat_requests[-1].json()["messages"]))))
    assert made is not None and made.files, "the session read and changed files"

    target = f"/v1/compaction/checkpoints/{checkpoint_id}"
    edited = "## Goal\n- Only the goal is rewritten."
    response = proxy.http.put(target, json={"summary": edited}, headers=_auth(ALICE))
    assert response.status_code == 200, response.text
    stored = next(
        m
        for m in response.json()["replacement"]
        if str(m.get("content", "")).startswith(SUMMARY_MARKER)
    )
    after = parse_summary(recorded(stored))
    assert after is not None
    assert after.body == edited  # no file block slipped into what the user edits
    assert after.files == made.files
    assert after.heading == made.heading

    follow_up = [
        *messages,
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "?"},
    ]
    _chat(proxy, follow_up)
    forwarded = parse_summary(
        recorded(user(_summary_of(upstream.chat_requests[-1].json()["messages"])))
    )
    assert forwarded == after  # what the next request forwards, file lists and all


def test_only_the_owner_or_the_admin_may_edit_a_summary(start_app: AppFactory) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    messages = agent_session(seed=2, steps=60, task="Edit test: owners.")
    checkpoint_id = _chat(proxy, messages).headers["x-compaction-id"]
    target = f"/v1/compaction/checkpoints/{checkpoint_id}"

    theirs = proxy.http.put(target, json={"summary": "mine now"}, headers=_auth(BOB))
    assert theirs.status_code == 404
    assert theirs.json()["error"]["code"] == "not_found"

    admin = {**_auth(BOB), "x-compaction-proxy-admin-key": ADMIN}
    assert (
        proxy.http.put(target, json={"summary": "by the admin"}, headers=admin).status_code == 200
    )
    # The checkpoint stays its owner's: Alice still reads it, Bob still does not.
    assert proxy.http.get(target, headers=_auth(ALICE)).status_code == 200
    assert proxy.http.get(target, headers=_auth(BOB)).status_code == 404


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
    start_app: AppFactory, body: bytes, param: str | None
) -> None:
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=3, steps=60, task="Edit test: bad bodies.")
    checkpoint_id = _chat(proxy, messages).headers["x-compaction-id"]
    response = proxy.http.put(
        f"/v1/compaction/checkpoints/{checkpoint_id}",
        content=body,
        headers={**_auth(ALICE), "content-type": "application/json"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_a_session_with_compaction_off_is_forwarded_whole(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    upstream = fake_upstream
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=4, steps=60, task="Off test: leave me alone.")
    session = _opened(proxy, messages)
    response = proxy.http.put(
        f"/v1/compaction/sessions/{session}/settings",
        json={"enabled": False},
        headers=_auth(ALICE),
    )
    assert response.status_code == 200, response.text
    assert response.json()["enabled"] is False

    answered = _chat(proxy, messages)
    assert answered.headers["x-compaction-stage"] == "none"
    assert upstream.chat_requests[-1].json()["messages"] == messages
    assert upstream.summary_requests == []
    assert _events(proxy) == []

    # Another caller's same conversation is not switched off by Alice.
    assert _chat(proxy, messages, key=BOB).headers["x-compaction-stage"] != "none"


def test_a_compact_command_still_compacts_a_session_switched_off(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=5, steps=20, task="Off test: but /compact.")
    proxy.http.put(
        f"/v1/compaction/sessions/{_opened(proxy, messages)}/settings",
        json={"enabled": False},
        headers=_auth(ALICE),
    ).raise_for_status()
    answered = _chat(proxy, [*messages, {"role": "user", "content": "/compact"}])
    assert answered.headers["x-compaction-reason"] == "manual"


def test_session_instructions_reach_the_summarizer(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    upstream = fake_upstream
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=6, steps=60, task="Instructions test.")
    response = proxy.http.put(
        f"/v1/compaction/sessions/{_opened(proxy, messages)}/settings",
        json={"instructions": "Keep the word PAPAYA-77 verbatim."},
        headers=_auth(ALICE),
    )
    assert response.status_code == 200, response.text
    assert _chat(proxy, messages).headers["x-compaction-stage"] == "condensed"
    assert upstream.summary_prompts
    assert all("PAPAYA-77" in prompt for prompt in upstream.summary_prompts)
    # The built-in prompt is still there: the instructions are added to it (a
    # turn's start, summarized apart when the tail begins inside it, has no Goal).
    assert all(
        "## Goal" in prompt or "<turn-steps>" in prompt for prompt in upstream.summary_prompts
    )
    assert any("## Goal" in prompt for prompt in upstream.summary_prompts)


def test_compact_now_compacts_the_next_request_as_compact_would(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    upstream = fake_upstream
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=7, steps=6, task="Compact-now test.")
    assert _chat(proxy, messages).headers["x-compaction-stage"] == "none"  # below the trigger
    session = _opened(proxy, messages)
    response = proxy.http.post(f"/v1/compaction/sessions/{session}/compact", headers=_auth(ALICE))
    assert response.status_code == 202
    later = [*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    # A preview shows it and leaves it pending.
    preview = proxy.http.post(
        "/v1/compaction/preview",
        json={"model": "gpt-4o", "messages": later},
        headers=_auth(ALICE),
    )
    assert preview.json()["report"]["reason"] == "manual"
    compacted = _chat(proxy, later)
    assert compacted.headers["x-compaction-reason"] == "manual"
    assert compacted.headers["x-compaction-stage"] != "none"
    assert upstream.chat_requests[-1].json()["messages"] != later
    # Once only: the request after it is a plain one again.
    again = _chat(proxy, [*later, {"role": "assistant", "content": "ok"}])
    assert again.headers["x-compaction-reason"] == "none"


def _sessions(proxy: InProcessProxy, key: str) -> list[dict[str, Any]]:
    """The overview once the recorder has written every request so far (it
    writes in the background)."""
    figures_written(proxy)
    response = proxy.http.get("/v1/compaction/sessions", headers=_auth(key))
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def test_every_request_leaves_its_figures_for_its_owner(start_app: AppFactory) -> None:
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=8, steps=60, task="Figures test.")
    _chat(proxy, messages[:4])
    _chat(proxy, messages)
    [summary] = _sessions(proxy, ALICE)
    assert summary["session"] == session_key(messages)
    assert summary["requests"] == 2
    assert summary["compactions"] == 1
    assert summary["saved"] > 0
    assert summary["tokens_after"] < summary["input_limit"]
    assert _sessions(proxy, BOB) == []  # nothing of Alice's for Bob

    detail = proxy.http.get(f"/v1/compaction/sessions/{summary['session']}", headers=_auth(ALICE))
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


def _send_all(proxy: InProcessProxy, requests: list[list[dict[str, Any]]], key: str) -> list[str]:
    stages = []
    for messages in requests:
        body = {"model": "agent-model", "messages": messages}
        response = proxy.http.post("/v1/chat/completions", json=body, headers=_auth(key))
        assert response.status_code == 200, response.text
        stages.append(response.headers["x-compaction-stage"])
    return stages


def test_a_session_switched_off_is_not_prepared_in_the_background_either(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    upstream = fake_upstream
    proxy = start_app(models=BACKGROUND_MODEL)
    requests = _agent_turns("Off test: background.", 120)
    proxy.http.put(
        f"/v1/compaction/sessions/{_opened(proxy, requests[0], model='agent-model')}/settings",
        json={"enabled": False},
        headers=_auth(ALICE),
    ).raise_for_status()
    assert set(_send_all(proxy, requests, ALICE)) == {"none"}
    assert upstream.summary_requests == []  # nothing prepared ahead, nothing compacted
    assert _events(proxy, ALICE) == []
    # Bob's same conversation, not switched off, is prepared and compacted: the
    # session did cross the zone where preparing starts, and the trigger.
    assert set(_send_all(proxy, requests, BOB)) != {"none"}
    assert any(e["background"] for e in _events(proxy, BOB))
    assert upstream.summary_requests


def test_session_instructions_reach_a_summary_prepared_in_the_background(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    upstream = fake_upstream
    proxy = start_app(models=BACKGROUND_MODEL)
    requests = _agent_turns("Instructions test: background.", 120)
    proxy.http.put(
        f"/v1/compaction/sessions/{_opened(proxy, requests[0], model='agent-model')}/settings",
        json={"instructions": "Name the file KIWI-88 first."},
        headers=_auth(ALICE),
    ).raise_for_status()
    _send_all(proxy, requests, ALICE)
    events = _events(proxy, ALICE)
    assert any(e["background"] for e in events), "a summary was prepared in the background"
    assert upstream.summary_prompts
    assert all("KIWI-88" in prompt for prompt in upstream.summary_prompts)
