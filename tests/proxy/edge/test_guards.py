"""The Host check (proxy/edge/guards.py, Edge) as create_app switches it on.

The apps here are told they bind 0.0.0.0 (as the Docker image does) while
their clients reach them in-process, so only ``server.check_host`` decides.
"""

from __future__ import annotations

import httpx
import pytest

from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.servers import FakeUpstream

HI = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
REBOUND = "evil.example.com"


def _chat(proxy: InProcessProxy, host: str) -> httpx.Response:
    return proxy.http.post(f"{proxy.url}/chat/completions", json=HI, headers={"host": host})


def test_a_rebinding_host_is_refused_on_all_interfaces_when_checked(
    start_app: AppFactory,
    fake_upstream: FakeUpstream,
) -> None:
    proxy = start_app(server={"host": "0.0.0.0", "check_host": True})
    refused = _chat(proxy, f"{REBOUND}:8808")
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == f"Host {REBOUND!r} is not allowed."
    assert fake_upstream.received == []
    # /healthz is no way round it either.
    health = proxy.http.get(proxy.url.removesuffix("/v1") + "/healthz", headers={"host": REBOUND})
    assert health.status_code == 403


@pytest.mark.parametrize("host", ["127.0.0.1:8808", "localhost:8808", "[::1]:8808", "localhost"])
def test_local_hosts_pass_the_check(
    start_app: AppFactory, fake_upstream: FakeUpstream, host: str
) -> None:
    proxy = start_app(server={"host": "0.0.0.0", "check_host": True})
    assert _chat(proxy, host).status_code == 200
    assert len(fake_upstream.received) == 1


def test_allowed_hosts_pass_the_check_and_others_do_not(start_app: AppFactory) -> None:
    proxy = start_app(
        server={"host": "0.0.0.0", "check_host": True, "allowed_hosts": ["Proxy.Internal"]}
    )
    assert _chat(proxy, "proxy.internal:8808").status_code == 200
    assert _chat(proxy, "PROXY.INTERNAL").status_code == 200
    assert _chat(proxy, "other.internal:8808").status_code == 403


def test_without_the_setting_a_non_loopback_bind_skips_the_check(
    start_app: AppFactory,
) -> None:
    # The default for a proxy deliberately bound to the network (behind a
    # load balancer that sends its own Host): unchanged by the new setting.
    proxy = start_app(server={"host": "0.0.0.0"})
    assert _chat(proxy, REBOUND).status_code == 200


def test_the_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from config import load_settings

    monkeypatch.setenv("COMPACTION_PROXY_SERVER__CHECK_HOST", "true")
    monkeypatch.setenv("COMPACTION_PROXY_SERVER__ALLOWED_HOSTS", '["proxy.internal"]')
    server = load_settings(None).server
    assert server.check_host is True
    assert server.allowed_hosts == ["proxy.internal"]


# --- the order of the checks, all in one Edge ----------------------------------

ORIGIN = "https://app.example"


def test_with_cors_a_preflight_needs_no_key_and_a_401_carries_cors_headers(
    start_app: AppFactory,
) -> None:
    proxy = start_app(server={"api_key": "sk-proxy", "cors_origins": [ORIGIN]})
    preflight = proxy.http.options(
        "/v1/chat/completions",
        headers={"origin": ORIGIN, "access-control-request-method": "POST"},
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    refused = proxy.http.post("/v1/chat/completions", json=HI, headers={"origin": ORIGIN})
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == ORIGIN
    allowed = proxy.http.post(
        "/v1/chat/completions",
        json=HI,
        headers={"origin": ORIGIN, "authorization": "Bearer sk-proxy"},
    )
    assert allowed.status_code == 200


def test_a_foreign_origin_is_refused_before_the_key_is_asked_for(start_app: AppFactory) -> None:
    proxy = start_app(server={"api_key": "sk-proxy"})
    foreign = proxy.http.post("/v1/chat/completions", json=HI, headers={"origin": ORIGIN})
    assert foreign.status_code == 403
    assert foreign.json()["error"]["code"] == "forbidden_origin"
    assert proxy.http.post("/v1/chat/completions", json=HI).status_code == 401
    assert proxy.http.get("/healthz").status_code == 200


def test_the_dashboard_passes_the_key_and_origin_checks_but_not_the_host_check(
    start_app: AppFactory,
) -> None:
    proxy = start_app(server={"api_key": "sk-proxy", "check_host": True})
    page = proxy.http.get("/ui", headers={"origin": ORIGIN})
    assert page.status_code not in (401, 403)  # the page signs its visitors in itself
    rebound = proxy.http.get("/ui", headers={"host": REBOUND})
    assert rebound.status_code == 403


def test_a_client_that_is_not_a_browser_reads_the_dashboard_with_the_key_headers(
    start_app: AppFactory,
) -> None:
    # The edge takes the key headers out before the pages run; what the
    # pages go by is that the key came.
    proxy = start_app(server={"api_key": "sk-proxy", "admin_key": "sk-admin"})
    admin = {"x-compaction-proxy-admin-key": "sk-admin"}
    for presented in ({"x-compaction-proxy-key": "sk-proxy"}, {"authorization": "Bearer sk-proxy"}):
        page = proxy.http.get("/ui", headers={**presented, **admin})
        assert page.status_code == 200
        assert "sk-proxy" not in page.text and "sk-admin" not in page.text
    for wrong in ({}, {"x-compaction-proxy-key": "guess"}, {"authorization": "Bearer guess"}):
        refused = proxy.http.get("/ui", headers={**wrong, **admin})
        assert refused.status_code == 303 and refused.headers["location"] == "/ui/login"
