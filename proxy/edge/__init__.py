"""proxy.edge: where a request meets the proxy, before any of its content is read.

* :mod:`~proxy.edge.guards` — plain ASGI middleware: the Host, Origin and proxy-key checks;
* :mod:`~proxy.edge.body` — the body, size-limited while it streams in, parsed once;
* :mod:`~proxy.edge.paths` — a pass-through request's upstream URL, from the raw path;
* :mod:`~proxy.edge.disconnect` — noticing a client that leaves mid-request;
* :mod:`~proxy.edge.access` — who the caller is: the owner digest and the viewer;
* :mod:`~proxy.edge.errors` — the errors the proxy answers itself, in OpenAI's shape.
"""
