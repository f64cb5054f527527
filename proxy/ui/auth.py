"""Who is looking at the dashboard, and whether a POST on it is theirs.

A browser sends no ``Authorization`` header when it opens a page, so the
dashboard signs its visitor in once (``/ui/login``) and keeps a **signed
cookie** (HttpOnly, SameSite=Strict, path ``/ui``) naming the viewer:

* ``admin`` — whoever typed ``server.admin_key``: every owner's sessions;
* ``owner:<digest>`` — whoever typed the API key their agent sends: the
  sessions of that credential (:func:`proxy.edge.access.owner_digest`; the key
  itself is neither kept nor shown);
* ``anon:<nonce>`` — everyone else: the anonymous owner's (keyless) sessions, as on
  the state routes. With ``server.api_key`` set, ``anon`` sees nothing and
  is sent to the login page, which then asks for the proxy key too.

Clients that are not browsers may send the same headers as to the state
routes instead (the admin key header; the proxy key).

Every POST carries a **CSRF token**, an HMAC of the cookie it was issued
with, and is refused when its ``Origin`` is not the dashboard's own. The
signing secret is drawn per process: a restart signs everyone out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Final

from fastapi import Request
from pydantic import SecretStr

from proxy.edge.access import owner_digest, viewer
from proxy.edge.errors import Forbidden, ProxyError
from proxy.edge.guards import PROXY_KEY_PRESENTED
from proxy.flow.send import ADMIN_KEY_HEADER

COOKIE: Final = "compaction_proxy_ui"
ANONYMOUS: Final = "anon"
ADMIN: Final = "admin"


class SignInRequired(ProxyError):
    """The dashboard needs its visitor signed in (answered with a redirect)."""

    status = 401


@dataclass(frozen=True)
class Visitor:
    """A dashboard visitor: whose state they see, and the cookie that says so."""

    viewer: str | None  #: the owner shown; None for the admin
    role: str  #: ``admin``, ``owner:<digest>`` or ``anon``
    cookie: str  #: the signed cookie value (set again if it was missing)
    fresh: bool  #: the cookie must be sent to the browser


class Signer:
    """Signs cookies and CSRF tokens with one secret per process."""

    def __init__(self, admin_key: SecretStr | None, proxy_key: SecretStr | None) -> None:
        self._secret = secrets.token_bytes(32)
        self._admin_key = admin_key
        self._proxy_key = proxy_key

    @property
    def needs_proxy_key(self) -> bool:
        return self._proxy_key is not None

    def _mac(self, purpose: str, value: str) -> str:
        message = f"{purpose}\x1f{value}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]

    def cookie(self, role: str) -> str:
        return f"{role}.{self._mac('cookie', role)}"

    def anonymous_cookie(self) -> str:
        """A cookie of its own for each anonymous browser, so that a CSRF token
        issued to one is worth nothing in another."""
        return self.cookie(f"{ANONYMOUS}:{secrets.token_hex(8)}")

    def role_of(self, cookie: str | None) -> str | None:
        if not cookie or "." not in cookie:
            return None
        role, _, mac = cookie.rpartition(".")
        return role if hmac.compare_digest(mac, self._mac("cookie", role)) else None

    def csrf(self, cookie: str) -> str:
        return self._mac("csrf", cookie)

    def visitor(self, request: Request) -> Visitor:
        """The visitor of ``request``; raises :class:`SignInRequired` when the
        dashboard needs a sign-in first."""
        cookie = request.cookies.get(COOKIE)
        role = self.role_of(cookie)
        if role is not None and cookie is not None and not _anonymous(role):
            return Visitor(_viewer_of(role), role, cookie, fresh=False)
        # A client that is not a browser, with the headers of the state routes.
        keyed = self._has_proxy_key(request)
        if (keyed or request.headers.get(ADMIN_KEY_HEADER) is not None) and (
            self._proxy_key is None or keyed
        ):
            seen = viewer(request, self._admin_key)
            made = ADMIN if seen is None else f"owner:{seen}"
            return Visitor(seen, made, self.cookie(made), fresh=False)
        if self._proxy_key is not None:
            raise SignInRequired("Sign in to the dashboard first.")
        if role is not None and cookie is not None:
            return Visitor(owner_digest(""), ANONYMOUS, cookie, fresh=False)
        return Visitor(owner_digest(""), ANONYMOUS, self.anonymous_cookie(), fresh=True)

    def _has_proxy_key(self, request: Request) -> bool:
        # The edge checked the header and took it out (proxy.edge.guards).
        return self._proxy_key is not None and bool(request.scope.get(PROXY_KEY_PRESENTED))

    def sign_in(self, key: str, proxy_key: str) -> str:
        """The role ``key`` (an API key or the admin key) signs in as; refused
        when the proxy key is required and ``proxy_key`` is not it."""
        expected = self._proxy_key
        if expected is not None and not hmac.compare_digest(
            proxy_key.encode(), expected.get_secret_value().encode()
        ):
            raise Forbidden("That is not the proxy key.")
        admin = self._admin_key
        if admin is not None and hmac.compare_digest(
            key.encode(), admin.get_secret_value().encode()
        ):
            return ADMIN
        return (
            f"owner:{owner_digest(key)}" if key.strip() else f"{ANONYMOUS}:{secrets.token_hex(8)}"
        )

    def check_post(self, request: Request, cookie: str, token: str | None) -> None:
        """Refuse a POST that is not from the dashboard's own pages."""
        origin = request.headers.get("origin")
        host = request.headers.get("host", "")
        if origin is not None and origin.split("://", 1)[-1] != host:
            raise Forbidden("This action must come from the dashboard's own page.")
        if token is None or not hmac.compare_digest(token, self.csrf(cookie)):
            raise Forbidden("The form has expired; reload the page and try again.")


def _anonymous(role: str) -> bool:
    return role == ANONYMOUS or role.startswith(f"{ANONYMOUS}:")


def _viewer_of(role: str) -> str | None:
    return None if role == ADMIN else role.removeprefix("owner:")
