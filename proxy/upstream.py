"""Talking to the upstream: request headers, sending, and relaying the answer.

One :class:`~proxy.transport.Transport` (created in the app's lifespan) owns
the connection pool. Responses are relayed as they arrive — no buffering, no
re-chunking — and always closed, also when the client goes away mid-stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Mapping

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.errors import BadRequest, ProxyError
from proxy.transport import HIGH_WATER, BodyLost, Transport, UpstreamResponse
from proxy.usage import UsageTap

logger = logging.getLogger(__name__)

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
AUTH_HEADERS = ("authorization", "api-key", "x-api-key")
#: Header a client may use to present the proxy key while keeping its own
#: ``Authorization`` for the upstream.
PROXY_KEY_HEADER = "x-compaction-proxy-key"
#: Header a client presents ``server.admin_key`` in (see proxy.access).
ADMIN_KEY_HEADER = "x-compaction-proxy-admin-key"
#: The proxy's own keys: never sent upstream.
_PROXY_HEADERS = frozenset({PROXY_KEY_HEADER, ADMIN_KEY_HEADER})


def upstream_headers(
    client_headers: Iterable[tuple[str, str]],
    *,
    fallback_key: str | None,
    drop_authorization: bool = False,
) -> dict[str, str]:
    """Headers for the upstream: the client's, less hop-by-hop ones and the proxy's keys.

    The client's own credentials are forwarded unchanged; the configured key
    is added only when the client sent none.
    """
    headers: dict[str, str] = {}
    for name, value in client_headers:
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in _PROXY_HEADERS:
            continue
        if drop_authorization and lower == "authorization":
            continue
        headers[lower] = value
    if fallback_key and not any(h in headers for h in AUTH_HEADERS):
        headers["authorization"] = f"Bearer {fallback_key}"
    return headers


def _relayed_headers(
    upstream: UpstreamResponse, extra: Mapping[str, str]
) -> list[tuple[bytes, bytes]]:
    headers = [
        (k, v)
        for k, v in upstream.raw_headers
        if k != b"date" and k.decode("latin-1") not in HOP_BY_HOP  # uvicorn sends its own date
    ]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
    return headers


async def send(
    transport: Transport,
    method: str,
    url: str,
    headers: Mapping[str, str],
    content: bytes | AsyncIterator[bytes] | None,
) -> UpstreamResponse:
    """Send and return the response once its headers are in, its body unread."""
    try:
        return await transport.request(method, url, headers.items(), content)
    except ValueError as exc:
        raise BadRequest(f"The request cannot be forwarded: {exc}.") from exc


def _stream_error_event(message: str) -> bytes:
    body = {"error": {"message": message, "type": "upstream_error", "code": "upstream_dropped"}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


#: An answer of a declared length below this is relayed whole, with its
#: length (no more than the transport buffers before it stops reading).
WHOLE_BELOW = HIGH_WATER


class Relay(Response):
    """The upstream's answer relayed: a small one whole, any other as it arrives.

    A body of a known, small length (a JSON answer) goes out in one message
    with its length. Any other (a stream) is relayed chunk by chunk, never
    re-chunked or held back; meanwhile the client's disconnect is watched, and
    aborts the upstream request at once — a generation nobody reads is not
    left running (and billed) to its end.
    """

    def __init__(
        self,
        upstream: UpstreamResponse,
        extra_headers: Mapping[str, str],
        tap: UsageTap | None = None,
    ) -> None:
        self.upstream = upstream
        self.status_code = upstream.status
        self.raw_headers = _relayed_headers(upstream, extra_headers)
        self.background = None
        #: Sees every chunk of a successful answer, to read its ``usage``.
        self.tap = tap if upstream.status == 200 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = self.upstream
        headers = self.raw_headers
        try:
            small = upstream.length is not None and upstream.length < WHOLE_BELOW
            if small and not upstream.complete:
                # A small answer of known length (a JSON completion) is
                # relayed whole: its last bytes are a moment away.
                await upstream.wait_complete()
            body = None
            if upstream.complete:
                body = upstream.take_buffered()
                upstream.release()
                if not upstream.bodyless and self.status_code not in (204, 304):
                    headers = [*headers, (b"content-length", b"%d" % len(body))]
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": headers}
            )
            if body is not None:
                await send({"type": "http.response.body", "body": body})
                if self.tap is not None:
                    self.tap.feed(body)
                    self.tap.close()
            else:
                await self._stream(receive, send)
        finally:
            upstream.abort()  # nothing when the body was read to its end

    async def _stream(self, receive: Receive, send: Send) -> None:
        upstream = self.upstream
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_abort_on_disconnect(receive, upstream, gone))
        try:
            while True:
                try:
                    chunk = await upstream.next_chunk()
                except BodyLost as exc:
                    if gone.is_set():
                        return
                    # Headers are gone already: the status cannot change any
                    # more. An SSE client gets an error event instead of a
                    # stream that just stops.
                    logger.warning("upstream stream broke: %s", exc)
                    if (upstream.header("content-type") or "").startswith("text/event-stream"):
                        message = "The upstream connection was lost mid-stream."
                        await send(
                            {
                                "type": "http.response.body",
                                "body": _stream_error_event(message),
                                "more_body": True,
                            }
                        )
                    break
                if chunk is None:
                    if self.tap is not None:
                        self.tap.close()
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if self.tap is not None:
                    self.tap.feed(chunk)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()


async def _abort_on_disconnect(
    receive: Receive, upstream: UpstreamResponse, gone: asyncio.Event
) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            upstream.abort()
            return


def relay_bytes(
    upstream: UpstreamResponse, body: bytes, extra_headers: Mapping[str, str]
) -> Response:
    """An already-read upstream response (an error), relayed as it was."""
    response = Response(body, status_code=upstream.status)
    response.raw_headers = [
        *_relayed_headers(upstream, extra_headers),
        (b"content-length", b"%d" % len(body)),
    ]
    return response


def error_response(error: ProxyError, extra_headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        error.json_bytes(),
        status_code=error.status,
        media_type="application/json",
        headers=dict(extra_headers or {}),
    )
