"""Each caller sees only its own compaction state: summaries and originals are private.

Events and checkpoints were open to every caller: ``/v1/compaction/events``
listed every session with its checkpoint id, and
``/v1/compaction/checkpoints/{id}`` returned another user's originals. Now
they are recorded with an owner (a digest of the caller's key) and shown to
that owner, or to a caller with the admin key; a proxy key guards them too.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from proxy.edge.access import owner_digest, owner_of
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.servers import FakeUpstream
from tests.synthetic import agent_session

MODELS = {"gpt-4o": {"context_window": 8192}, "gpt-4o-mini": {"context_window": 8192}}
ALICE, BOB, CAROL = "sk-alice-0123456789", "sk-bob-9876543210", "sk-carol-5555"
ADMIN = "admin-secret-4242"
PROXY_KEY = "proxy-secret-1717"
FALLBACK = "sk-fallback-3131"
ADMIN_HEADER = "x-compaction-proxy-admin-key"


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _proxy(start_app: AppFactory, **server: Any) -> InProcessProxy:
    return start_app(models=MODELS, compaction={"summarizer": "extractive"}, server=server)


def _compact(
    proxy: InProcessProxy, headers: dict[str, str], seed: int, model: str = "gpt-4o"
) -> httpx.Response:
    body = {"model": model, "messages": agent_session(seed=seed, steps=120)}
    response = proxy.http.post(f"{proxy.url}/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-stage"] in ("condensed", "truncated")
    return response


def _events(proxy: InProcessProxy, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    response = proxy.http.get(f"{proxy.url}/compaction/events", params=params, headers=headers)
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def _checkpoint_ids(events: list[dict[str, Any]]) -> set[str]:
    return {event["checkpoint_id"] for event in events if event["checkpoint_id"]}


def test_a_caller_sees_its_own_conversations_and_no_one_elses(
    start_app: AppFactory,
) -> None:
    proxy = _proxy(start_app)
    alice = _compact(proxy, _auth(ALICE), seed=71).headers["x-compaction-id"]
    bob = _compact(proxy, _auth(BOB), seed=72).headers["x-compaction-id"]

    mine = _events(proxy, _auth(ALICE))
    assert [event["type"] for event in mine] == [
        "context.compacted",
        "compaction.started",
        "compaction.queued",
    ]
    assert _checkpoint_ids(mine) == {alice}
    assert _checkpoint_ids(_events(proxy, _auth(BOB))) == {bob}
    assert _events(proxy, _auth(CAROL)) == []
    assert _events(proxy, {}) == []  # keyless: the anonymous owner, who made nothing
    # Knowing alice's session does not help bob (sessions are not secret: two
    # conversations opening alike share one).
    assert alice not in _checkpoint_ids(_events(proxy, _auth(BOB), session=mine[0]["session"]))
    assert _events(proxy, _auth(CAROL), session=mine[0]["session"]) == []

    own = proxy.http.get(f"{proxy.url}/compaction/checkpoints/{alice}", headers=_auth(ALICE))
    assert own.status_code == 200 and own.json()["originals"]
    # Another's checkpoint answers exactly as one that does not exist.
    stolen = proxy.http.get(f"{proxy.url}/compaction/checkpoints/{alice}", headers=_auth(BOB))
    missing = proxy.http.get(f"{proxy.url}/compaction/checkpoints/{'0' * 32}", headers=_auth(BOB))
    assert stolen.status_code == missing.status_code == 404
    assert stolen.content == missing.content
    assert stolen.json()["error"]["code"] == "not_found"
    keyless = proxy.http.get(f"{proxy.url}/compaction/checkpoints/{alice}")
    assert keyless.status_code == 404


def test_the_admin_key_sees_every_callers_conversations(start_app: AppFactory) -> None:
    proxy = _proxy(start_app, admin_key=ADMIN)
    alice = _compact(proxy, _auth(ALICE), seed=73).headers["x-compaction-id"]
    bob = _compact(proxy, _auth(BOB), seed=74).headers["x-compaction-id"]
    admin = {ADMIN_HEADER: ADMIN}
    assert _checkpoint_ids(_events(proxy, admin)) == {alice, bob}
    for ident in (alice, bob):
        shown = proxy.http.get(f"{proxy.url}/compaction/checkpoints/{ident}", headers=admin)
        assert shown.status_code == 200 and shown.json()["originals"]
    wrong = proxy.http.get(f"{proxy.url}/compaction/events", headers={ADMIN_HEADER: "guess"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"


def test_an_admin_header_without_a_configured_admin_key_is_refused(
    start_app: AppFactory,
) -> None:
    proxy = start_app()
    response = proxy.http.get(f"{proxy.url}/compaction/events", headers={ADMIN_HEADER: ""})
    assert response.status_code == 401


def test_one_owner_sees_every_model_it_uses(start_app: AppFactory) -> None:
    proxy = _proxy(start_app)
    first = _compact(proxy, _auth(ALICE), seed=75).headers["x-compaction-id"]
    second = _compact(proxy, _auth(ALICE), seed=76, model="gpt-4o-mini").headers["x-compaction-id"]
    # The same key sent in another header is the same owner.
    assert _checkpoint_ids(_events(proxy, {"api-key": ALICE})) == {first, second}


def test_a_caller_gets_its_own_last_events_under_a_busy_neighbour(
    start_app: AppFactory,
) -> None:
    proxy = _proxy(start_app)
    alice = _compact(proxy, _auth(ALICE), seed=77).headers["x-compaction-id"]
    for seed in (78, 79):  # six events after alice's three
        _compact(proxy, _auth(BOB), seed=seed)
    # A filter applied after a global "last 3" would leave alice with nothing.
    mine = _events(proxy, _auth(ALICE), limit=3)
    assert len(mine) == 3 and _checkpoint_ids(mine) == {alice}
    assert len(_events(proxy, _auth(BOB), limit=5)) == 5


def test_with_a_proxy_key_the_state_routes_require_it(start_app: AppFactory) -> None:
    proxy = _proxy(start_app, api_key=PROXY_KEY, admin_key=ADMIN)
    keyed = {"x-compaction-proxy-key": PROXY_KEY}
    alice = _compact(proxy, {**keyed, **_auth(ALICE)}, seed=80).headers["x-compaction-id"]
    preview = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, _auth(ALICE), {ADMIN_HEADER: ADMIN}):
        assert proxy.http.get(f"{proxy.url}/compaction/events", headers=headers).status_code == 401
        checkpoint = proxy.http.get(f"{proxy.url}/compaction/checkpoints/{alice}", headers=headers)
        assert checkpoint.status_code == 401
        refused = proxy.http.post(f"{proxy.url}/compaction/preview", json=preview, headers=headers)
        assert refused.status_code == 401
    assert _checkpoint_ids(_events(proxy, {**keyed, **_auth(ALICE)})) == {alice}
    assert _checkpoint_ids(_events(proxy, {**keyed, ADMIN_HEADER: ADMIN})) == {alice}
    # A teammate holding the proxy key only is not alice.
    assert _events(proxy, _auth(PROXY_KEY)) == []
    assert _events(proxy, keyed) == []


def test_no_response_carries_a_key_and_the_admin_key_stays_here(
    start_app: AppFactory, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = fake_upstream
    monkeypatch.setenv("OPENAI_API_KEY", FALLBACK)
    proxy = _proxy(start_app, api_key=PROXY_KEY, admin_key=ADMIN)
    keyed = {"x-compaction-proxy-key": PROXY_KEY}
    admin = {**keyed, ADMIN_HEADER: ADMIN}
    responses = [
        _compact(proxy, {**keyed, **_auth(ALICE)}, seed=81),
        _compact(proxy, _auth(PROXY_KEY), seed=82),  # keyless upstream: the fallback key
        _compact(proxy, {**admin, "x-api-key": BOB}, seed=83),
    ]
    assert upstream.chat_requests[1].headers["authorization"] == f"Bearer {FALLBACK}"
    assert all(ADMIN_HEADER not in request.headers for request in upstream.received)
    for headers in (admin, {**keyed, **_auth(ALICE)}, keyed, {**keyed, "x-api-key": BOB}):
        responses.append(proxy.http.get(f"{proxy.url}/compaction/events", headers=headers))
        for made in responses[:3]:
            ident = made.headers["x-compaction-id"]
            responses.append(
                proxy.http.get(f"{proxy.url}/compaction/checkpoints/{ident}", headers=headers)
            )
    assert {response.status_code for response in responses} == {200, 404}
    seen = [response.text + str(response.headers) for response in responses]
    for secret in (ALICE, BOB, ADMIN, PROXY_KEY, FALLBACK):
        assert not any(secret in text for text in seen), secret
    # The keyless conversation is the anonymous owner's, whatever key went upstream.
    anonymous = _checkpoint_ids(_events(proxy, keyed))
    assert anonymous == {responses[1].headers["x-compaction-id"]}


# -- owner_of --------------------------------------------------------------


def test_the_owner_is_a_digest_of_the_key_however_it_was_sent() -> None:
    owner = owner_of([("Authorization", f"Bearer {ALICE}")])
    assert ALICE not in owner and len(owner) == 32
    assert owner == owner_of([("api-key", ALICE)])
    assert owner == owner_of([("x-api-key", ALICE)])
    assert owner == owner_of([("authorization", f"bearer  {ALICE} ")])
    assert owner != owner_of([("authorization", f"Bearer {BOB}")])


def test_no_credential_is_the_anonymous_owner() -> None:
    assert owner_of([("content-type", "application/json")]) == owner_digest("") != ""
    assert owner_of([]) == owner_digest("")
