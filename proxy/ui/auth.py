"""Who is looking at the dashboard, and whether a POST on it is theirs.

A browser sends no ``Authorization`` header when it opens a page, so the
dashboard signs its visitor in once (``/ui/login``) and keeps a **signed
cookie** (HttpOnly, SameSite=Strict, path ``/ui``) naming the viewer, when it
was signed, and a random session id of its own:

* ``admin`` — whoever typed ``server.admin_key``: every owner's sessions;
* ``owner:<digest>`` — whoever typed the API key their agent sends: the
  sessions of that credential (:func:`proxy.edge.access.owner_digest`; the key
  itself is neither kept nor shown);
* ``anon:<nonce>`` — everyone else: the anonymous owner's (keyless) sessions, as on
  the state routes. With ``server.api_key`` set, ``anon`` sees nothing and
  is sent to the login page, which then asks for the proxy key too.

Clients that are not browsers may send the same headers as to the state
routes instead (the admin key header; the proxy key).

A sign-in lasts ``server.dashboard_session_hours`` (the cookie's ``Max-Age``;
the server refuses an older cookie whatever the browser kept). Signing out
(``POST /ui/logout``) revokes that session here, not only in the browser: a
copy of the cookie is refused from then on. The revoked ids are kept until
their cookies would have expired anyway, at most :data:`MAX_REVOKED` of them;
one more signs everyone out instead (a new signing secret), so that a flood of
sign-outs can never make the server forget a revocation.

Every POST carries a **CSRF token**, an HMAC of the cookie it was issued
with, and is refused when its ``Origin`` is not the dashboard's own. The
signing secret is drawn per process: a restart signs everyone out, and a
cookie is good only on the process that signed it — so the revocations, kept
in that process's memory, cover every place the cookie works (with replicas
behind a balancer, a visitor needs the balancer to keep them on one).
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from fastapi import Request
from pydantic import SecretStr

from proxy.edge.access import owner_digest, viewer
from proxy.edge.errors import Forbidden, ProxyError
from proxy.edge.guards import PROXY_KEY_PRESENTED
from proxy.edge.headers import ADMIN_KEY_HEADER

COOKIE: Final = "compaction_proxy_ui"
ANONYMOUS: Final = "anon"
ADMIN: Final = "admin"
#: Sessions signed out before their expiry, remembered at once. Each is a few
#: dozen bytes; ten thousand sign-outs within one session's lifetime is far
#: beyond a team's dashboard, and past it everyone is signed out instead.
MAX_REVOKED: Final = 10_000


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


@dataclass(frozen=True)
class SignedCookie:
    """What a dashboard cookie says, once its signature checked out."""

    role: str  #: ``admin``, ``owner:<digest>`` or ``anon:<nonce>``
    issued: int  #: when it was signed, in seconds of the signer's clock
    session: str  #: its random id: what signing out revokes


class _Revoked:
    """Session ids signed out before their expiry, each until it expires, at most ``cap``."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._ids: set[str] = set()
        self._expiries: list[tuple[float, str]] = []  # a heap: the soonest first

    def __contains__(self, session: str) -> bool:
        return session in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, session: str, expires: float, now: float) -> bool:
        """Remember ``session`` until ``expires``; False when there is no room left."""
        while self._expiries and self._expiries[0][0] <= now:
            self._ids.discard(heapq.heappop(self._expiries)[1])
        if session in self._ids:
            return True
        if len(self._ids) >= self._cap:
            return False
        self._ids.add(session)
        heapq.heappush(self._expiries, (expires, session))
        return True

    def clear(self) -> None:
        self._ids.clear()
        self._expiries.clear()


class Signer:
    """Signs cookies and CSRF tokens with one secret per process, and ends the
    sessions they name: at their expiry, or when signed out."""

    def __init__(
        self,
        admin_key: SecretStr | None,
        proxy_key: SecretStr | None,
        *,
        session_seconds: float,
        clock: Callable[[], float] = time.time,
        max_revoked: int = MAX_REVOKED,
    ) -> None:
        self._secret = secrets.token_bytes(32)
        self._admin_key = admin_key
        self._proxy_key = proxy_key
        self._lifetime = session_seconds
        self._clock = clock
        self._revoked = _Revoked(max_revoked)

    @property
    def max_age(self) -> int:
        """The cookie's ``Max-Age``: the sign-in's lifetime, in whole seconds."""
        return max(1, int(self._lifetime))

    @property
    def needs_proxy_key(self) -> bool:
        return self._proxy_key is not None

    def _mac(self, purpose: str, value: str) -> str:
        message = f"{purpose}\x1f{value}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]

    def cookie(self, role: str) -> str:
        """A new session for ``role``, signed now."""
        signed = f"{role}.{int(self._clock())}.{secrets.token_hex(16)}"
        return f"{signed}.{self._mac('cookie', signed)}"

    def anonymous_cookie(self) -> str:
        """A cookie of its own for each anonymous browser, so that a CSRF token
        issued to one is worth nothing in another."""
        return self.cookie(f"{ANONYMOUS}:{secrets.token_hex(8)}")

    def signed(self, cookie: str | None) -> SignedCookie | None:
        """What ``cookie`` says, if it is one of ours, still in its lifetime and
        not signed out; ``None`` otherwise."""
        parts = cookie.split(".") if cookie else ()
        if len(parts) != 4:
            return None
        role, issued, session, mac = parts
        expected = self._mac("cookie", f"{role}.{issued}.{session}")
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            return None
        # Signed here, so a number; the lifetime is counted from it, never
        # from what the browser kept.
        if self._clock() - int(issued) >= self._lifetime or session in self._revoked:
            return None
        return SignedCookie(role, int(issued), session)

    def role_of(self, cookie: str | None) -> str | None:
        signed = self.signed(cookie)
        return signed.role if signed is not None else None

    def sign_out(self, cookie: str | None) -> None:
        """End the session ``cookie`` names, here: a copy of it is refused from now on."""
        signed = self.signed(cookie)
        # Anyone may have an anonymous cookie for the asking: revoking one
        # protects nothing and would only take room from the sign-ins.
        if signed is None or _anonymous(signed.role):
            return
        if not self._revoked.add(signed.session, signed.issued + self._lifetime, self._clock()):
            # No room: rather than forget a revocation (a copied cookie would
            # work again), a new secret ends every session and every form token.
            self._secret = secrets.token_bytes(32)
            self._revoked.clear()

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
        if token is None or not hmac.compare_digest(token.encode(), self.csrf(cookie).encode()):
            raise Forbidden("The form has expired; reload the page and try again.")


def _anonymous(role: str) -> bool:
    return role == ANONYMOUS or role.startswith(f"{ANONYMOUS}:")


def _viewer_of(role: str) -> str | None:
    return None if role == ADMIN else role.removeprefix("owner:")
