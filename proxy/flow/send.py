"""Talking to the upstream: a request's headers read (those forwarded, and the
few the proxy reads itself, in one pass), sending, and the answers the proxy
gives in the upstream's place (an error read whole, its own error).

One :class:`~proxy.upstream.transport.Transport` (opened in the app's lifespan) sends
every request. This module is where the transport's errors become the proxy's
OpenAI-shaped ones (:func:`upstream_error`). The answer itself goes to the
client through :class:`proxy.flow.relay.Relay`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from starlette.responses import Response

from proxy.edge.errors import BadRequest, ProxyError, UpstreamTimeout, UpstreamUnreachable
from proxy.edge.headers import AUTH_HEADERS, PROXY_HEADERS
from proxy.session.naming import CLIENT_SESSION_HEADERS
from proxy.upstream.transport import (
    BodyLost,
    ConnectFailed,
    InvalidResponse,
    NoResponse,
    Transport,
    TransportError,
    TransportTimeout,
    UpstreamResponse,
)

logger = logging.getLogger(__name__)


def shown_url(url: str) -> str:
    """``url`` as a log line may name it: no user, password, query or fragment
    (a base URL may carry a key in any of them)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(unparsable URL)"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def log_failure(error: ProxyError, upstream: str, what: str) -> None:
    """The warning of an upstream that could not be reached or whose answer broke."""
    fields = {"status": error.status, "upstream": upstream, "code": error.code}
    logger.warning("%s", what, extra={"fields": fields})


#: Never forwarded in either direction: they describe one connection, or a
#: body the proxy re-encodes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        # The transport asks the upstream for identity encoding itself.
        "accept-encoding",
        # uvicorn answers a client's 100-continue; the transport sends bodies at once.
        "expect",
    }
)
#: Of an upstream's answer, as its head came (names lower-cased bytes): the
#: hop-by-hop ones, and its date, since uvicorn sends its own.
_NOT_RELAYED = frozenset({name.encode("latin-1") for name in HOP_BY_HOP} | {b"date"})


@dataclass(frozen=True, slots=True)
class ClientHeaders:
    """A request's headers as the proxy reads them, in one pass
    (:func:`read_client_headers`): those it forwards, and the first value of
    each it reads for itself."""

    #: The client's headers for the upstream, names lower-cased, less
    #: hop-by-hop ones and the proxy's own; a repeated one joined as one list.
    forwarded: dict[str, str]
    #: The first value of each of :data:`READ_FIRST`, as a server reads them.
    first: dict[str, str]
    #: The client's own key for the upstream: the first of ``AUTH_HEADERS``
    #: present (its last value, the one forwarded); ``None`` when it sent none.
    credential: str | None

    def upstream(self, *, fallback_key: str | None, fallback_header: str) -> dict[str, str]:
        """The headers to send: :attr:`forwarded`, with the configured key
        added only when the client sent none, as ``Authorization: Bearer``
        or (Anthropic) ``x-api-key``."""
        if not fallback_key or self.credential is not None:
            return self.forwarded
        if fallback_header == "authorization":
            return {**self.forwarded, "authorization": f"Bearer {fallback_key}"}
        return {**self.forwarded, fallback_header: fallback_key}


#: The headers whose first value the proxy reads: its figures' user agent, and
#: where clients name their session (:mod:`proxy.session.naming`).
READ_FIRST: Final = frozenset({"user-agent", *(name for name, _ in CLIENT_SESSION_HEADERS)})


