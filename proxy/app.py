"""The FastAPI application: routes are thin; the work lives in chat.py and friends.

``create_app(settings)`` builds everything; nothing happens at import time.
The upstream ``httpx.AsyncClient`` is opened and closed in the lifespan.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from config import ModelResolver, Settings
from proxy.chat import handle_chat, handle_preview
from proxy.errors import ProxyError
from proxy.guards import KEY_IN_AUTHORIZATION, HostGuard, ProxyKeyGuard, is_loopback
from proxy.state import ProxyState, build_client
from proxy.store import CheckpointStore, MemoryStore
from proxy.upstream import error_response, relay, send, upstream_headers


def create_app(
    settings: Settings,
    *,
    store: CheckpointStore | None = None,
    client: httpx.AsyncClient | None = None,
) -> ASGIApp:
    """The proxy as an ASGI application. ``client`` and ``store`` are for tests."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = client is None
        http = client or build_client(settings)
        app.state.proxy = ProxyState(
            settings=settings,
            client=http,
            store=store or MemoryStore(),
            resolver=ModelResolver(settings),
        )
        try:
            yield
        finally:
            if owned:
                await http.aclose()

    app = FastAPI(
        title="compaction-proxy",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    def state_of(request: Request) -> ProxyState:
        proxy_state: ProxyState = request.app.state.proxy
        return proxy_state

    def key_in_authorization(request: Request) -> bool:
        return bool(request.scope.get(KEY_IN_AUTHORIZATION, False))

    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError) -> Response:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        error = ProxyError(str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        error.status = exc.status_code
        error.type = "invalid_request_error"
        return error_response(error)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle_chat(
            request, state_of(request), uses_proxy_key=key_in_authorization(request)
        )

    @app.post("/v1/compaction/preview")
    async def preview(request: Request) -> Response:
        return await handle_preview(
            request, state_of(request), uses_proxy_key=key_in_authorization(request)
        )

    @app.get("/v1/compaction/checkpoints/{checkpoint_id}")
    async def checkpoint(checkpoint_id: str, request: Request) -> Response:
        found = await state_of(request).store.get(checkpoint_id)
        if found is None:
            raise StarletteHTTPException(404, "No such checkpoint.")
        return JSONResponse(
            {
                "id": found.id,
                "session": found.session,
                "covered": found.covered,
                "stage": found.stage,
                "reason": found.reason,
                "tokens_before": found.tokens_before,
                "tokens_after": found.tokens_after,
                "model": found.model,
                "created_at": found.created_at,
                "replacement": list(found.replacement),
            }
        )

    @app.api_route(
        "/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
    )
    async def passthrough(path: str, request: Request) -> Response:
        state = state_of(request)
        url = f"{settings.upstream.base_url}/{path}"
        if request.url.query:
            url = f"{url}?{request.url.query}"
        headers = upstream_headers(
            request.headers.items(),
            fallback_key=state.fallback_key(state.resolve(None)),
            drop_authorization=key_in_authorization(request),
        )
        has_body = request.method not in ("GET", "HEAD", "OPTIONS")
        upstream = await send(
            state.client, request.method, url, headers, request.stream() if has_body else None
        )
        return relay(upstream, {})

    wrapped: ASGIApp = app
    server = settings.server
    if server.cors_origins:
        wrapped = CORSMiddleware(
            wrapped,
            allow_origins=server.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=[
                "x-compaction-stage",
                "x-compaction-reason",
                "x-compaction-id",
                "x-compaction-tokens-before",
                "x-compaction-tokens-after",
            ],
        )
    if server.api_key is not None:
        wrapped = ProxyKeyGuard(wrapped, server.api_key.get_secret_value())
    if is_loopback(server.host):
        wrapped = HostGuard(wrapped, server.allowed_hosts)
    return wrapped
