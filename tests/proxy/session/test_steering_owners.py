"""Whose record the steering routes act on: the owner the store kept, never one
inferred from who else used the same session id. The proxy in-process, its
memory store reached through the app's own loop."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from proxy.edge.access import owner_digest
from proxy.state.stores import Event, RequestRecord, SessionSettings
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.session.conftest import proxy_state
from tests.proxy.session.test_steering import ADMIN, ALICE, BOB, MODELS, _auth, _chat, _opened
from tests.synthetic import agent_session

ADMIN_HEADERS = {**_auth(BOB), "x-compaction-proxy-admin-key": ADMIN}
ALICE_OWNER, BOB_OWNER = owner_digest(ALICE), owner_digest(BOB)


def _run(proxy: InProcessProxy, work: Any, *args: Any) -> Any:
    """``await work(*args)`` on the app's loop (its store is used there)."""
    return proxy.http.portal.call(work, *args)


def _flood(proxy: InProcessProxy, session: str, owner: str, count: int) -> None:
    """``count`` cheap events of ``owner`` in ``session``, as as many edits of their own
    checkpoint would leave."""
    store = proxy_state(proxy).store

    async def work() -> None:
        for number in range(count):
            await store.add_event(
                Event(
                    compaction_id=f"flood-{number}",
                    type="checkpoint.edited",
                    session=session,
                    model="gpt-4o",
                    reason="edit",
                    instance="elsewhere",
                    checkpoint_id=f"theirs-{number}",
                    owner=owner,
                )
            )

    _run(proxy, work)


def _figure(proxy: InProcessProxy, session: str, owner: str) -> None:
    """One request's figures of ``owner`` in ``session``."""
    made = RequestRecord(
        session=session,
        model="gpt-4o",
        stage="none",
        reason="threshold",
        tokens_before=10,
        tokens_after=10,
        input_limit=8_000,
        trigger=6_000,
        status=200,
        ms=1.0,
        owner=owner,
    )
    _run(proxy, proxy_state(proxy).store.record_requests, [made])


