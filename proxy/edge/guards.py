"""Plain ASGI middleware guarding who may talk to the proxy.

* :class:`HostGuard` — when bound to loopback (or, whatever the bind address,
  with ``server.check_host``), a request whose ``Host`` is not a local name or
  in ``server.allowed_hosts`` is refused (a web page cannot reach the proxy
  through DNS rebinding).
* :class:`OriginGuard` — a request with an ``Origin`` header (one a browser
  sends for a web page) is refused unless that origin is in
  ``server.cors_origins``: a page's "simple" cross-site POST needs no CORS
  preflight, so without this it would reach the upstream and be billed to the
  user. Clients that are not browsers send no ``Origin`` and pass.
* :class:`ProxyKeyGuard` — when a proxy key is configured, every request but
  ``/healthz`` must present it, as ``Authorization: Bearer <key>`` or in the
  ``x-compaction-proxy-key`` header. The scope records which, so the handler
  knows whether the client's ``Authorization`` is meant for the upstream.

Written directly against ASGI (no ``BaseHTTPMiddleware``, which hides client
disconnects from streaming responses).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable

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


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


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


class HostGuard:
    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = LOCAL_NAMES | {h.lower() for h in allowed_hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = _host_name((_header(scope, b"host") or "").lower())
            if host not in self.allowed:
                await _refuse(Forbidden(f"Host {host!r} is not allowed."), send)
                return
        await self.app(scope, receive, send)


class OriginGuard:
    def __init__(self, app: ASGIApp, allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        # Compared as CORSMiddleware compares them, so the two never disagree;
        # "null" (a sandboxed frame, a file: page) passes only if listed.
        self.allowed = frozenset(allowed_origins)
        self.any = "*" in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.any:
            origin = _header(scope, b"origin")
            if origin is not None and origin not in self.allowed:
                error = Forbidden(
                    f"Requests from the web origin {origin[:200]!r} are not allowed; "
                    "list it in server.cors_origins to allow it.",
                    code="forbidden_origin",
                )
                await _refuse(error, send)
                return
        await self.app(scope, receive, send)


class ProxyKeyGuard:
    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self._key = key.encode()

    def _matches(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self._key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        dedicated = _header(scope, PROXY_KEY_HEADER.encode())
        authorization = _header(scope, b"authorization") or ""
        bearer = authorization[7:].strip() if authorization.lower().startswith("bearer ") else None
        if self._matches(dedicated):
            scope[KEY_IN_AUTHORIZATION] = False
        elif self._matches(bearer):
            scope[KEY_IN_AUTHORIZATION] = True
        else:
            await _refuse(Unauthorized("A valid proxy key is required."), send)
            return
        await self.app(scope, receive, send)
