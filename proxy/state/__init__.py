"""proxy.state: what the running proxy holds and writes down.

* :mod:`~proxy.state.observability` — :class:`Observability`: the metrics and the recorder;
* :mod:`~proxy.state.models` — what the proxy learned about each upstream's model
  (windows stated, learned and narrowed, the largest prompt answered, calibration, slots);
* :mod:`~proxy.state.recorder` — per-request figures, written off the request path;
* :mod:`~proxy.state.metrics` — Prometheus metrics, one registry per app;
* :mod:`~proxy.state.logs` — the text or JSON log lines;
* :mod:`~proxy.state.stores` — checkpoints, events, figures and settings in
  memory, SQLite or Redis.
"""
