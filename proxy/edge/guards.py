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
  ``x-compaction-proxy-key`` header. With CORS headers configured,
  :class:`ProxyKeyGuard` refuses a request without it inside the CORS
  middleware instead.
* The proxy's own keys are taken out of the request before anything behind
  the edge reads it (:class:`_Secrets`): every ``x-compaction-proxy-key``
  header, and every other header whose value is the proxy key or the admin key,
  bare or as ``Bearer <key>`` (any case of ``Bearer``, any blanks around it),
  whatever its name and however many there are. So no later stage — the
  request sent upstream, the summarizer's and the background preparation's
  calls, the owner of the conversation — can see or pass on a key the client
  meant for the proxy, whichever other headers came with it; the client's own
  credentials stay. Only ``x-compaction-proxy-admin-key`` is left in, for
  :func:`proxy.edge.access.viewer` to check (it is never sent upstream:
  :func:`proxy.flow.send.read_client_headers` drops it by name).

* A WebSocket upgrade — no route of the proxy takes one — is answered
  ``426 Upgrade Required``, which sends Codex on over HTTP at once.

Written directly against ASGI (no ``BaseHTTPMiddleware``, which hides client
disconnects from streaming responses).
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.edge.errors import Forbidden, ProxyError, Unauthorized, UpgradeRequired
from proxy.edge.headers import ADMIN_KEY_HEADER, PROXY_KEY_HEADER

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
OPEN_PATHS = frozenset({"/healthz"})
#: Scope key set by :class:`Edge`: the request presented the proxy key (in
#: ``x-compaction-proxy-key`` or as ``Authorization: Bearer``). The header
#: itself is gone by then, so this is the only way to know it came.
PROXY_KEY_PRESENTED = "compaction_proxy.proxy_key_presented"

_PROXY_KEY = PROXY_KEY_HEADER.encode()
_ADMIN_KEY = ADMIN_KEY_HEADER.encode()
_BLANKS = b" \t"


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def _refuse(
    error: ProxyError, send: Send, path: str = "", response: str = "http.response"
) -> None:
    """Answer ``error``; ``response`` is the ASGI message kind (a WebSocket
    handshake's answer is ``websocket.http.response``)."""
    body = error.json_bytes(path)
    await send(
        {
            "type": f"{response}.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": f"{response}.body", "body": body})


async def _refuse_upgrade(scope: Scope, receive: Receive, send: Send) -> None:
    """A WebSocket upgrade answered ``426 Upgrade Required``.

    Codex's built-in provider tries the Responses API over a WebSocket first:
    a 426 sends it on over HTTP at once, where any other refusal (the 403 a
    server gives a WebSocket no route takes) makes it retry the upgrade,
    reporting an error each time, before it does (docs/clients.md, "Codex").
    """
    await receive()  # the client's websocket.connect
    if "websocket.http.response" in (scope.get("extensions") or {}):
        refusal = UpgradeRequired("This server speaks HTTP only: POST the request instead.")
        await _refuse(refusal, send, scope["path"], "websocket.http.response")
    else:  # a server without the extension can only say 403
        await send({"type": "websocket.close", "code": 1000})


def _bearer(value: bytes) -> bytes | None:
    """The token of ``Bearer <token>`` (any case, any blanks), else ``None``."""
    value = value.strip(_BLANKS)
    if len(value) > 6 and value[:6].lower() == b"bearer" and value[6] in _BLANKS:
        return value[6:].strip(_BLANKS)
    return None


class _Secrets:
    """The proxy's own keys: whether a header value is one of them."""

    def __init__(self, proxy_key: str | None, admin_key: str | None) -> None:
        self.proxy = proxy_key.encode() if proxy_key else None
        self.keys = tuple(key.encode() for key in (proxy_key, admin_key) if key)
        self._shortest = min((len(key) for key in self.keys), default=0)

    def is_proxy_key(self, token: bytes | None) -> bool:
        return (
            token is not None and self.proxy is not None and hmac.compare_digest(token, self.proxy)
        )

    def carried_by(self, value: bytes) -> bool:
        """Whether ``value`` is one of the keys, bare or as ``Bearer <key>``."""
        if not self.keys or len(value) < self._shortest:
            return False
        bare = value.strip(_BLANKS)
        bearer = _bearer(bare)
        found = False
        for key in self.keys:  # every key compared: the time tells nothing of which
            found |= hmac.compare_digest(bare, key)
            found |= bearer is not None and hmac.compare_digest(bearer, key)
        return found


