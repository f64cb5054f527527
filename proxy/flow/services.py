"""The services a request is served with, as the app's lifespan built them.

The composition root (:mod:`proxy.app`) opens them and hands them to the
endpoints; a function below takes the one service it uses, not this record
(docs/architecture.md, "Services").
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import HTTPConnection

from config import Settings
from proxy.session.service import Conversations
from proxy.state.observability import Observability
from proxy.upstream.service import Upstream


@dataclass(frozen=True)
class Services:
    settings: Settings
    upstream: Upstream
    conversations: Conversations
    observed: Observability


def services_of(request: HTTPConnection) -> Services:
    """The running proxy's services, from a request to its app (set in the lifespan)."""
    services: Services = request.app.state.services
    return services