def test_an_admin_edit_keeps_the_checkpoint_its_owners_however_many_events_another_made(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    messages = agent_session(seed=31, steps=60, task="Owner test: the admin edits.")
    checkpoint_id = _chat(proxy, messages).headers["x-compaction-id"]
    target = f"/v1/compaction/checkpoints/{checkpoint_id}"
    session = proxy.http.get(target, headers=_auth(ALICE)).json()["session"]
    # Another caller with the same first message has the same session id, and
    # pushes Alice's events out of the newest thousand of it.
    _flood(proxy, session, BOB_OWNER, 1_001)

    edited = proxy.http.put(target, json={"summary": "By the admin."}, headers=ADMIN_HEADERS)

    assert edited.status_code == 200, edited.text
    store = proxy_state(proxy).store
    assert _run(proxy, store.owner_of, checkpoint_id) == ALICE_OWNER
    mine = proxy.http.get(target, headers=_auth(ALICE))
    assert mine.status_code == 200
    assert "By the admin." in str(mine.json()["replacement"])
    assert proxy.http.get(target, headers=_auth(BOB)).status_code == 404
    [edit] = [e for e in _run(proxy, store.events) if e.type == "checkpoint.edited"][:1]
    assert edit.checkpoint_id == checkpoint_id and edit.owner == ALICE_OWNER


def test_an_admin_edit_of_a_checkpoint_whose_owner_cannot_be_read_is_refused(
    start_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    messages = agent_session(seed=32, steps=60, task="Owner test: an owner gone.")
    checkpoint_id = _chat(proxy, messages).headers["x-compaction-id"]
    store = proxy_state(proxy).store
    before = _run(proxy, store.get, checkpoint_id)

    async def unknown(checkpoint_id: str) -> None:
        return None  # dropped between the read and the edit

    monkeypatch.setattr(store, "owner_of", unknown)
    refused = proxy.http.put(
        f"/v1/compaction/checkpoints/{checkpoint_id}",
        json={"summary": "By the admin."},
        headers=ADMIN_HEADERS,
    )
    assert refused.status_code == 404
    assert _run(proxy, store.get, checkpoint_id) == before  # nothing written under a guess


def test_the_admin_must_name_the_owner_of_a_session_id_two_owners_use(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    messages = agent_session(seed=33, steps=60, task="Owner test: one id, two owners.")
    session = _opened(proxy, messages, key=ALICE)
    _figure(proxy, session, BOB_OWNER)
    route = f"/v1/compaction/sessions/{session}"
    off = {"enabled": False}

    ambiguous = proxy.http.put(f"{route}/settings", json=off, headers=ADMIN_HEADERS)
    assert ambiguous.status_code == 409, ambiguous.text
    error = ambiguous.json()["error"]
    assert error["code"] == "ambiguous_session" and error["param"] == "owner"
    assert ALICE_OWNER in error["message"] and BOB_OWNER in error["message"]
    assert proxy.http.post(f"{route}/compact", headers=ADMIN_HEADERS).status_code == 409
    assert proxy.http.get(route, headers=ADMIN_HEADERS).status_code == 409

    named = proxy.http.put(
        f"{route}/settings", params={"owner": ALICE_OWNER}, json=off, headers=ADMIN_HEADERS
    )
    assert named.status_code == 200, named.text
    store = proxy_state(proxy).store
    assert _run(proxy, store.session_settings, session, ALICE_OWNER).enabled is False
    assert _run(proxy, store.session_settings, session, BOB_OWNER) == SessionSettings()
    view = proxy.http.get(route, params={"owner": BOB_OWNER}, headers=ADMIN_HEADERS)
    assert view.status_code == 200
    assert view.json()["settings"]["enabled"] is True  # Bob's own, untouched
    assert {r["owner"] for r in view.json()["requests"]} == {BOB_OWNER}  # his requests only

    compact = proxy.http.post(
        f"{route}/compact", params={"owner": BOB_OWNER}, headers=ADMIN_HEADERS
    )
    assert compact.status_code == 202
    assert proxy_state(proxy).compact_now == {(BOB_OWNER, session)}


def test_the_admin_naming_an_owner_without_that_session_gets_a_404(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    messages = agent_session(seed=34, steps=60, task="Owner test: a named stranger.")
    session = _opened(proxy, messages, key=ALICE)
    missing = proxy.http.put(
        f"/v1/compaction/sessions/{session}/settings",
        params={"owner": BOB_OWNER},
        json={"enabled": False},
        headers=ADMIN_HEADERS,
    )
    assert missing.status_code == 404
    assert _run(proxy, proxy_state(proxy).store.owners_of_session, session) == [ALICE_OWNER]


def test_the_admin_steers_a_session_only_one_owner_uses_without_naming_it(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    messages = agent_session(seed=35, steps=60, task="Owner test: one owner.")
    session = _opened(proxy, messages, key=ALICE)
    changed = proxy.http.put(
        f"/v1/compaction/sessions/{session}/settings",
        json={"instructions": "Keep the API names."},
        headers=ADMIN_HEADERS,
    )
    assert changed.status_code == 200, changed.text
    found = _run(proxy, proxy_state(proxy).store.session_settings, session, ALICE_OWNER)
    assert found.instructions == "Keep the API names."


def test_a_caller_naming_another_owner_gets_a_404_and_changes_nothing(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    messages = agent_session(seed=36, steps=60, task="Owner test: not yours.")
    session = _opened(proxy, messages, key=ALICE)
    _figure(proxy, session, BOB_OWNER)
    theirs = proxy.http.put(
        f"/v1/compaction/sessions/{session}/settings",
        params={"owner": ALICE_OWNER},
        json={"enabled": False},
        headers=_auth(BOB),
    )
    assert theirs.status_code == 404
    store = proxy_state(proxy).store
    assert _run(proxy, store.session_settings, session, ALICE_OWNER) == SessionSettings()
    mine = proxy.http.put(
        f"/v1/compaction/sessions/{session}/settings",
        params={"owner": BOB_OWNER},
        json={"enabled": False},
        headers=_auth(BOB),
    )
    assert mine.status_code == 200
    assert dataclasses.replace(
        _run(proxy, store.session_settings, session, BOB_OWNER), updated_at=0.0
    ) == SessionSettings(enabled=False)


def test_an_owner_longer_than_any_digest_is_a_400(start_app: AppFactory) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    messages = agent_session(seed=37, steps=60, task="Owner test: a long owner.")
    session = _opened(proxy, messages, key=ALICE)
    refused = proxy.http.post(
        f"/v1/compaction/sessions/{session}/compact",
        params={"owner": "f" * 65},
        headers=ADMIN_HEADERS,
    )
    assert refused.status_code == 400, refused.text
    assert proxy_state(proxy).compact_now == set()