@dataclasses.dataclass(frozen=True)
class _Presented:
    """What the guards read of a request's headers, in one pass over them."""

    host: str  #: the first Host header's name: lower case, without its port
    origin: str | None  #: the first Origin header
    proxy_key: bool  #: the proxy key came in x-compaction-proxy-key or Authorization: Bearer
    #: The headers without the proxy's keys; ``None`` when none was there to take out.
    kept: list[tuple[bytes, bytes]] | None


def _presented(scope: Scope, secrets: _Secrets) -> _Presented:
    host = origin = None
    proxy_key = False
    headers = scope.get("headers", ())
    kept: list[tuple[bytes, bytes]] | None = None
    for index, (key, value) in enumerate(headers):
        if key == b"host":
            host = value if host is None else host
        elif key == b"origin":
            origin = value if origin is None else origin
        if key == _PROXY_KEY:
            proxy_key |= secrets.is_proxy_key(value.strip(_BLANKS))
            strip = True
        elif key == _ADMIN_KEY:
            strip = False
        else:
            # Without keys of its own the proxy has nothing to take out.
            strip = bool(secrets.keys) and secrets.carried_by(value)
            if strip and key == b"authorization":
                proxy_key |= secrets.is_proxy_key(_bearer(value))
        if strip and kept is None:
            kept = list(headers[:index])
        elif not strip and kept is not None:
            kept.append((key, value))
    name = host.decode("latin-1").lower() if host is not None else ""
    if name.startswith("["):  # an IPv6 address: its port follows the bracket
        name = name[: name.find("]") + 1]
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    return _Presented(
        host=name,
        origin=origin.decode("latin-1") if origin is not None else None,
        proxy_key=proxy_key,
        kept=kept,
    )


def _may_pass(scope: Scope) -> bool:
    return scope["path"] in OPEN_PATHS or bool(scope.get(PROXY_KEY_PRESENTED, False))


class ProxyKeyGuard:
    """The proxy-key check on its own, for the stack with CORS headers, where it
    sits inside the CORS middleware (a 401 needs CORS headers for a page to read
    it, and a preflight carries no key). :class:`Edge` has read the key already
    (and taken it out); this refuses a request that did not present it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _may_pass(scope):
            await _refuse(Unauthorized("A valid proxy key is required."), send, scope["path"])
            return
        await self.app(scope, receive, send)


class Edge:
    """Every check in front of the proxy in one plain ASGI callable, in order:
    the Host check (if ``allowed_hosts`` is given), the proxy's keys taken out
    of the headers, the dashboard's pages straight to ``dashboard`` (they sign
    their visitors in themselves), the Origin check, then the proxy key (unless
    ``inner`` does it, inside CORS).

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
        admin_key: str | None = None,
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
        self.secrets = _Secrets(proxy_key, admin_key)
        guarded = proxy_key is not None
        if cors is None:
            self.app = app
            self.check_key = guarded
        else:
            self.app = cors(ProxyKeyGuard(app) if guarded else app)
            self.check_key = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no route of the proxy takes one
            await _refuse_upgrade(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        presented = _presented(scope, self.secrets)
        if self.hosts is not None:
            host = presented.host
            if host not in self.hosts:
                await _refuse(Forbidden(f"Host {host!r} is not allowed."), send, scope["path"])
                return
        scope = {**scope, PROXY_KEY_PRESENTED: presented.proxy_key}
        if presented.kept is not None:
            scope["headers"] = presented.kept
        path = scope["path"]
        if path == "/ui" or path.startswith("/ui/"):
            await self.dashboard(scope, receive, send)
            return
        origin = presented.origin
        if origin is not None and not self.any_origin and origin not in self.origins:
            error = Forbidden(
                f"Requests from the web origin {origin[:200]!r} are not allowed; "
                "list it in server.cors_origins to allow it.",
                code="forbidden_origin",
            )
            await _refuse(error, send, scope["path"])
            return
        if self.check_key and not _may_pass(scope):
            await _refuse(Unauthorized("A valid proxy key is required."), send, scope["path"])
            return
        await self.app(scope, receive, send)
