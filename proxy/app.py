"""The composition root: the services opened and closed together, the routes
as a table, the middleware in order. The work lives in :mod:`proxy.flow`.

``create_app(settings)`` builds everything; nothing happens at import time.
:func:`open_services` opens the services in the app's lifespan and closes
them at its end (docs/architecture.md, "Services").
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from compaction import ReadingCache
from config import Settings
from proxy.api import api_routes
from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.dialects.responses import RESPONSES
from proxy.edge.body import BodyLimit
from proxy.edge.disconnect import ClientWatch, client_left
from proxy.edge.errors import BadRequest, ProxyError, ServiceUnavailable
from proxy.edge.guards import Edge, is_loopback
from proxy.flow import passthrough
from proxy.flow.handler import handle_chat
from proxy.flow.send import error_response
from proxy.flow.services import Services, services_of
from proxy.session.background import Background
from proxy.session.service import Conversations
from proxy.state.logs import REQUESTS
from proxy.state.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from proxy.state.observability import Observability
from proxy.state.recorder import Recorder
from proxy.state.stores import ResilientStore, Store, StoreHealth, StoreUnavailable, open_store
from proxy.ui import install as install_dashboard
from proxy.upstream.service import Upstream
from proxy.upstream.transport import Transport

logger = logging.getLogger("compaction_proxy")
requests_log = logging.getLogger(REQUESTS)
#: The status of a request whose client left before sending it whole (nginx's).
CLIENT_CLOSED_REQUEST = 499

#: Seconds the compactions still being prepared in the background get to
#: finish at shutdown (after the requests drained), before they are cancelled.
BACKGROUND_GRACE_SECONDS = 5.0
#: Seconds between purges of originals past their retention.
PURGE_INTERVAL = 3600.0
MIB = 1024 * 1024


# --- the services' lifetime -----------------------------------------------------


@asynccontextmanager
async def open_services(
    settings: Settings,
    health: StoreHealth,
    *,
    store: Store | None = None,
    transport: Transport | None = None,
) -> AsyncIterator[Services]:
    """The services, open: the store guarded, the tokenizers loaded, what the
    store learned restored, the heartbeat running; closed again, each step
    bounded (:func:`shutdown_seconds`), when the block ends."""
    observed = Observability()
    metrics = observed.metrics
    # A store that fails or hangs must not fail the requests; they are compacted afresh.
    guarded = ResilientStore(
        store if store is not None else _open_store(settings),
        timeout=settings.store.timeout_seconds,
        health=health,
        observer=metrics,
        lock_wait=settings.store.lock_wait_seconds,
    )
    upstream = Upstream(settings, transport=transport, max_keys=settings.store.max_model_rows)
    background = Background(
        max_running=settings.background.max_running,
        max_per_owner=settings.background.max_running_per_owner,
        on_refused=lambda reason: metrics.background.labels(reason).inc(),
    )
    conversations = Conversations(
        settings,
        guarded,
        upstream,
        observed,
        readings=ReadingCache(settings.server.incremental_cache_mb * MIB),
        background=background,
    )
    metrics.background_running.set_function(lambda: len(background))
    restored = await _start(conversations)
    observed.recorder = Recorder(guarded)
    observed.recorder.start()
    keeper = asyncio.create_task(_keep_alive(conversations, guarded, restored))
    try:
        yield Services(settings, upstream, conversations, observed)
    finally:
        # Each step is bounded whatever the store does (see shutdown_seconds).
        await _ended(keeper, settings.store.timeout_seconds)
        await background.close(BACKGROUND_GRACE_SECONDS)
        await upstream.aclose()
        await observed.recorder.stop(grace=settings.store.timeout_seconds)
        await guarded.close()


def _open_store(settings: Settings) -> Store:
    return open_store(
        settings.store.url,
        retention_seconds=settings.store.retention_seconds,
        store_originals=settings.store.store_originals,
        timeout=settings.store.timeout_seconds,
        requests_retention_seconds=settings.store.requests_retention_seconds,
        max_model_rows=settings.store.max_model_rows,
    )


async def _start(conversations: Conversations) -> bool:
    """This process announced, the compactions a restart interrupted closed,
    what was learned restored (whether the store could say), old rows purged,
    the tokenizers loaded."""
    store, settings = conversations.store, conversations.settings
    await store.heartbeat(conversations.instance, settings.store.heartbeat_seconds)
    closed = await store.fail_interrupted(conversations.instance)
    if closed:
        logger.warning("closed %d compaction(s) interrupted by a restart", closed)
    restored = await _restore(conversations)
    await store.purge()
    await asyncio.to_thread(conversations.warm)
    return restored


async def _keep_alive(conversations: Conversations, store: ResilientStore, restored: bool) -> None:
    """Heartbeats, interrupted compactions, purges; and a store that failed is
    asked again, so /healthz recovers without waiting for a request, and what
    start-up could not load is loaded once it answers. (The store's calls
    never raise: they degrade.)"""
    # The heartbeat is renewed at a third of its life, so a live replica's
    # compactions are never closed as interrupted.
    ttl = conversations.settings.store.heartbeat_seconds
    instance = conversations.instance
    since_purge = 0.0
    while True:
        await asyncio.sleep(ttl / 3)
        if not restored:
            restored = await _restore(conversations)
        elif store.health.failing:
            await store.probe()
        await store.heartbeat(instance, ttl)
        # A replica that died just before this one started still looked
        # alive then; its compactions are closed once its heartbeat lapses.
        # Without heartbeats (SQLite) every other instance would look dead:
        # a second proxy on the same file would fail this one's work.
        if store.tracks_liveness:
            await store.fail_interrupted(instance)
        since_purge += ttl / 3
        if since_purge >= PURGE_INTERVAL:
            since_purge = 0.0
            await store.purge()


async def _ended(task: asyncio.Task[None], seconds: float) -> None:
    """Cancel ``task`` and give it ``seconds`` to end; then it is left behind
    (the loop is closing: shutdown must not wait on a store that ignores it)."""
    task.cancel()
    await asyncio.wait({task}, timeout=seconds)
    if task.done() and not task.cancelled() and task.exception() is not None:
        logger.warning("the keep-alive task failed (%s)", type(task.exception()).__name__)


def shutdown_seconds(settings: Settings) -> float:
    """The longest the app's shutdown takes once the requests have drained:
    the keep-alive task, the background preparations' grace, the figures' last
    write and the store's close, each bounded (docs/operations.md, Faults)."""
    return BACKGROUND_GRACE_SECONDS + 3 * settings.store.timeout_seconds


