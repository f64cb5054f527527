"""Dashboard sign-ins end: at the lifetime setting, and on the server when signed out.

The signer's own tests run it on a clock the test moves (no sleeping); the
page tests run the app in-process and carry a cookie from one client to
another, as a copied cookie would be.
"""

from __future__ import annotations

import re

import httpx
import pytest
from pydantic import SecretStr
from starlette.requests import Request

from proxy.edge.errors import Forbidden
from proxy.ui.auth import COOKIE, Signer, SignInRequired
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy

HOUR = 3600.0
LIFETIME = 12 * HOUR
ALICE = "sk-alice-0123456789"
PROXY_KEY = "proxy-secret-1717"
ADMIN = "admin-secret-4242"
MODELS = {"gpt-4o": {"context_window": 8192}}


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _signer(clock: Clock, *, proxy_key: str | None = PROXY_KEY, max_revoked: int = 100) -> Signer:
    return Signer(
        SecretStr(ADMIN),
        SecretStr(proxy_key) if proxy_key is not None else None,
        session_seconds=LIFETIME,
        clock=clock,
        max_revoked=max_revoked,
    )


def _request(cookie: str) -> Request:
    headers = [(b"cookie", f"{COOKIE}={cookie}".encode()), (b"host", b"127.0.0.1")]
    return Request({"type": "http", "method": "GET", "path": "/ui", "headers": headers})


# --- the signer, on a clock of the test's --------------------------------------


def test_a_cookie_is_good_until_the_lifetime_and_refused_from_then_on() -> None:
    clock = Clock()
    signer = _signer(clock)
    cookie = signer.cookie("owner:abc")
    clock.now += LIFETIME - 1
    assert signer.role_of(cookie) == "owner:abc"
    assert signer.visitor(_request(cookie)).role == "owner:abc"
    clock.now += 1
    assert signer.role_of(cookie) is None
    # As a visitor: sent to sign in, as without a cookie.
    with pytest.raises(SignInRequired):
        signer.visitor(_request(cookie))


def test_a_cookie_whose_issue_time_was_changed_is_refused() -> None:
    clock = Clock()
    signer = _signer(clock)
    cookie = signer.cookie("admin")
    role, issued, session, mac = cookie.split(".")
    clock.now += LIFETIME + 5
    assert signer.role_of(cookie) is None
    for later in (int(issued) + LIFETIME, int(clock.now)):
        assert signer.role_of(f"{role}.{int(later)}.{session}.{mac}") is None
    # Nor is a cookie of the old shape (a role and its MAC, no time at all).
    assert signer.role_of(f"{role}.{mac}") is None
    assert signer.role_of(f"{role}.{issued}.{session}.{mac}.x") is None


def test_signing_out_refuses_that_cookie_and_no_other() -> None:
    clock = Clock()
    signer = _signer(clock)
    mine, other = signer.cookie("owner:a"), signer.cookie("owner:a")
    copy_of_mine = str(mine)  # what a second browser, or a thief, would send
    signer.sign_out(mine)
    assert signer.role_of(copy_of_mine) is None
    with pytest.raises(SignInRequired):
        signer.visitor(_request(copy_of_mine))
    assert signer.role_of(other) == "owner:a"  # another sign-in of the same key lives on


def test_the_form_token_of_a_live_session_still_works_and_of_another_does_not() -> None:
    clock = Clock()
    signer = _signer(clock)
    cookie, other = signer.cookie("owner:a"), signer.cookie("owner:a")
    request = _request(cookie)
    signer.check_post(request, cookie, signer.csrf(cookie))  # no refusal
    with pytest.raises(Forbidden, match="expired"):
        signer.check_post(request, cookie, signer.csrf(other))
    with pytest.raises(Forbidden, match="expired"):
        signer.check_post(request, cookie, "é" * 32)  # not ASCII: refused, not a crash


