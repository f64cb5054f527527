"""Errors the proxy answers itself, in OpenAI's error shape (Anthropic's on
its Messages routes).

    ProxyError                  status + OpenAI-shaped body
     ├── BadRequest      400    the body is not a chat request we can read
     ├── Unauthorized    401    the proxy key is missing or wrong
     ├── Forbidden       403    a Host that is not local (DNS rebinding), a web
     │                          Origin not in server.cors_origins
     ├── NotFound        404    no such checkpoint (or not the caller's)
     ├── PayloadTooLarge 413    the body is above the size limit
     ├── UnsupportedMediaType 415  a chat body that is not JSON, or compressed
     ├── UpgradeRequired 426    a WebSocket upgrade: the proxy speaks HTTP only
     ├── UpstreamUnreachable 502  no connection to the upstream
     ├── ServiceUnavailable  503  the store behind the state endpoints is down
     └── UpstreamTimeout     504  the upstream said nothing in time

Upstream errors (status >= 400 from the upstream) are not ProxyErrors: they
are relayed as the upstream sent them. 502/504 bodies reveal nothing internal
(no URLs, no exception text), only what kind of failure it was.
"""

from __future__ import annotations

from typing import Any

import orjson


class ProxyError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_body(self) -> dict[str, Any]:
        """The same error in Anthropic's shape, for its Messages API."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def json_bytes(self, path: str = "") -> bytes:
        """The body of the answer to a request for ``path``: in the shape of the
        API the client speaks there (Anthropic's on its Messages routes, a
        client's SDK reads nothing else), OpenAI's everywhere else."""
        return orjson.dumps(self.anthropic_body() if anthropic_path(path) else self.body())


#: Anthropic's error types, by the status they come with.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def anthropic_path(path: str) -> bool:
    """Whether ``path`` is one of Anthropic's Messages routes (``/v1/messages``,
    ``/v1/messages/count_tokens``), whose clients read Anthropic's error shape."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(BadRequest):
    """The part of the conversation that is never dropped does not fit."""

    code = "context_length_exceeded"


class Unauthorized(ProxyError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class Forbidden(ProxyError):
    status = 403
    type = "invalid_request_error"
    code = "forbidden_host"


class NotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class PayloadTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaType(ProxyError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"


class UpgradeRequired(ProxyError):
    status = 426
    type = "invalid_request_error"
    code = "websocket_unsupported"


class UpstreamUnreachable(ProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class ServiceUnavailable(ProxyError):
    status = 503
    type = "server_error"
    code = "store_unavailable"


class UpstreamTimeout(ProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"
