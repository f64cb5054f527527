"""The proxy's own keys never reach the upstream; the client's own credentials do.

The app runs in-process in front of the fake upstream (the recording
transport keeps every request it was asked to send). A client may send the
proxy key in several headers at once, in any case and order, next to its own
upstream key, the admin key, or the same header twice: whatever it sends, no
request the proxy makes — the relayed one, a pass-through, the summarizer's,
a compaction prepared in the background — carries a value holding either of
the proxy's keys, and each of the client's own credential headers arrives as
the client sent it.
"""

from __future__ import annotations

import random
import time
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from proxy.edge.access import owner_digest, owner_of
from proxy.flow.send import read_client_headers
from proxy.session.naming import client_session, sent_session
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy, RecordingTransport
from tests.proxy.servers import FakeUpstream
from tests.synthetic import shell_step

PROXY_KEY = "proxy-key-7f3a19"
ADMIN_KEY = "admin-key-91cc02"
SECRETS = (PROXY_KEY, ADMIN_KEY)
#: The client's own upstream credentials, one per header an upstream reads.
OWN = {
    "authorization": "Bearer sk-own-upstream-5b2e",
    "x-api-key": "sk-ant-own-0d4e",
    "api-key": "azure-own-77aa",
}
CREDENTIAL_HEADERS = tuple(OWN)
HI = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}

Header = tuple[str, str]


def _cased(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name, name.upper(), name.title()])


def _bearer(token: str) -> st.SearchStrategy[str]:
    """``Bearer <token>`` in any case of the scheme, with any blanks around the token."""
    return st.builds(
        lambda scheme, gap, tail: f"{scheme}{gap}{token}{tail}",
        st.sampled_from(["Bearer", "bearer", "BEARER", "bEaReR"]),
        st.sampled_from([" ", "  ", "\t", " \t "]),
        st.sampled_from(["", " ", "\t"]),
    )


def _carrying(token: str) -> st.SearchStrategy[str]:
    return st.one_of(st.just(token), _bearer(token))


#: The headers the proxy key is let in by (the dedicated one, Authorization as
#: a bearer token), then every other place a key of the proxy's may come in.
_PRESENTING = st.one_of(
    st.tuples(_cased("x-compaction-proxy-key"), st.just(PROXY_KEY)),
    st.tuples(_cased("authorization"), _bearer(PROXY_KEY)),
)
_CARRYING = st.one_of(
    _PRESENTING,
    st.tuples(_cased("x-api-key"), _carrying(PROXY_KEY)),
    st.tuples(_cased("api-key"), _carrying(PROXY_KEY)),
    st.tuples(_cased("x-custom-token"), _carrying(PROXY_KEY)),
    st.tuples(_cased("x-compaction-proxy-admin-key"), st.just(ADMIN_KEY)),
    st.tuples(_cased("authorization"), _bearer(ADMIN_KEY)),
    st.tuples(_cased("x-api-key"), _carrying(ADMIN_KEY)),
    st.tuples(_cased("api-key"), _carrying(ADMIN_KEY)),
    # A wrong proxy key in the dedicated header goes no further either.
    st.tuples(_cased("x-compaction-proxy-key"), st.just("not-the-key")),
)
_OWN = st.sampled_from(sorted(OWN.items())).flatmap(
    lambda item: st.tuples(_cased(item[0]), st.just(item[1]))
)
_HEADERS = st.lists(st.one_of(_CARRYING, _OWN), max_size=6)


def _presents_the_key(headers: list[Header]) -> bool:
    for name, value in headers:
        lower, token = name.lower(), value.strip(" \t")
        if lower == "x-compaction-proxy-key" and token == PROXY_KEY:
            return True
        bearer = token.lower().startswith("bearer") and token[6:].strip(" \t") == PROXY_KEY
        if lower == "authorization" and bearer:
            return True
    return False


def _assert_forwarded_without_keys(asked: dict[str, str], sent: list[Header]) -> None:
    for name, value in asked.items():
        for secret in SECRETS:
            assert secret not in value, f"{name} carried a key of the proxy's"
    for credential in CREDENTIAL_HEADERS:
        own = [
            value for name, value in sent if name.lower() == credential and value in OWN.values()
        ]
        # The last one, as any server reading one value of a header would take it.
        assert asked.get(credential) == (own[-1] if own else None), credential


