"""The routes that read the store, each answering with the caller's own state.

* ``GET /v1/compaction/checkpoints/{id}`` — one stored compaction with its
  originals; another owner's is a 404, the same answer as for one that does
  not exist;
* ``GET /v1/compaction/events`` — the caller's last N events, filtered in the
  store, so a busier neighbour never crowds them out of the limit.

Who the caller is, and what the admin key shows, is :mod:`proxy.edge.access`.
"""

from __future__ import annotations

from typing import Final

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from proxy.edge.access import viewer
from proxy.edge.errors import NotFound
from proxy.flow.services import services_of
from proxy.state.stores import DEFAULT_EVENTS_LIMIT, to_dict

MAX_EVENTS_LIMIT: Final = 1000


def state_routes() -> APIRouter:
    """The routes that read the store, each answering with the caller's own state."""
    router = APIRouter(prefix="/v1/compaction")

    @router.get("/checkpoints/{checkpoint_id}")
    async def checkpoint(checkpoint_id: str, request: Request) -> Response:
        services = services_of(request)
        owner = viewer(request, services.settings.server.admin_key)
        found = await services.conversations.store.get(checkpoint_id, owner=owner)
        if found is None:  # also another owner's: its existence is not revealed
            raise NotFound("No such checkpoint.")
        body = to_dict(found)
        # Read by id alone: only now that the owner-checked get found it the caller's.
        body["originals"] = await services.conversations.store.originals(checkpoint_id)
        return Response(orjson.dumps(body), media_type="application/json")

    @router.get("/events")
    async def events(
        request: Request,
        session: str | None = None,
        limit: int = Query(DEFAULT_EVENTS_LIMIT, ge=1, le=MAX_EVENTS_LIMIT),
    ) -> Response:
        services = services_of(request)
        owner = viewer(request, services.settings.server.admin_key)
        found = await services.conversations.store.events(session=session, limit=limit, owner=owner)
        body = {"object": "list", "data": [to_dict(event) for event in found]}
        return Response(orjson.dumps(body), media_type="application/json")

    return router
