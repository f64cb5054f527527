"""Talking to the upstream: request headers, sending, and relaying the answer.

One ``httpx.AsyncClient`` (created in the app's lifespan) owns the connection
pool. Responses are relayed as they arrive — no buffering, no re-chunking —
and always closed, also when the client goes away mid-stream.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping

import httpx
import orjson
from starlette.responses import Response, StreamingResponse

from proxy.errors import ProxyError, UpstreamTimeout, UpstreamUnreachable

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
        # httpx negotiates compression with the upstream itself and hands us
        # decoded bytes, so the client's and the upstream's encodings never leak.
        "accept-encoding",
        "content-encoding",
    }
)
AUTH_HEADERS = ("authorization", "api-key", "x-api-key")
#: Header a client may use to present the proxy key while keeping its own
#: ``Authorization`` for the upstream.
PROXY_KEY_HEADER = "x-compaction-proxy-key"


def upstream_headers(
    client_headers: Iterable[tuple[str, str]],
    *,
    fallback_key: str | None,
    drop_authorization: bool = False,
) -> dict[str, str]:
    """Headers for the upstream: the client's, less hop-by-hop ones and the proxy key.

    The client's own credentials are forwarded unchanged; the configured key
    is added only when the client sent none.
    """
    headers: dict[str, str] = {}
    for name, value in client_headers:
        lower = name.lower()
        if lower in HOP_BY_HOP or lower == PROXY_KEY_HEADER:
            continue
        if drop_authorization and lower == "authorization":
            continue
        headers[lower] = value
    if fallback_key and not any(h in headers for h in AUTH_HEADERS):
        headers["authorization"] = f"Bearer {fallback_key}"
    return headers


def response_headers(upstream: httpx.Response, extra: Mapping[str, str]) -> dict[str, str]:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
    headers.update(extra)
    return headers


async def send(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: Mapping[str, str],
    content: bytes | AsyncIterator[bytes] | None,
) -> httpx.Response:
    """Send and return the response with its body unread (``stream=True``)."""
    request = client.build_request(method, url, headers=headers, content=content)
    try:
        return await client.send(request, stream=True)
    except httpx.TimeoutException as exc:
        raise UpstreamTimeout("The upstream did not answer in time.") from exc
    except httpx.TransportError as exc:
        raise UpstreamUnreachable("The upstream could not be reached.") from exc


async def read_error_body(response: httpx.Response, limit: int = 1 << 20) -> bytes:
    """The (decoded) body of an error response, at most ``limit`` bytes, then close it."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= limit:
                break
    except httpx.HTTPError:
        pass
    finally:
        await response.aclose()
    return b"".join(chunks)


def _stream_error_event(message: str) -> bytes:
    body = {"error": {"message": message, "type": "upstream_error", "code": "upstream_dropped"}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def _relay_body(response: httpx.Response, is_sse: bool) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_bytes():
            yield chunk
    except httpx.HTTPError as exc:
        # Headers are gone already: the status cannot change any more. An SSE
        # client gets an error event instead of a stream that just stops.
        logger.warning("upstream stream broke: %s", type(exc).__name__)
        if is_sse:
            yield _stream_error_event("The upstream connection was lost mid-stream.")
    finally:
        await response.aclose()


def relay(response: httpx.Response, extra_headers: Mapping[str, str]) -> Response:
    """A streaming response relaying ``response`` chunk by chunk."""
    is_sse = response.headers.get("content-type", "").startswith("text/event-stream")
    return StreamingResponse(
        _relay_body(response, is_sse),
        status_code=response.status_code,
        headers=response_headers(response, extra_headers),
    )


def relay_bytes(
    response: httpx.Response, body: bytes, extra_headers: Mapping[str, str]
) -> Response:
    """An already-read upstream response (an error), relayed as it was."""
    return Response(
        body, status_code=response.status_code, headers=response_headers(response, extra_headers)
    )


def error_response(error: ProxyError, extra_headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        error.json_bytes(),
        status_code=error.status,
        media_type="application/json",
        headers=dict(extra_headers or {}),
    )
