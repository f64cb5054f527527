"""Plain ASGI middleware guarding who may talk to the proxy: :class:`Edge`.

* The Host check — when bound to loopback (or, whatever the bind address,
  with ``server.check_host``), a request whose ``Host`` is not a local name or
  in ``server.allowed_hosts`` is refused (a web page cannot reach the proxy
  through DNS rebinding).
* The Origin check — a request with an ``Origin`` header (one a browser
  sends for a web page) is refused unless that origin is in
  ``server.cors_origins``: a page's "simple" cross-site POST needs no CORS
  preflight, so without this it would reach the upstream and be billed to the
  user. Clients that are not browsers send no ``Origin`` and pass.
* The proxy key — when a proxy key is configured, every request but
  ``/healthz`` must present it, as ``Authorization: Bearer <key>`` or in the
  ``x-compaction-proxy-key`` header. The scope records which, so the handler
  knows whether the client's ``Authorization`` is meant for the upstream.
  With CORS headers configured, :class:`ProxyKeyGuard` checks it inside the
  CORS middleware instead.

Written directly against ASGI (no ``BaseHTTPMiddleware``, which hides client
disconnects from streaming responses).
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.edge.errors import Forbidden, ProxyError, Unauthorized
from proxy.flow.send import PROXY_KEY_HEADER

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
OPEN_PATHS = frozenset({"/healthz"})
#: Scope key set by ProxyKeyGuard: the proxy key came in ``Authorization``.
KEY_IN_AUTHORIZATION = "compaction_proxy.key_in_authorization"


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header[: host_header.find("]") + 1]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


async def _refuse(error: ProxyError, send: Send) -> None:
    body = error.json_bytes()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


@dataclasses.dataclass(frozen=True)
class _Presented:
    """The headers the guards read, each as first sent (one pass over them)."""

    host: str
    origin: str | None
    dedicated: str | None  #: the x-compaction-proxy-key header
    authorization: str


def _presented(scope: Scope) -> _Presented:
    host = origin = dedicated = authorization = None
    for key, value in scope.get("headers", ()):
        if key == b"host":
            host = value if host is None else host
        elif key == b"origin":
            origin = value if origin is None else origin
        elif key == _PROXY_KEY:
            dedicated = value if dedicated is None else dedicated
        elif key == b"authorization":
            authorization = value if authorization is None else authorization
    return _Presented(
        host=host.decode("latin-1") if host is not None else "",
        origin=origin.decode("latin-1") if origin is not None else None,
        dedicated=dedicated.decode("latin-1") if dedicated is not None else None,
        authorization=authorization.decode("latin-1") if authorization is not None else "",
    )


_PROXY_KEY = PROXY_KEY_HEADER.encode()


def _is_dashboard(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


class _ProxyKey:
    """Whether a request presents the proxy key, and where."""

    def __init__(self, key: str) -> None:
        self._key = key.encode()

    def _matches(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self._key)

    def check(self, scope: Scope, presented: _Presented) -> bool:
        """True (recording where the key came) when the request may pass."""
        if scope["path"] in OPEN_PATHS:
            return True
        authorization = presented.authorization
        bearer = authorization[7:].strip() if authorization.lower().startswith("bearer ") else None
        if self._matches(presented.dedicated):
            scope[KEY_IN_AUTHORIZATION] = False
        elif self._matches(bearer):
            scope[KEY_IN_AUTHORIZATION] = True
        else:
            return False
        return True


class ProxyKeyGuard:
    """The proxy-key check on its own, for the stack with CORS headers, where it
    sits inside the CORS middleware (a 401 needs CORS headers for a page to read
    it, and a preflight carries no key)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self._key = _ProxyKey(key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._key.check(scope, _presented(scope)):
            await _refuse(Unauthorized("A valid proxy key is required."), send)
            return
        await self.app(scope, receive, send)


class Edge:
    """Every check in front of the proxy in one plain ASGI callable, in order:
    the Host check (if ``allowed_hosts`` is given), the dashboard's pages
    straight to ``dashboard`` (they sign their visitors in themselves), the
    Origin check, then the proxy key (unless ``inner`` does it, inside CORS).

    One pass over the headers and one call into the app per request: the
    stack of one middleware per check cost a coroutine and a header scan each.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        dashboard: ASGIApp,
        allowed_hosts: Iterable[str] | None,
        allowed_origins: Iterable[str] = (),
        proxy_key: str | None = None,
        cors: Callable[[ASGIApp], ASGIApp] | None = None,
    ) -> None:
        self.dashboard = dashboard
        self.hosts = (
            None if allowed_hosts is None else LOCAL_NAMES | {h.lower() for h in allowed_hosts}
        )
        # Compared as CORSMiddleware compares them, so the two never disagree;
        # "null" (a sandboxed frame, a file: page) passes only if listed.
        self.origins = frozenset(allowed_origins)
        self.any_origin = "*" in self.origins
        if cors is None:
            self.app = app
            self.key = _ProxyKey(proxy_key) if proxy_key is not None else None
        else:
            self.app = cors(ProxyKeyGuard(app, proxy_key) if proxy_key is not None else app)
            self.key = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        presented = _presented(scope)
        if self.hosts is not None:
            host = _host_name(presented.host.lower())
            if host not in self.hosts:
                await _refuse(Forbidden(f"Host {host!r} is not allowed."), send)
                return
        if _is_dashboard(scope["path"]):
            await self.dashboard(scope, receive, send)
            return
        origin = presented.origin
        if origin is not None and not self.any_origin and origin not in self.origins:
            error = Forbidden(
                f"Requests from the web origin {origin[:200]!r} are not allowed; "
                "list it in server.cors_origins to allow it.",
                code="forbidden_origin",
            )
            await _refuse(error, send)
            return
        if self.key is not None and not self.key.check(scope, presented):
            await _refuse(Unauthorized("A valid proxy key is required."), send)
            return
        await self.app(scope, receive, send)
