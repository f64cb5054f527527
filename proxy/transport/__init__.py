"""The upstream connection pool: a lean HTTP/1.1 client for relaying.

Why not httpx here: every relayed request pays its client's cost on the hot
path, and on the bench machine ``httpx.AsyncClient.send`` of a small chat
request took 1.27 ms of CPU (httpcore alone 0.76 ms) against 0.05 ms for a
plain asyncio protocol with the ``httptools`` parser (the C parser uvicorn
serves with; measured in one process against the bench upstream). The
proxy relays; it needs keep-alive, TLS, timeouts, streaming and nothing
else — no cookies, redirects, auth flows, decoding or proxies from the
environment. httpx stays for the proxy's own calls (the summarizer), where
convenience beats microseconds.

``connection.py`` holds one connection and the response it carries,
``pool.py`` the keep-alive pool and the writing of requests.

Semantics, chosen to match what the httpx client did before:

* ``connect_timeout`` bounds opening a connection and waiting for a free one
  in the pool; ``read_timeout`` bounds each wait for upstream bytes (headers,
  then every body chunk) — a timeout raises :class:`UpstreamTimeout`.
* Failures to connect or a connection lost before the response headers raise
  :class:`UpstreamUnreachable`; lost mid-body, iteration raises
  :class:`BodyLost`. A request sent on a *reused* connection that the server
  closes without answering a single byte is sent once more on a new one: it
  is how an idle keep-alive connection closed by the server at that instant
  looks, and the server cannot have acted on it.
* The upstream is asked for ``accept-encoding: identity``: the relayed bytes
  are the bytes received, and error bodies can be read for overflow wordings.
* Connections go back to the pool only after a complete response with
  keep-alive; an abandoned response closes its connection.
"""

from proxy.transport.connection import HIGH_WATER, BodyLost, UpstreamResponse
from proxy.transport.pool import Transport

__all__ = ["HIGH_WATER", "BodyLost", "Transport", "UpstreamResponse"]
