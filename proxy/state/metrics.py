"""Prometheus metrics, one registry per app (no process-global state).

Model names come from clients, so they are used as label values only for the
first :data:`MAX_MODELS` distinct names of at most :data:`MAX_LABEL_CHARS`
characters; later ones, and longer ones, are counted as "other". Tool names
(the re-reads' label) are bounded the same way, to :data:`MAX_TOOLS`. A scrape
is so bounded whatever clients send: every other label value is the proxy's own.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from compaction import CompactionResult
from proxy.state.stores import FailureKind
from proxy.upstream.usage import Usage

MAX_MODELS = 100
#: Longer model names are labelled "other" (real ones are far shorter).
MAX_LABEL_CHARS = 100
#: Distinct tool names labelled in the re-reads metric; later ones are "other".
MAX_TOOLS = 100
CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5)


class _Declared(NamedTuple):
    attribute: str
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    def build(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        if self.buckets is not None:
            return Histogram(
                self.name, self.help, self.labels, buckets=self.buckets, registry=registry
            )
        return self.kind(self.name, self.help, self.labels, registry=registry)


#: Every metric: the attribute that holds it, its kind, name, help and labels.
_DECLARED: tuple[_Declared, ...] = (
    _Declared(
        "requests",
        Counter,
        "compaction_proxy_requests",
        "Chat requests by model and compaction stage.",
        ("model", "stage"),
    ),
    _Declared(
        "compactions",
        Counter,
        "compaction_proxy_compactions",
        "Compactions by reason and stage.",
        ("reason", "stage"),
    ),
    _Declared(
        "tokens_before",
        Counter,
        "compaction_proxy_tokens_before",
        "Estimated tokens of requests as received.",
        ("model",),
    ),
    _Declared(
        "tokens_after",
        Counter,
        "compaction_proxy_tokens_after",
        "Estimated tokens of requests as forwarded.",
        ("model",),
    ),
    _Declared(
        "summarizer_calls",
        Counter,
        "compaction_proxy_summarizer_calls",
        "Requests sent to the LLM summarizer.",
        (),
    ),
    _Declared(
        "summarizer_failures",
        Counter,
        "compaction_proxy_summarizer_failures",
        "Compactions (on the request path or prepared in the background) that asked "
        "the llm summarizer and could not use its answer (the call failed, or the "
        "reply was no summary), so fell back to extractive.",
        (),
    ),
    _Declared(
        "background",
        Counter,
        "compaction_proxy_background_jobs",
        "Compactions prepared ahead of need, by outcome: prepared (a summary stored), "
        "not_needed (pruning will do at the trigger), superseded, failed, cancelled, "
        "gave_way (cancelled for a user request on a one-slot upstream), single_slot "
        "(not run: background.single_slot = off); "
        "at_capacity and owner_at_capacity for one not started (background.max_running, "
        "max_running_per_owner).",
        ("outcome",),
    ),
    _Declared(
        "background_running",
        Gauge,
        "compaction_proxy_background_running",
        "Compactions being prepared ahead of need right now.",
        (),
    ),
    _Declared(
        "overflow_retries",
        Counter,
        "compaction_proxy_overflow_retries",
        "Requests retried after an upstream context-length error.",
        ("model",),
    ),
    _Declared(
        "upstream_latency",
        Histogram,
        "compaction_proxy_upstream_seconds",
        "Time until the upstream's response headers.",
        ("route",),
        buckets=_LATENCY_BUCKETS,
    ),
    _Declared(
        "upstream_errors",
        Counter,
        "compaction_proxy_upstream_errors",
        "Upstream failures: HTTP status class of an error answer, empty (a stream "
        "that ended before its first event), unreachable, timeout.",
        ("kind",),
    ),
    _Declared(
        "store_latency",
        Histogram,
        "compaction_proxy_store_seconds",
        "Store operation latency.",
        ("operation",),
        buckets=_STORE_BUCKETS,
    ),
    _Declared(
        "store_at_once",
        Counter,
        "compaction_proxy_store_answered_at_once",
        "Store operations answered without a store call: checkpoint lookups the "
        "store knew had nothing to find (nothing written since it last looked). "
        "Not in compaction_proxy_store_seconds, which times calls.",
        ("operation",),
    ),
    _Declared(
        "store_errors",
        Counter,
        "compaction_proxy_store_errors",
        "Store calls that failed, timed out, or were skipped after a timeout; "
        "the request went on without the store.",
        ("operation", "kind"),
    ),
    _Declared(
        "rereads",
        Counter,
        "compaction_proxy_rereads",
        "Tool calls that fetched again what a compaction applied to the request had "
        "removed (the same call, or a read of a file a removed call read), by model "
        "and tool.",
        ("model", "tool"),
    ),
    _Declared(
        "recalls",
        Counter,
        "compaction_proxy_recalls",
        "Calls to the compaction_recall tool the proxy answered itself, by API and "
        "outcome: answered, not_found (an unknown ref, or another caller's), invalid "
        "(arguments it cannot read), budget (the turn's recall budget spent), dropped "
        "(made after a client tool call was already streamed), limit (past the rounds).",
        ("api", "outcome"),
    ),
    _Declared(
        "prompt_tokens",
        Counter,
        "compaction_proxy_prompt_tokens",
        "Prompt tokens of the answers as the upstream's usage reported them, by part: "
        "uncached, cache_read, cache_write (an API that reports no writes: the part "
        "not read).",
        ("model", "part"),
    ),
    _Declared(
        "output_tokens",
        Counter,
        "compaction_proxy_output_tokens",
        "Output tokens of the answers as the upstream's usage reported them.",
        ("model",),
    ),
    _Declared(
        "unpriced",
        Counter,
        "compaction_proxy_unpriced_requests",
        "Answered requests whose answer reported no usage: not in the token and "
        "cost counters (their summarizer calls are).",
        ("model",),
    ),
    _Declared(
        "summarizer_tokens",
        Counter,
        "compaction_proxy_summarizer_tokens",
        "Tokens of the LLM summarizer's answered calls, by part (prompt, output), as "
        "their usage reported them or, without one, estimated.",
        ("part",),
    ),
    _Declared(
        "cost",
        Counter,
        "compaction_proxy_cost",
        "What the answers and the summarizer calls cost, in plain input tokens of the "
        "model's price (compaction.pricing).",
        ("model",),
    ),
    _Declared(
        "cost_without",
        Counter,
        "compaction_proxy_cost_without_compaction",
        "The estimated cost of the same requests forwarded as the clients sent them, "
        "in plain input tokens (docs/compaction.md#what-a-compaction-costs).",
        ("model",),
    ),
    _Declared(
        "cost_dollars",
        Counter,
        "compaction_proxy_cost_dollars",
        "compaction_proxy_cost in US dollars, for models with a known input price.",
        ("model",),
    ),
    _Declared(
        "cost_without_dollars",
        Counter,
        "compaction_proxy_cost_without_compaction_dollars",
        "compaction_proxy_cost_without_compaction in US dollars, for models with a "
        "known input price.",
        ("model",),
    ),
)


class Metrics:
    """The proxy's Prometheus metrics, declared in :data:`_DECLARED`."""

    requests: Counter
    compactions: Counter
    tokens_before: Counter
    tokens_after: Counter
    summarizer_calls: Counter
    summarizer_failures: Counter
    background: Counter
    background_running: Gauge
    overflow_retries: Counter
    upstream_latency: Histogram
    upstream_errors: Counter
    store_latency: Histogram
    store_at_once: Counter
    store_errors: Counter
    rereads: Counter
    recalls: Counter
    prompt_tokens: Counter
    output_tokens: Counter
    unpriced: Counter
    summarizer_tokens: Counter
    cost: Counter
    cost_without: Counter
    cost_dollars: Counter
    cost_without_dollars: Counter

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for declared in _DECLARED:
            setattr(self, declared.attribute, declared.build(self.registry))
        self._models: set[str] = set()
        self._tools: set[str] = set()
        #: Labelled children of the per-request metrics: ``labels()`` takes a
        #: lock and builds a key on every call, and these are hit per request.
        self._per_request: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        self._latency = _Children(self.upstream_latency)
        self._store_latency = _Children(self.store_latency)
        self._store_at_once = _Children(self.store_at_once)
        self._usage: dict[str, _UsageChildren] = {}
        #: The two dollar costs, per model label: made for a model only once it
        #: has a dollar price, so a model without one shows no dollar series.
        self._cost_dollars = _Children(self.cost_dollars)
        self._cost_without_dollars = _Children(self.cost_without_dollars)

    def model(self, name: str) -> str:
        if name in self._models:
            return name
        if len(name) > MAX_LABEL_CHARS:
            return "other"
        if len(self._models) < MAX_MODELS:
            self._models.add(name)
            return name
        return "other"

    def tool(self, name: str) -> str:
        """``name`` as a label value: the first :data:`MAX_TOOLS` names, "other" after."""
        if name in self._tools:
            return name
        if not name or len(name) > MAX_LABEL_CHARS or len(self._tools) >= MAX_TOOLS:
            return "other"
        self._tools.add(name)
        return name

    def record_rereads(self, model: str, by_tool: dict[str, int]) -> None:
        """The re-reads of one request, counted per tool."""
        if not by_tool:
            return
        label = self.model(model or "-")
        for tool, count in by_tool.items():
            self.rereads.labels(label, self.tool(tool)).inc(count)

    def record_request(
        self, model: str, result: CompactionResult, tokens_before: int, *, llm_mode: bool
    ) -> None:
        """One request's sizes, and the compaction it made (not one reused from
        the store; summarizer calls are counted as they are sent, by the
        summarizer)."""
        if result.stage not in ("none", "reused"):
            self.compactions.labels(result.reason, result.stage).inc()
            if llm_mode:
                self.record_summary(result)
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

    def record_usage(
        self,
        model: str,
        usage: Usage | None,
        cost: float,
        without: float,
        dollars: tuple[float, float] | None = None,
    ) -> None:
        """One answered request's usage (``None``: it reported none) and price,
        its summarizer calls left out (:meth:`record_summarizer` counted them);
        ``dollars``: the same two prices in US dollars, where known."""
        children = self._usage.get(model)
        if children is None:
            label = self.model(model or "-")
            children = _UsageChildren(
                self.prompt_tokens.labels(label, "uncached"),
                self.prompt_tokens.labels(label, "cache_read"),
                self.prompt_tokens.labels(label, "cache_write"),
                self.output_tokens.labels(label),
                self.unpriced.labels(label),
                self.cost.labels(label),
                self.cost_without.labels(label),
            )
            if len(self._usage) < MAX_MODELS * 2:
                self._usage[model] = children
        if usage is None:
            children.unpriced.inc()
        else:
            children.uncached.inc(usage.uncached)
            children.cache_read.inc(usage.cache_read)
            children.cache_write.inc(usage.cache_write)
            children.output.inc(usage.output)
        children.cost.inc(cost)
        children.without.inc(without)
        if dollars is not None:  # only models with a known price show dollars at all
            label = self.model(model or "-")
            self._cost_dollars[label].inc(dollars[0])
            self._cost_without_dollars[label].inc(dollars[1])

    def record_summarizer(
        self, model: str, usage: Usage, cost: float, dollars: float | None = None
    ) -> None:
        """One answered summarizer call: its tokens and price, counted as it
        comes back (a preview's and a background preparation's too)."""
        self.summarizer_tokens.labels("prompt").inc(usage.prompt)
        self.summarizer_tokens.labels("output").inc(usage.output)
        label = self.model(model or "-")
        self.cost.labels(label).inc(cost)
        if dollars is not None:
            self.cost_dollars.labels(label).inc(dollars)

    def record_summary(self, result: CompactionResult) -> None:
        """A compaction that may have asked the llm summarizer: a failure only if
        the model was asked and its answer not used. A digest written without
        asking it (a prepared summary applied, no room for a model's summary) is
        no failure."""
        if result.summarizer_calls > 0 and result.summarizer_used == "extractive":
            self.summarizer_failures.inc()

    def record_empty_stream(self) -> None:
        """An upstream stream that ended before its first event: an error answer."""
        self.upstream_errors.labels("empty").inc()

    def record_upstream(
        self, route: str, seconds: float, status: int | None, kind: str = ""
    ) -> None:
        if status is not None:
            self._latency[route].observe(seconds)
            if status >= 400:
                self.upstream_errors.labels(f"{status // 100}xx").inc()
        else:
            self.upstream_errors.labels(kind).inc()

    def store_call(self, operation: str, seconds: float) -> None:
        """A store call took ``seconds`` (failed or not); the store's
        :class:`~proxy.state.stores.StoreObserver`."""
        self._store_latency[operation].observe(seconds)

    def store_answered_at_once(self, operation: str) -> None:
        self._store_at_once[operation].inc()

    def store_failed(self, operation: str, kind: FailureKind) -> None:
        self.store_errors.labels(operation, kind).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _UsageChildren(NamedTuple):
    """One model's children of the usage and cost metrics (see ``_per_request``)."""

    uncached: Any
    cache_read: Any
    cache_write: Any
    output: Any
    unpriced: Any
    cost: Any
    without: Any


class _Children(dict[str, Any]):
    """``metric``'s child per label (one of a bounded few: routes, store
    operations, model labels as :meth:`Metrics.model` bounds them), made by its
    first ``labels()`` call and then only looked up."""

    def __init__(self, metric: Any) -> None:
        super().__init__()
        self.metric = metric

    def __missing__(self, label: str) -> Any:
        child = self[label] = self.metric.labels(label)
        return child