def _keyed_proxy(
    start_app: AppFactory, upstream: FakeUpstream, **sections: Any
) -> tuple[InProcessProxy, RecordingTransport]:
    transport = RecordingTransport(app=upstream.app())
    proxy = start_app(
        transport=transport, server={"api_key": PROXY_KEY, "admin_key": ADMIN_KEY}, **sections
    )
    return proxy, transport


def test_no_combination_of_headers_forwards_a_key_of_the_proxys(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    proxy, transport = _keyed_proxy(start_app, fake_upstream)

    # One app for every example: each is judged by the requests it added.
    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(headers=_HEADERS, route=st.sampled_from(["chat", "models"]))
    def case(headers: list[Header], route: str) -> None:
        before = len(transport.requests)
        if route == "chat":
            response = proxy.http.post("/v1/chat/completions", json=HI, headers=headers)
        else:
            response = proxy.http.get("/v1/models", headers=headers)
        asked = transport.requests[before:]
        if not _presents_the_key(headers):
            assert response.status_code == 401, response.text
            assert asked == []
            return
        assert response.status_code == 200, response.text
        assert len(asked) == 1
        _assert_forwarded_without_keys(asked[0].headers, headers)

    case()


def test_the_key_in_its_own_header_and_in_authorization_is_forwarded_in_neither(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    proxy, transport = _keyed_proxy(start_app, fake_upstream)
    sent = [
        ("x-compaction-proxy-key", PROXY_KEY),
        ("authorization", f"Bearer {PROXY_KEY}"),
        ("x-api-key", OWN["x-api-key"]),
    ]
    assert proxy.http.post("/v1/chat/completions", json=HI, headers=sent).status_code == 200
    (asked,) = transport.requests
    assert "authorization" not in asked.headers
    assert asked.headers["x-api-key"] == OWN["x-api-key"]


def _grow(proxy: InProcessProxy, headers: list[Header], turns: int) -> list[str]:
    rng = random.Random(5)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Make the test suite pass."},
    ]
    stages = []
    for i in range(turns):
        history.extend(shell_step(rng, i))
        body = {"model": "agent-model", "messages": history}
        response = proxy.http.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        stages.append(response.headers["x-compaction-stage"])
    return stages


def _background_compactions(proxy: InProcessProxy, headers: list[Header]) -> int:
    response = proxy.http.get("/v1/compaction/events", params={"limit": 1000}, headers=headers)
    assert response.status_code == 200, response.text
    events = response.json()["data"]
    return sum(1 for e in events if e["type"] == "context.compacted" and e["background"])


def test_the_summarizer_and_the_background_preparation_get_the_clients_key_only(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    # No pruning at a small window: every compaction condenses, asking the
    # summarizer — on the request path, and ahead of need in the background.
    model = {"context_window": 16_384, "tool_result_chars": 1_000_000}
    proxy, transport = _keyed_proxy(
        start_app, fake_upstream, models={"agent-model": model}, compaction={"summarizer": "llm"}
    )
    sent = [
        ("authorization", f"Bearer {PROXY_KEY}"),
        ("x-compaction-proxy-key", PROXY_KEY),
        ("x-api-key", f"bearer {ADMIN_KEY}"),
        ("api-key", OWN["api-key"]),
    ]
    stages = _grow(proxy, sent, turns=60)
    deadline = time.monotonic() + 10  # for the background writer, not a timing claim
    while _background_compactions(proxy, sent) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _background_compactions(proxy, sent) > 0, "no compaction was prepared ahead"
    assert "condensed" in stages
    assert fake_upstream.summary_requests, "the summarizer was never asked"
    for asked in transport.requests:
        _assert_forwarded_without_keys(asked.headers, sent)


def test_with_only_an_admin_key_set_it_is_forwarded_in_no_header(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    transport = RecordingTransport(app=fake_upstream.app())
    proxy = start_app(transport=transport, server={"admin_key": ADMIN_KEY})
    sent = [
        ("authorization", f"BEARER  {ADMIN_KEY}"),
        ("x-compaction-proxy-admin-key", ADMIN_KEY),
        ("api-key", ADMIN_KEY),
        ("x-api-key", OWN["x-api-key"]),
    ]
    assert proxy.http.post("/v1/chat/completions", json=HI, headers=sent).status_code == 200
    assert proxy.http.get("/v1/models", headers=sent).status_code == 200
    for asked in transport.requests:
        _assert_forwarded_without_keys(asked.headers, sent)


def test_a_list_header_sent_twice_reaches_the_upstream_as_one_list(
    start_app: AppFactory, fake_upstream: FakeUpstream
) -> None:
    # Two anthropic-beta lines are two betas (RFC 9110 5.3: one list); keeping
    # the last dropped the other feature the client asked for. A credential
    # sent twice is no list: its last is the one the edge reads and forwards.
    transport = RecordingTransport(app=fake_upstream.app())
    proxy = start_app(transport=transport)
    sent = [
        ("anthropic-beta", "context-1m-2025-08-07"),
        ("Anthropic-Beta", "interleaved-thinking-2025-05-14"),
        ("x-api-key", "sk-ant-first"),
        ("x-api-key", "sk-ant-second"),
        ("cookie", "a=1"),
        ("cookie", "b=2"),
    ]
    assert proxy.http.post("/v1/chat/completions", json=HI, headers=sent).status_code == 200
    assert proxy.http.get("/v1/models", headers=sent).status_code == 200
    assert len(transport.requests) == 2
    for asked in transport.requests:
        headers = {name.lower(): value for name, value in asked.headers.items()}
        assert headers["anthropic-beta"] == (
            "context-1m-2025-08-07, interleaved-thinking-2025-05-14"
        )
        assert headers["x-api-key"] == "sk-ant-second"
        assert headers["cookie"] == "a=1; b=2"


# --- one pass over a request's headers -----------------------------------------------------------

_READ_NAMES = st.sampled_from(
    [
        "authorization",
        "api-key",
        "x-api-key",
        "user-agent",
        "x-claude-code-session-id",
        "session-id",
        "x-codex-window-id",
        "anthropic-beta",
        "connection",
        "x-other",
    ]
).flatmap(_cased)
_ANY_HEADERS = st.lists(
    st.tuples(_READ_NAMES, st.sampled_from(["", "a", "Bearer b", "t:3", "ua/1", "c"])), max_size=8
)


@given(headers=_ANY_HEADERS)
def test_a_requests_headers_read_once_say_what_each_reader_says(headers: list[Header]) -> None:
    """One pass gives the owner the edge reads (owner_of), the session the
    naming reads (client_session), the first user agent, and what goes upstream:
    no hop-by-hop header, a repeated one as one list, a credential's last value."""
    read = read_client_headers(headers)
    assert owner_digest(read.credential or "") == owner_of(headers)
    assert sent_session(read.first) == client_session(headers)
    agents = [value for name, value in headers if name.lower() == "user-agent"]
    assert read.first.get("user-agent") == (agents[0] if agents else None)
    assert "connection" not in read.forwarded
    for name in ("api-key", "x-api-key", "authorization"):
        sent = [value for sent_name, value in headers if sent_name.lower() == name]
        assert read.forwarded.get(name) == (sent[-1] if sent else None)
    betas = [value for name, value in headers if name.lower() == "anthropic-beta"]
    assert read.forwarded.get("anthropic-beta") == (", ".join(betas) if betas else None)


@given(headers=_ANY_HEADERS, header=st.sampled_from(["authorization", "x-api-key"]))
def test_the_configured_key_goes_upstream_only_where_the_client_sent_none(
    headers: list[Header], header: str
) -> None:
    read = read_client_headers(headers)
    sent = read.upstream(fallback_key="configured", fallback_header=header)
    if read.credential is not None:
        assert sent == read.forwarded
    else:
        expected = "Bearer configured" if header == "authorization" else "configured"
        assert sent == {**read.forwarded, header: expected}
    assert read.upstream(fallback_key=None, fallback_header=header) == read.forwarded