async def _restore(conversations: Conversations) -> bool:
    """Load the learned windows and ratios from the store; False if it cannot say now."""
    try:
        windows = await conversations.store.learned_windows()
        ratios = await conversations.store.calibrations()
    except StoreUnavailable:
        return False
    conversations.models.restore(windows, ratios)  # what was learned meanwhile is the newer
    return True


# --- the endpoints FastAPI routes -------------------------------------------------


async def metrics_endpoint(request: Request) -> Response:
    exposition = services_of(request).observed.metrics.exposition()
    return Response(exposition, media_type=METRICS_CONTENT_TYPE)


async def healthz(request: Request) -> JSONResponse:
    # From the outcomes of the store calls already made, never a call of
    # its own: a hung store must not hang the health check. Degraded is
    # still 200: the proxy serves every request, only without its state.
    health: StoreHealth = request.app.state.health
    return JSONResponse(health.report().to_dict())


async def forward_endpoint(path: str, request: Request) -> Response:
    return await passthrough.forward(services_of(request), path, request)


async def _proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    return error_response(exc, path=request.url.path)


async def _invalid_parameters(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    # FastAPI's own 422 {"detail": [...]} would be a second error shape.
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "query")
    message = f"Invalid {where or 'request'}: {first.get('msg', 'not valid')}."
    return error_response(BadRequest(message, param=where or None), path=request.url.path)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    error = ProxyError(str(exc.detail), code="not_found" if exc.status_code == 404 else None)
    error.status = exc.status_code
    error.type = "invalid_request_error"
    return error_response(error, path=request.url.path)


async def _client_gone(request: Request, exc: Exception) -> Response:
    # The client hung up before its body was whole (a cancelled request, a
    # closed laptop): an everyday event, not the proxy's error. The answer
    # reaches nobody; its status is nginx's "client closed request" for the
    # access log.
    requests_log.info("request", extra={"fields": {"path": request.url.path, "client": "gone"}})
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _store_unavailable(request: Request, exc: Exception) -> Response:
    return error_response(
        ServiceUnavailable("The compaction store is not answering; try again later.")
    )


