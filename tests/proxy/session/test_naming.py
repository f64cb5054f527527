"""Sessions are named by the client's own session id where it sends one, else by
how the conversation starts (:mod:`proxy.session.naming`).

The headers are the ones the real CLIs were seen to send through the proxy
(tests/proxy/test_real_clients.py): Claude Code 2.1 ``x-claude-code-session-id``
(its ``metadata.user_id`` names the same id), Codex 0.171 ``session-id`` (its
thread), ``x-codex-window-id`` (``<thread>:<window number>``) and
``x-codex-turn-metadata`` (JSON naming ``session_id``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compaction import session_key
from proxy.session.naming import (
    MAX_CLIENT_SESSION_CHARS,
    client_session,
    session_name,
)
from proxy.state.stores import SessionSummary
from tests.proxy.dialects.anthropic.upstream import AnthropicUpstream
from tests.proxy.dialects.responses.upstream import ResponsesUpstream
from tests.proxy.inprocess import InProcessProxy, RecordingTransport, running, settings_for
from tests.proxy.session.conftest import figures_written, proxy_state

THREAD = "01a24a7d-59c4-7dd0-a039-d9a708674b55"
OTHER_THREAD = "01a24a7d-5bce-72c0-8717-c55a55f94576"
CLAUDE_SESSION = "01eb92cf-c7fa-411e-8bb8-9955aa988387"
KEY = "Bearer sk-test"


def _codex_headers(thread: str) -> dict[str, str]:
    """What Codex 0.171's ``codex exec`` sends beside each turn."""
    metadata = {"session_id": thread, "thread_id": thread, "window_id": f"{thread}:0"}
    return {
        "authorization": KEY,
        "originator": "codex_exec",
        "session-id": thread,
        "thread-id": thread,
        "x-codex-window-id": f"{thread}:0",
        "x-codex-turn-metadata": json.dumps(metadata),
    }


def test_each_clients_header_names_its_session() -> None:
    assert client_session([("X-Claude-Code-Session-Id", CLAUDE_SESSION)]) == CLAUDE_SESSION
    assert client_session(_codex_headers(THREAD).items()) == THREAD
    # Each of Codex's headers alone names the thread: a window is the thread's
    # context between two of Codex's own compactions, still the same session.
    assert client_session([("x-codex-window-id", f"{THREAD}:3")]) == THREAD
    metadata = json.dumps({"session_id": THREAD})
    assert client_session([("x-codex-turn-metadata", metadata)]) == THREAD


def test_no_header_or_no_usable_one_names_no_session() -> None:
    assert client_session([("authorization", KEY), ("user-agent", "curl/8")]) is None
    assert client_session([("x-codex-turn-metadata", "{not json")]) is None
    assert client_session([("x-codex-turn-metadata", '{"session_id": 7}')]) is None
    assert client_session([("session-id", "   ")]) is None
    too_long = "s" * (MAX_CLIENT_SESSION_CHARS + 1)
    assert client_session([("session-id", too_long)]) is None
    assert client_session([("session-id", too_long[1:])]) == too_long[1:]


def test_a_named_session_does_not_depend_on_the_conversation() -> None:
    assert session_name(THREAD, "aaa") == session_name(THREAD, "bbb")
    assert session_name(THREAD, "aaa") != session_name(OTHER_THREAD, "aaa")
    assert session_name(None, "aaa") == "aaa"


def _responses(proxy: InProcessProxy, prompt: str, headers: dict[str, str]) -> None:
    body = {"model": "gpt-4o", "input": [{"role": "user", "content": prompt}], "store": False}
    response = proxy.http.post("/v1/responses", json=body, headers=headers)
    assert response.status_code == 200, response.text


def _sessions(proxy: InProcessProxy) -> list[SessionSummary]:
    figures_written(proxy)
    store, portal = proxy_state(proxy).store, proxy.http.portal
    assert portal is not None, "the app's lifespan runs"
    return list(portal.call(store.sessions))


def test_two_codex_exec_runs_of_one_prompt_are_two_sessions(tmp_path: Path) -> None:
    upstream = ResponsesUpstream(tool_turns=0)
    settings = settings_for(store={"url": f"sqlite:///{tmp_path / 'state.db'}"})
    with running(settings, RecordingTransport(app=upstream.app())) as proxy:
        for thread in (THREAD, OTHER_THREAD):
            for _ in range(2):  # each run asks twice
                _responses(
                    proxy, "Read every part file and report the values.", _codex_headers(thread)
                )
        found = _sessions(proxy)
    assert sorted(s.requests for s in found) == [2, 2]
    assert {s.session for s in found} == {session_name(THREAD, ""), session_name(OTHER_THREAD, "")}


def test_a_side_request_of_a_claude_code_session_is_counted_in_it(tmp_path: Path) -> None:
    """A title or quota request starts another way than the conversation, but
    carries its session's id: it is one more request of that session, not a
    session of its own."""
    upstream = AnthropicUpstream(tool_turns=0)
    settings = settings_for(
        store={"url": f"sqlite:///{tmp_path / 'state.db'}"},
        upstream={"anthropic_base_url": "http://upstream.test/v1"},
    )
    headers = {"x-api-key": "sk-ant-test", "x-claude-code-session-id": CLAUDE_SESSION}

    def ask(messages: list[dict[str, Any]]) -> None:
        body = {"model": "claude-x", "max_tokens": 512, "messages": messages}
        response = proxy.http.post("/v1/messages", json=body, headers=headers)
        assert response.status_code == 200, response.text

    with running(settings, RecordingTransport(app=upstream.app())) as proxy:
        ask([{"role": "user", "content": "Fix the failing parser test."}])
        ask([{"role": "user", "content": "Write a 5-word title for: Fix the failing parser test."}])
        ask([{"role": "user", "content": "quota"}])
        found = _sessions(proxy)
    assert [(s.session, s.requests) for s in found] == [(session_name(CLAUDE_SESSION, ""), 3)]


def test_without_a_header_a_conversation_is_named_by_how_it_starts(tmp_path: Path) -> None:
    upstream = ResponsesUpstream(tool_turns=0)
    settings = settings_for(store={"url": f"sqlite:///{tmp_path / 'state.db'}"})
    with running(settings, RecordingTransport(app=upstream.app())) as proxy:
        _responses(proxy, "Start one way.", {"authorization": KEY})
        found = _sessions(proxy)
    first = {"role": "user", "content": "Start one way."}
    assert [s.session for s in found] == [session_key([first])]
