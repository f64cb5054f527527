"""Talking HTTP to the upstream: one maintained client (aiohttp) and its guards.

``client.py`` holds :class:`Transport` (the session, its limits and the
stale-connection guard), ``response.py`` the response the relay reads, and
``errors.py`` the transport's own error tree — translated into the proxy's
OpenAI-shaped errors in one place, ``proxy.flow.send``.

Semantics:

* ``connect_timeout`` bounds opening a connection and waiting for a free one
  in the pool; ``read_timeout`` bounds each wait for upstream bytes (the
  head, then every body chunk).
* A request is sent at most once, except when a pooled connection turns out
  to be unusable before a byte of the request was written.
* A body cut short, reset or malformed raises :class:`BodyLost`; the relay
  then makes the client's response broken too, never a clean end.
"""

from proxy.upstream.transport.client import MAX_HEAD_BYTES, Transport, tls_context
from proxy.upstream.transport.errors import (
    BodyLost,
    ConnectFailed,
    InvalidResponse,
    NoResponse,
    TransportError,
    TransportTimeout,
)
from proxy.upstream.transport.response import UpstreamResponse

__all__ = [
    "MAX_HEAD_BYTES",
    "BodyLost",
    "ConnectFailed",
    "InvalidResponse",
    "NoResponse",
    "Transport",
    "TransportError",
    "TransportTimeout",
    "UpstreamResponse",
    "tls_context",
]
