"""The FastAPI application: routes are thin; the work lives in handler.py and friends.

``create_app(settings)`` builds everything; nothing happens at import time.
The upstream :class:`~proxy.upstream.transport.Transport` is opened and closed in the lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from compaction import ReadingCache
from config import ModelResolver, Settings
from proxy.api import api_routes
from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.dialects.responses import RESPONSES
from proxy.edge.access import owner_of
from proxy.edge.body import BodyLimit
from proxy.edge.disconnect import ClientWatch
from proxy.edge.errors import BadRequest, ProxyError, ServiceUnavailable
from proxy.edge.guards import Edge, is_loopback
from proxy.edge.paths import forward_url, raw_path_of
from proxy.flow.handler import handle_chat
from proxy.flow.send import Relay, error_response, send, upstream_headers
from proxy.flow.usage import UsageTap
from proxy.session.background import Background
from proxy.session.conversation import identify
from proxy.state.logs import REQUESTS
from proxy.state.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from proxy.state.metrics import Metrics
from proxy.state.recorder import Recorder
from proxy.state.runtime import ProxyState, build_transport, state_of
from proxy.state.stores import ResilientStore, Store, StoreHealth, StoreUnavailable, open_store
from proxy.ui import install as install_dashboard
from proxy.upstream.discovery import Discoveries
from proxy.upstream.transport import Transport

logger = logging.getLogger("compaction_proxy")
requests_log = logging.getLogger(REQUESTS)

#: Seconds the compactions still being prepared in the background get to
#: finish at shutdown (after the requests drained), before they are cancelled.
BACKGROUND_GRACE_SECONDS = 5.0
#: Seconds between purges of originals past their retention.
PURGE_INTERVAL = 3600.0
MIB = 1024 * 1024


async def _keep_alive(state: ProxyState, store: ResilientStore, restored: bool) -> None:
    """Heartbeats, interrupted compactions, purges; and a store that failed is
    asked again, so /healthz recovers without waiting for a request, and what
    start-up could not load is loaded once it answers. (The store's calls
    never raise: they degrade.)"""
    # The heartbeat is renewed at a third of its life, so a live replica's
    # compactions are never closed as interrupted.
    ttl = state.settings.store.heartbeat_seconds
    since_purge = 0.0
    while True:
        await asyncio.sleep(ttl / 3)
        if not restored:
            restored = await _restore(state)
        elif store.health.failing:
            await store.probe()
        await state.store.heartbeat(state.instance, ttl)
        # A replica that died just before this one started still looked
        # alive then; its compactions are closed once its heartbeat lapses.
        # Without heartbeats (SQLite) every other instance would look dead:
        # a second proxy on the same file would fail this one's work.
        if state.store.tracks_liveness:
            await state.store.fail_interrupted(state.instance)
        since_purge += ttl / 3
        if since_purge >= PURGE_INTERVAL:
            since_purge = 0.0
            await state.store.purge()


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


async def _restore(state: ProxyState) -> bool:
    """Load the learned windows and ratios from the store; False if it cannot say now."""
    try:
        windows = await state.store.learned_windows()
        ratios = await state.store.calibrations()
    except StoreUnavailable:
        return False
    state.models.restore(windows, ratios)  # what was learned meanwhile is the newer
    return True


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
        owned = transport is None
        upstream_transport = transport or build_transport(settings)
        # The preparations' summaries get a pool of their own (a transport
        # given by a test serves them too, and records them with the rest).
        background_transport = build_transport(settings, background=True) if owned else None
        backend = (
            store
            if store is not None
            else open_store(
                settings.store.url,
                retention_seconds=settings.store.retention_seconds,
                store_originals=settings.store.store_originals,
                timeout=settings.store.timeout_seconds,
                requests_retention_seconds=settings.store.requests_retention_seconds,
                max_model_rows=settings.store.max_model_rows,
            )
        )
        metrics = Metrics()
        # A store that fails or hangs must not fail the requests; they are compacted afresh.
        guarded = ResilientStore(
            backend,
            timeout=settings.store.timeout_seconds,
            health=health,
            observer=metrics,
            lock_wait=settings.store.lock_wait_seconds,
        )
        state = ProxyState(
            settings=settings,
            transport=upstream_transport,
            store=guarded,
            resolver=ModelResolver(settings),
            metrics=metrics,
            readings=ReadingCache(settings.server.incremental_cache_mb * MIB),
            background=Background(
                max_running=settings.background.max_running,
                max_per_owner=settings.background.max_running_per_owner,
                on_refused=lambda reason: metrics.background.labels(reason).inc(),
            ),
            background_transport=background_transport,
            discoveries=Discoveries(max_keys=settings.store.max_model_rows),
        )
        metrics.background_running.set_function(lambda: len(state.background))
        await state.store.heartbeat(state.instance, settings.store.heartbeat_seconds)
        closed = await state.store.fail_interrupted(state.instance)
        if closed:
            logger.warning("closed %d compaction(s) interrupted by a restart", closed)
        restored = await _restore(state)
        await state.store.purge()
        await asyncio.to_thread(state.warm)
        app.state.proxy = state
        state.recorder = Recorder(state.store)
        state.recorder.start()
        keeper = asyncio.create_task(_keep_alive(state, guarded, restored))
        try:
            yield
        finally:
            # Each step is bounded whatever the store does (see shutdown_seconds).
            await _ended(keeper, settings.store.timeout_seconds)
            await state.background.close(BACKGROUND_GRACE_SECONDS)
            await state.discoveries.close()
            await state.recorder.stop(grace=settings.store.timeout_seconds)
            await state.store.close()
            if owned:
                await upstream_transport.aclose()
            if background_transport is not None:
                await background_transport.aclose()

    app = FastAPI(
        title="compaction-proxy",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError) -> Response:
        return error_response(exc, path=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def invalid_parameters(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own 422 {"detail": [...]} would be a second error shape.
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "query")
        message = f"Invalid {where or 'request'}: {first.get('msg', 'not valid')}."
        return error_response(BadRequest(message, param=where or None), path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        error = ProxyError(str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        error.status = exc.status_code
        error.type = "invalid_request_error"
        return error_response(error, path=request.url.path)

    @app.get("/metrics")
    async def metrics_endpoint(request: Request) -> Response:
        exposition = state_of(request).metrics.exposition()
        return Response(exposition, media_type=METRICS_CONTENT_TYPE)

    @app.exception_handler(StoreUnavailable)
    async def store_unavailable(request: Request, exc: StoreUnavailable) -> Response:
        return error_response(
            ServiceUnavailable("The compaction store is not answering; try again later.")
        )

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        # From the outcomes of the store calls already made, never a call of
        # its own: a hung store must not hang the health check. Degraded is
        # still 200: the proxy serves every request, only without its state.
        return JSONResponse(health.report().to_dict())

    app.include_router(api_routes())  # before the pass-through catches every /v1 path
    install_dashboard(app, settings)  # /ui, likewise

    @app.api_route(
        "/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
    )
    async def passthrough(path: str, request: Request) -> Response:
        state = state_of(request)
        # Anthropic's other endpoints (/v1/messages/count_tokens, /batches)
        # go where its messages go, with its key; everything else to base_url.
        anthropic = path == "messages" or path.startswith("messages/")
        config = state.resolve(None)
        # Built from the path as received, not the decoded ``path``: ``%2e%2e`` must not
        # walk out of the base path, nor ``%20`` reach the upstream's request line.
        scope = request.scope
        openai = (settings.upstream.base_url, config.api_key_env)
        base, key_env = ANTHROPIC.route(config) if anthropic else openai
        url = forward_url(
            base,
            raw_path_of(scope["path"], scope.get("raw_path")),
            scope["query_string"],
            prefix="v1",
        )
        headers = upstream_headers(
            request.headers.items(),
            fallback_key=state.configured_key(key_env),
            fallback_header=ANTHROPIC.key_header if anthropic else CHAT.key_header,
        )
        body = await _body(request)
        tap = None
        if anthropic and path == "messages/count_tokens" and isinstance(body, bytes):
            tap = await _count_tokens_tap(state, body, owner_of(request.headers.items()))
        started = time.perf_counter()
        # A client that leaves before the upstream answers cancels the request,
        # as on the chat path, so that it does not hold a pooled connection.
        # (Not while an upload is streamed on: that reads the client itself.)
        watch = None if isinstance(body, AsyncIterator) else ClientWatch(request.receive)
        try:
            with watch.waiting() if watch else contextlib.nullcontext():
                upstream = await send(
                    state.transport, request.method, url, headers, body, upstream=base
                )
        except asyncio.CancelledError:
            if watch is None or not watch.gone:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            requests_log.info(
                "forward", extra={"fields": {"path": f"/v1/{path}", "client": "gone"}}
            )
            return Response(status_code=499)
        seconds = time.perf_counter() - started
        fields = {
            "method": request.method,
            "path": f"/v1/{path}",
            "upstream_status": upstream.status,
            "ms": round(seconds * 1000, 1),
        }

        def forwarded() -> None:
            # Once the client has the answer, as on the chat path (see Relay).
            state.metrics.record_upstream("other", seconds, upstream.status)
            requests_log.info("forward", extra={"fields": fields})

        return Relay(upstream, {}, tap if upstream.status == 200 else None, after=forwarded)

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
    # One plain ASGI callable checks every request, then the compacted
    # endpoints go straight to their handler and the rest to FastAPI; every
    # body is bounded as it streams in, whichever route reads it.
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


#: A pass-through body declared up to this size is read and sent with its
#: length; larger or undeclared ones (uploads) are streamed on, chunked.
READ_WHOLE_BELOW = 1 << 20


async def _body(request: Request) -> bytes | AsyncIterator[bytes] | None:
    declared = request.headers.get("content-length")
    if request.method in ("GET", "HEAD", "OPTIONS") or (
        declared is None and "transfer-encoding" not in request.headers
    ):
        return None  # no body, and none is sent on (e.g. a DELETE)
    if declared is not None and declared.isdigit() and int(declared) <= READ_WHOLE_BELOW:
        return await request.body()
    return request.stream()


async def _count_tokens_tap(state: ProxyState, raw: bytes, owner: str) -> UsageTap | None:
    """Anthropic's ``count_tokens`` states the upstream's own count of a request:
    with the proxy's estimate of the same request it makes a calibration sample.
    The estimate is made in a worker thread (up to 1 MiB of text to count)."""
    try:
        request = orjson.loads(raw)
        model = request.get("model")
    except (orjson.JSONDecodeError, AttributeError):  # forwarded all the same
        return None
    config = state.resolve(model if isinstance(model, str) else None, owner)

    def estimate() -> int:  # the same reading as a compacted request's
        mapped = ANTHROPIC.to_engine(request)
        return identify(state, config, mapped.request, mapped.messages).tokens

    try:
        tokens = await asyncio.to_thread(estimate)
    except Exception:  # not a request the proxy can read; the upstream will say so
        return None

    def observed(upstream_tokens: int) -> None:
        state.models.observe(config, tokens, upstream_tokens, owner)

    return UsageTap(observed, bare=True)  # its answer is the count itself


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
                self.app.state.proxy,
                watch=watch,
                dialect=dialect,
            )
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            # The client left while the upstream was still working on the
            # answer; the upstream connection is closed, nobody to answer.
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            requests_log.info("chat", extra={"fields": {"client": "gone"}})
            return
        except ProxyError as exc:
            response = error_response(exc, path=scope["path"])
        except Exception:
            logger.exception("chat request failed")
            failed = ProxyError("The proxy failed to handle this request.")
            response = error_response(failed, path=scope["path"])
        await response(scope, receive, send)
