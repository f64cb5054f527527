"""proxy.state.metrics on its own: what one request's figures add, and what they ask for."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.state.metrics import Metrics
from proxy.upstream.usage import Usage


def _counted_labels(monkeypatch: pytest.MonkeyPatch, metric: Any, asked: list[str]) -> None:
    """Each ``labels()`` call of ``metric`` noted in ``asked``, by its name."""
    labels = metric.labels

    def counted(*values: str) -> Any:
        asked.append(metric._name)
        return labels(*values)

    monkeypatch.setattr(metric, "labels", counted)


def test_a_models_dollar_costs_are_labelled_once_and_only_once_it_has_a_dollar_price(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics = Metrics()
    asked: list[str] = []
    for metric in (metrics.cost_dollars, metrics.cost_without_dollars):
        _counted_labels(monkeypatch, metric, asked)
    usage = Usage(prompt=100, cache_write=100, output=5)

    metrics.record_usage("unpriced-model", usage, 140.0, 140.0)  # no dollar price
    assert asked == []
    for _ in range(3):
        metrics.record_usage("priced-model", usage, 140.0, 200.0, (0.25, 0.5))

    # Labelled by the first request; the next ones count on the same children.
    assert asked == [
        "compaction_proxy_cost_dollars",
        "compaction_proxy_cost_without_compaction_dollars",
    ]
    exposition = metrics.exposition().decode()
    assert 'compaction_proxy_cost_dollars_total{model="priced-model"} 0.75' in exposition
    assert (
        'compaction_proxy_cost_without_compaction_dollars_total{model="priced-model"} 1.5'
        in exposition
    )
    # A model without a dollar price shows no dollar series at all.
    assert 'dollars_total{model="unpriced-model"}' not in exposition
    assert 'compaction_proxy_cost_total{model="unpriced-model"} 140.0' in exposition