#: Every error FastAPI's routes can raise, in the one error shape.
EXCEPTION_HANDLERS: Mapping[Any, Callable[[Request, Exception], Any]] = {
    ProxyError: _proxy_error,
    RequestValidationError: _invalid_parameters,
    StarletteHTTPException: _http_error,
    StoreUnavailable: _store_unavailable,
    ClientDisconnect: _client_gone,
}
#: The routes FastAPI serves beside /v1/compaction/* and /ui; the pass-through
#: last, since it catches every other /v1 path.
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
ROUTES: tuple[tuple[str, Callable[..., Any], list[str]], ...] = (
    ("/metrics", metrics_endpoint, ["GET"]),
    ("/healthz", healthz, ["GET"]),
)
PASS_THROUGH = ("/v1/{path:path}", forward_endpoint, ALL_METHODS)


# --- the app ----------------------------------------------------------------------


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    transport: Transport | None = None,
) -> ASGIApp:
    """The proxy as an ASGI application. ``transport`` and ``store`` are for tests
    (a transport given is not closed by the app)."""
    health = StoreHealth()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_services(settings, health, store=store, transport=transport) as services:
            app.state.services = services
            yield

    app = FastAPI(
        title="compaction-proxy",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    app.state.health = health
    for path, endpoint, methods in ROUTES:
        app.add_api_route(path, endpoint, methods=methods)
    app.include_router(api_routes())  # before the pass-through catches every /v1 path
    install_dashboard(app, settings)  # /ui, likewise
    path, endpoint, methods = PASS_THROUGH
    app.add_api_route(path, endpoint, methods=methods)
    return _edge(app, settings)


def _edge(app: FastAPI, settings: Settings) -> ASGIApp:
    """One plain ASGI callable checks every request, then the compacted
    endpoints go straight to their handler and the rest to FastAPI; every
    body is bounded as it streams in, whichever route reads it."""
    server = settings.server
    cors: Callable[[ASGIApp], ASGIApp] | None = None
    if server.cors_origins:
        # Outside the key check: a browser's preflight carries no key, and a
        # 401 needs CORS headers for the page to read it.
        cors = functools.partial(
            CORSMiddleware,
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
    edge = Edge(
        ChatRoute(app),
        dashboard=app,  # the pages sign their visitors in themselves (proxy/ui)
        allowed_hosts=server.allowed_hosts
        if server.check_host or is_loopback(server.host)
        else None,
        allowed_origins=server.cors_origins,
        proxy_key=server.api_key.get_secret_value() if server.api_key is not None else None,
        admin_key=server.admin_key.get_secret_value() if server.admin_key is not None else None,
        cors=cors,
    )
    return BodyLimit(edge, large=server.max_body_bytes, small=server.max_form_bytes)


class ChatRoute:
    """The compacted endpoints straight to their handler; everything else to FastAPI.

    ``POST /v1/chat/completions``, ``/v1/messages`` and ``/v1/responses`` skip
    FastAPI's routing, middleware stack and dependency machinery, about a
    fifth of a pass-through request's CPU in the bench's profile;
    the handler needs none of it. Their errors get the same OpenAI-shaped
    bodies the FastAPI routes give.
    """

    DIALECTS: Mapping[str, Dialect] = {
        "/v1/chat/completions": CHAT,
        "/v1/messages": ANTHROPIC,
        "/v1/responses": RESPONSES,
    }

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        dialect = self.DIALECTS.get(scope["path"]) if scope["type"] == "http" else None
        if dialect is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        response: Response
        watch = ClientWatch(receive)
        try:
            response = await handle_chat(
                Request(scope, receive),
                self.app.state.services,
                watch=watch,
                dialect=dialect,
            )
        except asyncio.CancelledError:
            # The client left while the upstream was still working on the
            # answer; the upstream connection is closed, nobody to answer.
            if not client_left(watch):
                raise
            requests_log.info("chat", extra={"fields": {"client": "gone"}})
            return
        except ClientDisconnect:
            # The client hung up before its body was whole: nobody to answer.
            requests_log.info("chat", extra={"fields": {"client": "gone"}})
            return
        except ProxyError as exc:
            response = error_response(exc, path=scope["path"])
        except Exception:
            logger.exception("chat request failed")
            failed = ProxyError("The proxy failed to handle this request.")
            response = error_response(failed, path=scope["path"])
        await response(scope, receive, send)
