"""Running the proxy under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from config import Settings
from proxy import logs
from proxy.app import create_app

#: Seconds open streams get to finish after SIGTERM.
GRACEFUL_SHUTDOWN_SECONDS = 30


def serve(settings: Settings, *, log_level: str = "info") -> None:
    logs.configure(log_level, settings.server.log_format)
    logging.getLogger("compaction_proxy").info(
        "compaction-proxy on http://%s:%d/v1 → %s",
        settings.server.host,
        settings.server.port,
        settings.upstream.base_url,
    )
    uvicorn.run(
        create_app(settings),
        host=settings.server.host,
        port=settings.server.port,
        loop="auto",
        http="auto",
        log_level=log_level,
        log_config=None,  # keep the handler configured above (text or JSON) for uvicorn too
        server_header=False,
        # The proxy writes its own line per request (proxy/logs.py), with the
        # figures that matter; uvicorn's would be a second one.
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
