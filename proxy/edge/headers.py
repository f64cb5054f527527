"""The headers the proxy reads at its edge: the caller's credentials for the
upstream and the proxy's own keys.

They live here, at the bottom of the import order, because both the edge's
checks (:mod:`proxy.edge.access`, :mod:`proxy.edge.guards`) and the request
path that forwards headers upstream (:mod:`proxy.flow.send`) need them.
"""

from __future__ import annotations

from typing import Final

#: Where a client puts the key the upstream checks.
AUTH_HEADERS: Final[tuple[str, ...]] = ("authorization", "api-key", "x-api-key")
#: Header a client may use to present the proxy key while keeping its own
#: ``Authorization`` for the upstream.
PROXY_KEY_HEADER: Final[str] = "x-compaction-proxy-key"
#: Header a client presents ``server.admin_key`` in (see proxy.edge.access).
ADMIN_KEY_HEADER: Final[str] = "x-compaction-proxy-admin-key"
#: The proxy's own headers: never sent upstream.
PROXY_HEADERS: Final = frozenset({PROXY_KEY_HEADER, ADMIN_KEY_HEADER})
