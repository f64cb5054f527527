"""The transport's own errors: what went wrong on the wire, not what to answer.

    TransportError
     ├── ConnectFailed     no connection: refused, DNS, TLS (a bad certificate), the HTTP proxy
     ├── TransportTimeout  connecting, waiting for a free connection, or for the next byte
     ├── NoResponse        the connection closed (or reset) before a response began
     ├── InvalidResponse   the upstream's response head broke HTTP/1.1 or our limits
     └── BodyLost          the body broke after its head: cut short, reset, malformed

``proxy.flow.send`` turns them into the proxy's OpenAI-shaped errors, in one place.
The messages name the kind of failure only, never an address or the upstream's bytes.
"""

from __future__ import annotations


class TransportError(Exception):
    """Anything that kept a request from getting a whole response."""


class ConnectFailed(TransportError):
    pass


class TransportTimeout(TransportError):
    def __init__(self, message: str, *, phase: str) -> None:
        super().__init__(message)
        #: ``"connect"`` (opening, or waiting for a pooled connection) or ``"read"``.
        self.phase = phase


class NoResponse(TransportError):
    pass


class InvalidResponse(TransportError):
    pass


class BodyLost(TransportError):
    pass
