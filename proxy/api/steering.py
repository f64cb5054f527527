"""The steering routes, in JSON, with the access rules of the state routes
(:mod:`proxy.edge.access`: the caller's own sessions; everyone's with the admin key).

* ``PUT  /v1/compaction/checkpoints/{id}`` ``{"summary": "…"}`` — edit a summary;
* ``GET  /v1/compaction/sessions`` — the overview (sessions, totals);
* ``GET  /v1/compaction/sessions/{session}`` — one session's requests and settings;
* ``PUT  /v1/compaction/sessions/{session}/settings``
  ``{"enabled": false, "instructions": "…"}`` — either or both;
* ``POST /v1/compaction/sessions/{session}/compact`` — compact at its next request.

A session or checkpoint the caller has nothing of — none such, or another
caller's — is a 404, the same in both cases (as on the dashboard's pages).

Two callers may use the same session id (the id is made from the
conversation's start). The admin addresses one owner's session with
``?owner=<owner>`` on the three session routes; without it, a session id
that several owners use is a 409 naming them, never a guess. A caller who is
not the admin may name only themselves (another owner is a 404).
Bodies are bounded by ``server.max_form_bytes`` as they stream in
(:class:`proxy.edge.body.BodyLimit`); a session id, the instructions and a
summary by their own ``server.max_*`` lengths, with a 400.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from proxy.edge.access import viewer
from proxy.edge.errors import BadRequest
from proxy.flow.services import services_of
from proxy.session import steering
from proxy.session.service import Conversations
from proxy.state.stores import to_dict
from proxy.ui.views import read_overview, read_session

MAX_SESSIONS: Final = 1_000
#: An owner is a digest of 32 hex characters; anything longer is no owner.
MAX_OWNER_CHARS: Final = 64


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise BadRequest("The body is not valid JSON.") from exc
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.")
    return body


def _json(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json")


def _field(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise BadRequest(f"'{name}' must be a {kind.__name__}.", param=name)
    return value


async def _whose(request: Request, session: str, owner: str | None) -> tuple[Conversations, str]:
    """The conversations and the owner of ``session`` the caller may address
    (their own; for the admin, the one ``owner`` names or the id's only one)."""
    services = services_of(request)
    seen = viewer(request, services.settings.server.admin_key)
    conversations = services.conversations
    return conversations, await steering.steered_session(conversations, session, seen, owner)


async def edit_checkpoint(checkpoint_id: str, request: Request) -> Response:
    services = services_of(request)
    seen = viewer(request, services.settings.server.admin_key)
    summary = _field(await _json_object(request), "summary", str)
    if summary is None:
        raise BadRequest("'summary' is required.", param="summary")
    edited = await steering.edit_summary(services.conversations, checkpoint_id, summary, seen)
    return _json(to_dict(edited))


async def list_sessions(
    request: Request, limit: int = Query(MAX_SESSIONS, ge=1, le=MAX_SESSIONS)
) -> Response:
    services = services_of(request)
    seen = viewer(request, services.settings.server.admin_key)
    overview = await read_overview(services.conversations.store, seen, limit=limit)
    return _json(
        {
            "object": "list",
            "data": [to_dict(summary) for summary in overview.sessions],
            "totals": overview.totals,
        }
    )


async def one_session(
    session: str,
    request: Request,
    owner: str | None = Query(None, max_length=MAX_OWNER_CHARS),
) -> Response:
    conversations, whose = await _whose(request, session, owner)
    # One owner's session, even for the admin: another's of the same id is another.
    view = await read_session(conversations.store, session, whose, whose)
    return _json(
        {
            "session": session,
            "summary": to_dict(view.summary) if view.summary else None,
            "requests": [to_dict(record) for record in view.requests],
            "settings": to_dict(view.settings),
            "checkpoints": [shown.checkpoint.id for shown in view.checkpoints],
        }
    )


async def change_settings(
    session: str,
    request: Request,
    owner: str | None = Query(None, max_length=MAX_OWNER_CHARS),
) -> Response:
    services = services_of(request)
    seen = viewer(request, services.settings.server.admin_key)  # the key before the body
    body = await _json_object(request)
    enabled = _field(body, "enabled", bool)
    instructions = _field(body, "instructions", str)
    conversations = services.conversations
    whose = await steering.steered_session(conversations, session, seen, owner)
    changed = await steering.update_settings(
        conversations, session, whose, enabled=enabled, instructions=instructions
    )
    return _json(to_dict(changed))


async def compact_next(
    session: str,
    request: Request,
    owner: str | None = Query(None, max_length=MAX_OWNER_CHARS),
) -> Response:
    conversations, whose = await _whose(request, session, owner)
    steering.compact_now(conversations, session, whose)
    return _json({"session": session, "status": "pending"}, status=202)


def steering_routes() -> APIRouter:
    """The routes, as a table: method, path, endpoint."""
    router = APIRouter(prefix="/v1/compaction")
    router.add_api_route("/checkpoints/{checkpoint_id}", edit_checkpoint, methods=["PUT"])
    router.add_api_route("/sessions", list_sessions, methods=["GET"])
    router.add_api_route("/sessions/{session}", one_session, methods=["GET"])
    router.add_api_route("/sessions/{session}/settings", change_settings, methods=["PUT"])
    router.add_api_route("/sessions/{session}/compact", compact_next, methods=["POST"])
    return router
