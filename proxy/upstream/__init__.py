"""proxy.upstream: talking to the model's server.

* :mod:`~proxy.upstream.transport` — the one aiohttp session, its error tree
  translated at this boundary;
* :mod:`~proxy.upstream.summarizer` — the ``llm`` summarizer: a summary asked of
  the upstream in the request's own API.
* :mod:`~proxy.upstream.service` — :class:`Upstream`: the pools, the traffic,
  the servers' paces and discovery, owned in one place;
* :mod:`~proxy.upstream.traffic` — what each upstream serves now (one-slot servers);
* :mod:`~proxy.upstream.discovery` — what the server states it serves: its
  context window and slots, asked once per model off the request path.
"""
