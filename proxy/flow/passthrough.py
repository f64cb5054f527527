"""Every ``/v1`` path the proxy does not compact, forwarded as it came.

read the head → route (Anthropic's paths with its key, the rest to
``upstream.base_url``) → send (a small body read whole, an upload streamed
on) → relay, logged once the client has the answer, as a compacted request
is. A client that leaves before the upstream answers cancels the request
(:func:`proxy.edge.disconnect.client_left`), as on the chat path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.chat import CHAT
from proxy.edge.access import owner_digest
from proxy.edge.disconnect import ClientWatch, client_left
from proxy.edge.errors import ProxyError, anthropic_path
from proxy.edge.paths import forward_url, raw_path_of
from proxy.flow.relay import Relay
from proxy.flow.send import read_client_headers, send
from proxy.flow.services import Services
from proxy.flow.usage import UsageTap
from proxy.session.conversation import identify
from proxy.session.service import Conversations
from proxy.state.logs import REQUESTS

requests_log = logging.getLogger(REQUESTS)

#: A pass-through body declared up to this size is read and sent with its
#: length; larger or undeclared ones (uploads) are streamed on, chunked.
READ_WHOLE_BELOW = 1 << 20


async def forward(services: Services, path: str, request: Request) -> Response:
    """``request`` to ``/v1/{path}`` at the upstream, relayed back."""
    # Anthropic's other endpoints (/v1/messages/count_tokens, /batches)
    # go where its messages go, with its key; everything else to base_url.
    anthropic = anthropic_path(f"/v1/{path}")
    conversations, upstream = services.conversations, services.upstream
    config = conversations.model_config(None)
    # Built from the path as received, not the decoded ``path``: ``%2e%2e`` must not
    # walk out of the base path, nor ``%20`` reach the upstream's request line.
    scope = request.scope
    base, key_env = (
        ANTHROPIC.route(config)
        if anthropic
        else (services.settings.upstream.base_url, config.api_key_env)
    )
    url = forward_url(
        base, raw_path_of(scope["path"], scope.get("raw_path")), scope["query_string"], prefix="v1"
    )
    client = read_client_headers(request.headers.items())
    headers = client.upstream(
        fallback_key=upstream.configured_key(key_env),
        fallback_header=ANTHROPIC.key_header if anthropic else CHAT.key_header,
    )
    body = await _body(request)
    tap = None
    if anthropic and path == "messages/count_tokens" and isinstance(body, bytes):
        tap = await _count_tokens_tap(conversations, body, owner_digest(client.credential or ""))
    started = time.perf_counter()
    # Not watched while an upload is streamed on: that reads the client itself.
    watch = None if isinstance(body, AsyncIterator) else ClientWatch(request.receive)
    try:
        with watch.waiting() if watch else contextlib.nullcontext():
            answer = await send(
                upstream.transport, request.method, url, headers, body, upstream=base
            )
    except asyncio.CancelledError:
        if not client_left(watch):
            raise
        requests_log.info("forward", extra={"fields": {"path": f"/v1/{path}", "client": "gone"}})
        return Response(status_code=499)
    seconds = time.perf_counter() - started
    fields: dict[str, object] = {
        "method": request.method,
        "path": f"/v1/{path}",
        "upstream_status": answer.status,
        "ms": round(seconds * 1000, 1),
    }
    metrics = services.observed.metrics

    def log_forward(failed: ProxyError | None) -> None:
        # Once the client has the answer, as on the chat path (see Relay).
        metrics.record_upstream("other", seconds, answer.status)
        if failed is not None:  # its body broke: the client got the proxy's error
            fields.update(upstream_status=failed.status, error=failed.code or failed.type)
        requests_log.info("forward", extra={"fields": fields})

    return Relay(answer, {}, tap if answer.status == 200 else None, after=log_forward)


async def _body(request: Request) -> bytes | AsyncIterator[bytes] | None:
    declared = request.headers.get("content-length")
    if request.method in ("GET", "HEAD", "OPTIONS") or (
        declared is None and "transfer-encoding" not in request.headers
    ):
        return None  # no body, and none is sent on (e.g. a DELETE)
    if declared is not None and declared.isdigit() and int(declared) <= READ_WHOLE_BELOW:
        return await request.body()
    return request.stream()


async def _count_tokens_tap(
    conversations: Conversations, raw: bytes, owner: str
) -> UsageTap | None:
    """Anthropic's ``count_tokens`` states the upstream's own count of a request:
    with the proxy's estimate of the same request it makes a calibration sample.
    The estimate is made in a worker thread (up to 1 MiB of text to count)."""
    try:
        request = orjson.loads(raw)
        model = request.get("model")
    except (orjson.JSONDecodeError, AttributeError):  # forwarded all the same
        return None
    config = conversations.model_config(model if isinstance(model, str) else None, owner)

    def estimate() -> int:  # the same reading as a compacted request's
        mapped = ANTHROPIC.to_engine(request)
        return identify(conversations, config, mapped.request, mapped.messages).tokens

    try:
        tokens = await asyncio.to_thread(estimate)
    except Exception:  # not a request the proxy can read; the upstream will say so
        return None

    def calibrate(upstream_tokens: int) -> None:
        conversations.models.observe(config, tokens, upstream_tokens, owner)

    return UsageTap(calibrate, bare=True)  # its answer is the count itself
