"""Prometheus metrics, one registry per app (no process-global state).

Model names come from clients, so they are used as label values only for the
first :data:`MAX_MODELS` distinct names; later ones are counted as "other".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from compaction import Checkpoint, CompactionResult, Message
from proxy.stores import Event, Store

MAX_MODELS = 100
CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "compaction_proxy_requests",
            "Chat requests by model and compaction stage.",
            ["model", "stage"],
            registry=r,
        )
        self.compactions = Counter(
            "compaction_proxy_compactions",
            "Compactions by reason and stage.",
            ["reason", "stage"],
            registry=r,
        )
        self.tokens_before = Counter(
            "compaction_proxy_tokens_before",
            "Estimated tokens of requests as received.",
            ["model"],
            registry=r,
        )
        self.tokens_after = Counter(
            "compaction_proxy_tokens_after",
            "Estimated tokens of requests as forwarded.",
            ["model"],
            registry=r,
        )
        self.summarizer_calls = Counter(
            "compaction_proxy_summarizer_calls",
            "Requests sent to the LLM summarizer.",
            registry=r,
        )
        self.summarizer_failures = Counter(
            "compaction_proxy_summarizer_failures",
            "Compactions whose llm summary failed and fell back to extractive.",
            registry=r,
        )
        self.overflow_retries = Counter(
            "compaction_proxy_overflow_retries",
            "Requests retried after an upstream context-length error.",
            ["model"],
            registry=r,
        )
        self.upstream_latency = Histogram(
            "compaction_proxy_upstream_seconds",
            "Time until the upstream's response headers.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "compaction_proxy_upstream_errors",
            "Upstream failures: HTTP status class, or unreachable / timeout.",
            ["kind"],
            registry=r,
        )
        self.store_latency = Histogram(
            "compaction_proxy_store_seconds",
            "Store operation latency.",
            ["operation"],
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self._models: set[str] = set()
        #: Labelled children of the per-request metrics: ``labels()`` takes a
        #: lock and builds a key on every call, and these are hit per request.
        self._per_request: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        self._latency: dict[str, Any] = {}

    def model(self, name: str) -> str:
        if name in self._models:
            return name
        if len(self._models) < MAX_MODELS:
            self._models.add(name)
            return name
        return "other"

    def record_request(self, model: str, result: CompactionResult, tokens_before: int) -> None:
        key = (model, result.stage)
        children = self._per_request.get(key)
        if children is None:
            label = self.model(model or "-")
            children = (
                self.requests.labels(label, result.stage),
                self.tokens_before.labels(label),
                self.tokens_after.labels(label),
            )
            if len(self._per_request) < MAX_MODELS * 8:
                self._per_request[key] = children
        requests, before, after = children
        requests.inc()
        before.inc(tokens_before)
        after.inc(result.tokens_after)

    def record_compaction(self, result: CompactionResult, llm_mode: bool) -> None:
        """A compaction made for this request (not one reused from the store).
        Summarizer calls are counted as they are sent, by the summarizer."""
        if result.stage in ("none", "reused"):
            return
        self.compactions.labels(result.reason, result.stage).inc()
        if llm_mode and result.summarizer_used == "extractive":
            self.summarizer_failures.inc()

    def record_upstream(
        self, route: str, seconds: float, status: int | None, kind: str = ""
    ) -> None:
        if status is not None:
            latency = self._latency.get(route)
            if latency is None:
                latency = self._latency[route] = self.upstream_latency.labels(route)
            latency.observe(seconds)
            if status >= 400:
                self.upstream_errors.labels(f"{status // 100}xx").inc()
        else:
            self.upstream_errors.labels(kind).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MeteredStore:
    """A :class:`~proxy.stores.Store` that times every operation."""

    def __init__(self, store: Store, metrics: Metrics) -> None:
        self._store = store
        self._histogram = metrics.store_latency
        self.tracks_liveness = store.tracks_liveness

    async def _timed(self, operation: str, call: Any) -> Any:
        started = time.perf_counter()
        try:
            return await call
        finally:
            self._histogram.labels(operation).observe(time.perf_counter() - started)

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        found: dict[str, Checkpoint] = await self._timed("lookup", self._store.lookup(hashes))
        return found

    async def put(
        self, checkpoint: Checkpoint, originals: Sequence[Message] | None = None, *, owner: str = ""
    ) -> None:
        await self._timed("put", self._store.put(checkpoint, originals, owner=owner))

    async def get(self, checkpoint_id: str, *, owner: str | None = None) -> Checkpoint | None:
        found: Checkpoint | None = await self._timed(
            "get", self._store.get(checkpoint_id, owner=owner)
        )
        return found

    async def originals(self, checkpoint_id: str) -> list[Message] | None:
        found: list[Message] | None = await self._timed(
            "originals", self._store.originals(checkpoint_id)
        )
        return found

    async def add_event(self, event: Event) -> None:
        await self._timed("add_event", self._store.add_event(event))

    async def events(
        self, session: str | None = None, limit: int = 100, *, owner: str | None = None
    ) -> list[Event]:
        found: list[Event] = await self._timed(
            "events", self._store.events(session, limit, owner=owner)
        )
        return found

    async def fail_interrupted(self, instance: str, message: str = "interrupted by restart") -> int:
        count: int = await self._timed(
            "fail_interrupted", self._store.fail_interrupted(instance, message)
        )
        return count

    async def heartbeat(self, instance: str, ttl: float) -> None:
        await self._timed("heartbeat", self._store.heartbeat(instance, ttl))

    def lock(self, key: str, ttl: float) -> AbstractAsyncContextManager[None]:
        return self._store.lock(key, ttl)

    async def learned_windows(self) -> dict[str, int]:
        found: dict[str, int] = await self._timed("learned_windows", self._store.learned_windows())
        return found

    async def set_learned_window(self, model: str, window: int) -> None:
        await self._timed("set_learned_window", self._store.set_learned_window(model, window))

    async def calibrations(self) -> dict[str, float]:
        found: dict[str, float] = await self._timed("calibrations", self._store.calibrations())
        return found

    async def set_calibration(self, key: str, ratio: float) -> None:
        await self._timed("set_calibration", self._store.set_calibration(key, ratio))

    async def purge(self, now: float | None = None) -> int:
        count: int = await self._timed("purge", self._store.purge(now))
        return count

    async def close(self) -> None:
        await self._store.close()
