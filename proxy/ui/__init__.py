"""proxy.ui: the dashboard (``/ui``); its JSON twins are :mod:`proxy.api`.

    signer = install(app, settings)          # in create_app, before the pass-through
    wrapped = DashboardRoute(wrapped, app)   # outside the Origin and proxy-key guards

The pages sign their visitors in themselves (:mod:`proxy.ui.auth`): a browser
opening a page sends no key header, and its form posts carry an ``Origin``
the API's guard would refuse. So :class:`DashboardRoute` hands ``/ui`` straight
to the application, past those two guards (the Host guard still applies), and
the pages check the cookie, the CSRF token and the origin.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from config import Settings
from proxy.ui.auth import Signer, SignInRequired
from proxy.ui.pages import dashboard_routes, sign_in_redirect


def install(app: FastAPI, settings: Settings) -> Signer:
    """Add the dashboard's pages to ``app``."""
    server = settings.server
    signer = Signer(server.admin_key, server.api_key)
    app.include_router(dashboard_routes(signer))

    @app.exception_handler(SignInRequired)
    async def sign_in(request: Request, exc: SignInRequired) -> Response:
        return sign_in_redirect(exc)

    return signer


class DashboardRoute:
    """``/ui`` and below straight to ``app``; everything else to ``guarded``."""

    def __init__(self, guarded: ASGIApp, app: ASGIApp) -> None:
        self.guarded = guarded
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == "/ui" or path.startswith("/ui/"):
            await self.app(scope, receive, send)
            return
        await self.guarded(scope, receive, send)


__all__ = ["DashboardRoute", "install"]
