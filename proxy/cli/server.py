"""Running the proxy under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from config import Settings
from proxy.app import create_app
from proxy.flow.send import shown_url
from proxy.state import logs

#: Seconds open streams get to finish after SIGTERM.
GRACEFUL_SHUTDOWN_SECONDS = 30


def startup_line(settings: Settings) -> str:
    """Where the proxy listens and every upstream it sends to (no secrets)."""
    server, upstream = settings.server, settings.upstream
    line = (
        f"compaction-proxy on http://{server.host}:{server.port}/v1 → "
        f"chat and responses {shown_url(upstream.base_url)}, "
        f"anthropic {shown_url(upstream.anthropic_base_url)}"
    )
    own = [
        f"{name} {shown_url(url)}"
        for name, model in settings.models.items()
        for url in (model.upstream, model.anthropic_upstream)
        if url is not None
    ]
    if own:
        line += "; models: " + ", ".join(own)
    return line


def serve(settings: Settings, *, log_level: str = "info") -> None:
    logs.configure(log_level, settings.server.log_format)
    logging.getLogger("compaction_proxy").info("%s", startup_line(settings))
    uvicorn.run(
        create_app(settings),
        host=settings.server.host,
        port=settings.server.port,
        loop="auto",
        http="auto",
        log_level=log_level,
        log_config=None,  # keep the handler configured above (text or JSON) for uvicorn too
        server_header=False,
        # The proxy writes its own line per request (proxy/state/logs.py), with the
        # figures that matter; uvicorn's would be a second one.
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
