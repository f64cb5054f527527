"""proxy.upstream: talking to the model's server.

* :mod:`~proxy.upstream.transport` — the one aiohttp session, its error tree
  translated at this boundary;
* :mod:`~proxy.upstream.summarizer` — the ``llm`` summarizer: a summary asked of
  the upstream in the request's own API.
"""