def read_client_headers(client_headers: Iterable[tuple[str, str]]) -> ClientHeaders:
    """A request's headers read once (see :class:`ClientHeaders`).

    ``client_headers`` are the request's as the edge passed them on: every
    header holding the proxy key or the admin key is gone already
    (:class:`proxy.edge.guards.Edge`), whatever its name, so what is left of
    ``Authorization``, ``api-key`` and ``x-api-key`` is the client's own and
    forwarded unchanged.
    """
    forwarded: dict[str, str] = {}
    first: dict[str, str] = {}
    for name, value in client_headers:
        lower = name.lower()
        if lower in READ_FIRST and lower not in first:
            first[lower] = value
        if lower in HOP_BY_HOP or lower in PROXY_HEADERS:
            continue
        if lower in forwarded and lower not in AUTH_HEADERS:
            # A header sent twice is one list (RFC 9110 5.3): two anthropic-beta
            # lines are two betas. A credential is no list; its last is the one
            # forwarded, and the one the request's owner is read from.
            value = f"{forwarded[lower]}{'; ' if lower == 'cookie' else ', '}{value}"
        forwarded[lower] = value
    credential = None
    for name in AUTH_HEADERS:
        if name in forwarded:
            credential = forwarded[name]
            break
    return ClientHeaders(forwarded, first, credential)


def relayed_headers(
    upstream: UpstreamResponse, extra: Mapping[str, str]
) -> list[tuple[bytes, bytes]]:
    """The head of a response relaying ``upstream``'s, with ``extra`` headers."""
    headers: list[tuple[bytes, bytes]] = []
    for name, value in upstream.raw_headers:
        if name not in _NOT_RELAYED:
            headers.append((name, value))
    for extra_name, extra_value in extra.items():
        headers.append((extra_name.encode("latin-1"), extra_value.encode("latin-1")))
    return headers


def upstream_error(exc: TransportError) -> ProxyError:
    """The proxy's answer to a request the transport could not complete.

    The one place transport errors become OpenAI-shaped ones; the bodies say
    what kind of failure it was, never an address or the upstream's bytes.
    """
    if isinstance(exc, TransportTimeout):
        if exc.phase == "connect":
            return UpstreamTimeout("No upstream connection could be opened in time.")
        return UpstreamTimeout("The upstream did not answer in time.")
    if isinstance(exc, ConnectFailed):
        return UpstreamUnreachable(f"The upstream could not be reached: {exc}.")
    if isinstance(exc, InvalidResponse):
        return UpstreamUnreachable(f"The upstream sent an invalid response: {exc}.")
    if isinstance(exc, BodyLost):
        return UpstreamUnreachable(f"The upstream's answer broke off: {exc}.")
    if isinstance(exc, NoResponse):
        return UpstreamUnreachable("The upstream closed the connection without an answer.")
    return UpstreamUnreachable("The upstream could not be reached.")


async def send(
    transport: Transport,
    method: str,
    url: str,
    headers: Mapping[str, str],
    content: bytes | AsyncIterator[bytes] | None,
    *,
    upstream: str | None = None,
) -> UpstreamResponse:
    """Send and return the response once its head is in, its body unread.

    ``upstream`` is the base URL ``url`` was built on: what the log line of a
    failure names (by default ``url`` itself, shown without secrets).
    """
    try:
        return await transport.request(method, url, headers, content)
    except TransportError as exc:
        error = upstream_error(exc)
        log_failure(error, shown_url(upstream or url), "upstream not reached")
        raise error from exc
    except ValueError as exc:
        raise BadRequest(f"The request cannot be forwarded: {exc}.") from exc


async def read_whole(upstream: UpstreamResponse) -> bytes:
    """The whole body of an answer not yet relayed; a broken one is a 502."""
    try:
        return await upstream.read()
    except BodyLost as exc:
        error = upstream_error(exc)
        log_failure(error, shown_url(upstream.url), "upstream answer broke")
        raise error from exc


def relay_bytes(
    upstream: UpstreamResponse, body: bytes, extra_headers: Mapping[str, str]
) -> Response:
    """An already-read upstream response (an error), relayed as it was."""
    response = Response(body, status_code=upstream.status)
    response.raw_headers = [
        *relayed_headers(upstream, extra_headers),
        (b"content-length", b"%d" % len(body)),
    ]
    return response


def error_response(
    error: ProxyError, extra_headers: Mapping[str, str] | None = None, *, path: str = ""
) -> Response:
    """``error`` answered to a request for ``path``, in that API's error shape."""
    return Response(
        error.json_bytes(path),
        status_code=error.status,
        media_type="application/json",
        headers=dict(extra_headers or {}),
    )