def test_revocations_are_forgotten_once_their_cookies_would_have_expired() -> None:
    clock = Clock()
    signer = _signer(clock, max_revoked=2)
    for _ in range(2):
        signer.sign_out(signer.cookie("owner:a"))
    clock.now += LIFETIME
    live = signer.cookie("owner:b")
    for _ in range(2):  # room again: the first two expired, nothing else is lost
        signer.sign_out(signer.cookie("owner:c"))
    assert signer.role_of(live) == "owner:b"


def test_with_no_room_for_one_more_revocation_everyone_is_signed_out() -> None:
    clock = Clock()
    signer = _signer(clock, max_revoked=2)
    revoked = [signer.cookie("owner:a") for _ in range(3)]
    live = signer.cookie("admin")
    for cookie in revoked:
        signer.sign_out(cookie)
    # No revocation was forgotten to make room: every session ended instead.
    assert all(signer.role_of(cookie) is None for cookie in revoked)
    assert signer.role_of(live) is None
    fresh = signer.cookie("admin")
    assert signer.role_of(fresh) == "admin"
    signer.check_post(_request(fresh), fresh, signer.csrf(fresh))


def test_signing_out_an_anonymous_cookie_takes_no_room() -> None:
    clock = Clock()
    signer = _signer(clock, proxy_key=None, max_revoked=1)
    live = signer.cookie("owner:a")
    for _ in range(5):
        signer.sign_out(signer.anonymous_cookie())
    assert signer.role_of(live) == "owner:a"


# --- the pages --------------------------------------------------------------------


def _root(proxy: InProcessProxy) -> str:
    return proxy.url.removesuffix("/v1")


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "every form carries a CSRF token"
    return found.group(1)


def _sign_in(client: httpx.Client, key: str, proxy_key: str = "") -> httpx.Response:
    token = _csrf(client.get("/ui/login").text)
    return client.post("/ui/login", data={"csrf": token, "key": key, "proxy_key": proxy_key})


def test_a_cookie_copied_before_signing_out_is_refused_after_it(start_app: AppFactory) -> None:
    proxy = start_app(models=MODELS, server={"api_key": PROXY_KEY, "admin_key": ADMIN})
    base = _root(proxy)
    with proxy.client(base_url=base) as browser:
        assert _sign_in(browser, ADMIN, proxy_key=PROXY_KEY).status_code == 303
        copied = browser.cookies[COOKIE]
        page = browser.get("/ui")
        assert page.status_code == 200
        token = _csrf(page.text)
        signed_out = browser.post("/ui/logout", data={"csrf": token})
        assert signed_out.status_code == 303
        assert "Max-Age=0" in signed_out.headers["set-cookie"]
    with proxy.client(base_url=base, cookies={COOKIE: copied}) as thief:
        # The same answer as for no cookie at all: to the login page.
        refused = thief.get("/ui")
        assert refused.status_code == 303 and refused.headers["location"] == "/ui/login"
        # Nor does the page's token, bound to that cookie, work a button any more.
        button = thief.post("/ui/sessions/abc/compact", data={"csrf": token})
        assert button.status_code == 303 and button.headers["location"] == "/ui/login"
        assert thief.get("/ui/sessions/abc").headers["location"] == "/ui/login"


def test_the_sign_in_cookie_is_httponly_strict_and_lasts_the_setting(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS, server={"dashboard_session_hours": 2})
    with proxy.client(base_url=_root(proxy)) as browser:
        first = browser.get("/ui")
        signed_in = _sign_in(browser, ALICE)
        assert signed_in.status_code == 303
        for response in (first, signed_in):
            attributes = [a.strip().lower() for a in response.headers["set-cookie"].split(";")]
            assert {"httponly", "samesite=strict", "path=/ui", "max-age=7200"} <= set(attributes)
        # The page's token works with the new cookie: a button is answered.
        token = _csrf(browser.get("/ui").text)
        assert browser.post("/ui/logout", data={"csrf": token}).status_code == 303
