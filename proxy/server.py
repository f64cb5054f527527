"""Running the proxy under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from config import Settings
from proxy.app import create_app

#: Seconds open streams get to finish after SIGTERM.
GRACEFUL_SHUTDOWN_SECONDS = 30


def serve(settings: Settings, *, log_level: str = "info") -> None:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
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
        server_header=False,
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
