"""proxy.api: every ``/v1/compaction/*`` route, in JSON.

* :mod:`proxy.api.state` — read the caller's checkpoints and events;
* :mod:`proxy.api.steering` — edit a summary, per-session settings, "compact now",
  the sessions overview;
* ``POST /v1/compaction/preview`` — what a chat request would be sent as.

Installed before the pass-through, which catches every other ``/v1`` path.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from proxy.api.state import state_routes
from proxy.api.steering import steering_routes
from proxy.flow.handler import handle_preview
from proxy.flow.services import services_of


def api_routes() -> APIRouter:
    """The state, steering and preview routes under ``/v1/compaction``."""
    router = APIRouter()
    router.include_router(state_routes())
    router.include_router(steering_routes())

    @router.post("/v1/compaction/preview")
    async def preview(request: Request) -> Response:
        return await handle_preview(request, services_of(request))

    return router


__all__ = ["api_routes"]
