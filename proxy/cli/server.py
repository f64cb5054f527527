"""Running the proxy under uvicorn, with deadlines on what clients send.

uvicorn bounds the idle time between requests (``timeout_keep_alive``) but
nothing while a request is being received: a client that sends half its
headers, or stops half-way through its body, holds a connection and a
descriptor for ever, and some thousand of them lock every other client out.
The protocol :func:`server_config` gives uvicorn adds what it lacks, at the
one level that sees a request before it is complete:

* **headers** — complete within ``server.header_timeout_seconds`` of the
  connection opening (or of the first byte of its next request), and at most
  :data:`MAX_HEADER_BYTES`; otherwise the connection is closed;
* **body** — no pause longer than ``server.body_timeout_seconds`` between
  two pieces of it (while the proxy itself is not the one holding the reading
  back, as when it streams an upload on to a slower upstream);
* **connections** — at most ``server.max_connections`` open at once, so
  descriptors remain for the upstream and the store. A new connection past
  it closes idle ones — keep-alive connections between requests, and ones
  that have sent nothing yet — the longest idle first; only when connections
  with a request in flight fill the cap is it answered 503 and closed. So
  clients that ask once and then sit on their keep-alive connections cannot
  keep a newcomer out. (HTTP/1.1 runs one request per connection at a time,
  so this caps the requests in flight too.)

A response, however long it streams, is never cut: no deadline runs while
the request is complete.

An HTTP/1.0 client cannot read chunked transfer coding (RFC 9112 §6.1), and
uvicorn's httptools protocol chunks every response that states no length; so
a 1.0 client's such response — a stream — goes unchunked, its end the
connection's close (:class:`_UntilClose`). (uvicorn's h11 protocol does this
itself.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import socket
import sys
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from config import Settings
from proxy.app import create_app
from proxy.flow.send import shown_url
from proxy.state import logs

#: Seconds open streams get to finish after SIGTERM; the app's own shutdown
#: follows, bounded whatever the store does (proxy.app.shutdown_seconds).
GRACEFUL_SHUTDOWN_SECONDS = 30
#: A request's headers larger than this close the connection (h11's own
#: limit is set to it too; httptools has none).
MAX_HEADER_BYTES = 64 * 1024
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n"
    b"content-length: 26\r\nconnection: close\r\n\r\nToo many open connections.\n"
)


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """What a client may hold of the server while it sends a request."""

    header_seconds: float
    body_seconds: float
    max_connections: int

    @classmethod
    def of(cls, settings: Settings) -> ReadLimits:
        server = settings.server
        return cls(
            server.header_timeout_seconds, server.body_timeout_seconds, server.max_connections
        )


class _ReadDeadlines:
    """The deadlines above, over either of uvicorn's HTTP/1.1 protocols (it
    reads what both keep: the current request's cycle, the flow control, the
    set of open connections)."""

    limits: ClassVar[ReadLimits]
    # uvicorn's, on the protocol this is mixed into:
    transport: asyncio.Transport
    cycle: Any
    flow: Any
    connections: set[Any]

    _deadline: asyncio.TimerHandle | None = None
    #: What the connection is waiting for: "headers", "body" or "" (nothing).
    _awaiting = ""
    _header_bytes = 0
    #: Since when (the loop's clock) the connection has had no request in
    #: flight; ``None`` while it has one.
    idle_since: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self.idle_since = asyncio.get_running_loop().time()
        if len(self.connections) > self.limits.max_connections and not self._room():
            self.transport.write(_FULL)
            self.transport.close()
            return
        self._await("headers")

    def _room(self) -> bool:
        """Make room for this connection under the cap by closing idle ones,
        the longest idle first; False when those with a request in flight
        leave none."""
        others = [
            other
            for other in self.connections
            if other is not self and not other.transport.is_closing()
        ]
        excess = len(others) + 1 - self.limits.max_connections
        if excess <= 0:
            return True
        idle = sorted(
            (other for other in others if other.idle_since is not None),
            key=lambda other: other.idle_since,
        )
        if len(idle) < excess:
            return False
        for other in idle[:excess]:
            other.transport.close()
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        cycle = self.cycle
        if not self.transport.is_closing() and (cycle is None or cycle.response_complete):
            self.idle_since = asyncio.get_running_loop().time()  # until its next request

    def data_received(self, data: bytes) -> None:
        self.idle_since = None
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            awaiting = "headers"  # the bytes were the start of a request
        elif cycle.more_body:
            awaiting = "body"
        else:
            awaiting = ""
        if awaiting == "headers":
            self._header_bytes += len(data) if self._awaiting == "headers" else 0
            if self._header_bytes > MAX_HEADER_BYTES:
                self.transport.close()
                return
        # The header deadline runs from the first byte; the body's from the last.
        if awaiting == "body" or awaiting != self._awaiting:
            self._await(awaiting)

    def connection_lost(self, exc: Exception | None) -> None:
        self._await("")
        super().connection_lost(exc)  # type: ignore[misc]

    def _await(self, what: str) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if what != self._awaiting:
            self._header_bytes = 0
        self._awaiting = what
        if what:
            seconds = self.limits.header_seconds if what == "headers" else self.limits.body_seconds
            self._deadline = asyncio.get_running_loop().call_later(seconds, self._expired)

    def _expired(self) -> None:
        self._deadline = None
        if self._awaiting == "body" and self.flow is not None and self.flow.read_paused:
            self._await("body")  # the proxy holds the reading back, not the client
            return
        self.transport.close()


class _UntilClose(RequestResponseCycle):
    """An HTTP/1.0 request's cycle: a response that states no length is sent as
    it comes, unchunked, and ended by closing the connection (a 1.0 request is
    never kept alive, so it is closed after the response anyway)."""

    _until_close = False

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and self._unbounded(message):
            # Not None: uvicorn then adds no chunked coding; the length is
            # "unknown", counted down by what is written.
            self.chunked_encoding = False
            self.expected_content_length = sys.maxsize
            self._until_close = True
        elif (
            message["type"] == "http.response.body"
            and self._until_close
            and not message.get("more_body", False)
        ):
            self.expected_content_length = len(message.get("body", b""))  # it ends here
        await super().send(message)

    def _unbounded(self, message: Any) -> bool:
        headers = message.get("headers", [])
        stated = any(
            name.lower() in (b"content-length", b"transfer-encoding") for name, _ in headers
        )
        return not (stated or self.scope["method"] == "HEAD" or message["status"] in (204, 304))


class _GuardedHttpTools(_ReadDeadlines, HttpToolsProtocol):
    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope.get("http_version") == "1.0":
            cycle.__class__ = _UntilClose  # made by uvicorn; only its send differs


class _GuardedH11(_ReadDeadlines, H11Protocol):
    pass


def guarded_protocol(limits: ReadLimits, *, h11: bool = False) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools, or h11) with ``limits`` applied."""
    base = _GuardedH11 if h11 else _GuardedHttpTools
    return cast(type[asyncio.Protocol], type(base.__name__, (base,), {"limits": limits}))


