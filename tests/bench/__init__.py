"""Benchmarks: the proxy against a direct connection to the same fast upstream, and a peer.

``make bench`` (``python -m tests.bench.run``) measures pass-through overhead,
throughput, streaming, large conversations and memory, and writes
``tests/bench/RESULTS.md``. These are reports, not tests: nothing here is
collected by pytest (see ``conftest.py``).

Modules: ``upstream`` the fast upstream app; ``processes`` starting and pinning
the servers; ``client`` the HTTP client; ``clients`` what each candidate
upstream client (httpx, httpcore, aiohttp, the proxy's transport) costs per
request; ``rig`` interleaved rounds;
``passthrough``, ``streaming``, ``large``, ``memory`` the measurements;
``peer`` LiteLLM; ``profiling`` cProfile of a proxy process; ``report`` and
``run``.
"""
