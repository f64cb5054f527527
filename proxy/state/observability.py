"""What the running proxy tells its operator: the metrics and the per-request
figures on their way to the store.

Log lines go through the named loggers of :mod:`proxy.state.logs`; these are
the two stateful parts, owned here and handed to whoever records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.state.metrics import Metrics
from proxy.state.recorder import Recorder


@dataclass
class Observability:
    """The metrics (``/metrics``) and the recorder of per-request figures."""

    metrics: Metrics = field(default_factory=Metrics)
    #: Per-request figures on their way to the store (started once the store is open).
    recorder: Recorder | None = None