def server_config(
    settings: Settings, app: ASGIApp, *, log_level: str = "info", **extra: Any
) -> uvicorn.Config:
    """How ``serve`` runs ``app`` (and the tests that need its real sockets)."""
    return uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        loop="auto",
        http=guarded_protocol(ReadLimits.of(settings)),
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        log_level=log_level,
        log_config=None,  # keep the handler configured above (text or JSON) for uvicorn too
        server_header=False,
        # The proxy writes its own line per request (proxy/state/logs.py), with the
        # figures that matter; uvicorn's would be a second one.
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        **extra,
    )


def startup_line(settings: Settings) -> str:
    """Where the proxy listens and every upstream it sends to (no secrets)."""
    server, upstream = settings.server, settings.upstream
    line = (
        f"compaction-proxy on http://{server.host}:{server.port}/v1 → "
        f"chat and responses {shown_url(upstream.base_url)}, "
        f"anthropic {shown_url(upstream.anthropic_base_url)}"
    )
    own = [
        f"{name} {shown_url(url)}"
        for name, model in settings.models.items()
        for url in (model.upstream, model.anthropic_upstream)
        if url is not None
    ]
    if own:
        line += "; models: " + ", ".join(own)
    return line


class CannotListen(OSError):
    """The address to serve on cannot be bound (in use, not this machine's, …)."""


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket ``serve`` listens on, bound before anything starts: a port in
    use is said at once, in one line, rather than after the app started up."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        raise CannotListen(f"cannot listen on {shown}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


def serve(settings: Settings, *, log_level: str = "info") -> None:
    logs.configure(log_level, settings.server.log_format)
    sock = listening_socket(settings.server.host, settings.server.port)
    logging.getLogger("compaction_proxy").info("%s", startup_line(settings))
    app = create_app(settings)
    # What importing left behind lives as long as the process: set apart from
    # the collector, whose full passes would otherwise walk it again and again
    # (~16 µs a request on average in-process, and a pause of ~0.1 s every few
    # thousand requests; 2 µs frozen). Only here, in the one long-lived process:
    # an app made in a test must stay collectable.
    gc.collect()
    gc.freeze()
    _Server(server_config(settings, app, log_level=log_level)).run(sockets=[sock])


class _Server(uvicorn.Server):
    """uvicorn's server, its log written out before a signal it caught is raised
    again: that ends the process as the signal would, running no exit handler,
    so lines still waiting for the log's writer thread would be lost."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                logs.flush()
