"""proxy.ui: the dashboard (``/ui``); its JSON twins are :mod:`proxy.api`.

    signer = install(app, settings)          # in create_app, before the pass-through

The pages sign their visitors in themselves (:mod:`proxy.ui.auth`): a browser
opening a page sends no key header, and its form posts carry an ``Origin``
the API's guard would refuse. So :class:`proxy.edge.guards.Edge` hands ``/ui``
straight to the application, past those two checks (the Host check still
applies), and the pages check the cookie, the CSRF token and the origin.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from config import Settings
from proxy.ui.auth import Signer, SignInRequired
from proxy.ui.pages import dashboard_routes, sign_in_redirect


def install(app: FastAPI, settings: Settings) -> Signer:
    """Add the dashboard's pages to ``app``."""
    server = settings.server
    signer = Signer(
        server.admin_key, server.api_key, session_seconds=server.dashboard_session_hours * 3600
    )
    app.include_router(dashboard_routes(signer))

    @app.exception_handler(SignInRequired)
    async def sign_in(request: Request, exc: SignInRequired) -> Response:
        return sign_in_redirect(exc)

    return signer


__all__ = ["install"]
