"""The conversations service: what the proxy keeps of every conversation and
model, and the one place a model's name becomes its configuration.

It owns the store, the reading cache, the recall memory, the background
preparations, each conversation's previous prompt and what was learned of
each upstream's model (:mod:`proxy.state.models`); it is handed the
:class:`~proxy.upstream.service.Upstream` (for the traffic and the summary
pool a preparation uses) and the :class:`~proxy.state.observability.Observability`
it records to. Built once in the app's lifespan; there are no module globals.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from compaction import ReadingCache, TokenCounter, encoding_for_model, load_encoding, splits_digits
from config import ModelConfig, ModelResolver, Settings
from proxy.recall.memory import RecallMemory
from proxy.session.background import Background
from proxy.state.models import ANONYMOUS, ModelKnowledge, calibration_key
from proxy.state.observability import Observability
from proxy.state.prompts import LastPrompts
from proxy.state.stores import Store
from proxy.upstream.pace import Pace
from proxy.upstream.service import Upstream
from proxy.upstream.traffic import Sending


class Conversations:
    """Conversations and models, as this process knows them (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        upstream: Upstream,
        observed: Observability,
        *,
        readings: ReadingCache | None = None,
        background: Background | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.upstream = upstream
        self.observed = observed
        self.resolver = ModelResolver(settings)
        #: What the proxy learned about each upstream's model, at most
        #: ``store.max_model_rows`` of them.
        self.models = ModelKnowledge(store, max_rows=settings.store.max_model_rows)
        #: The latest request of each conversation, read (see compaction.incremental):
        #: the next one is read in proportion to what it adds.
        self.readings = readings if readings is not None else ReadingCache()
        #: Compactions prepared ahead of need, running off the request path.
        self.background = background if background is not None else Background()
        #: Recall exchanges the clients never saw, put back on their next turns.
        self.recalls = RecallMemory()
        #: Each conversation's previous client request: the prompt cache it would
        #: have had without compaction (the cost figures' estimate).
        self.prompts = LastPrompts()
        #: (owner, session) asked to "compact now" from the dashboard: their next
        #: request through this process is compacted as by ``/compact``.
        self.compact_now: set[tuple[str, str]] = set()
        #: This process, as named in the events it writes.
        self.instance = uuid.uuid4().hex[:12]
        self._counters: dict[tuple[str, int, bool], TokenCounter] = {}
        #: The counter of each model name (and image cost) seen lately: a name
        #: is the client's to invent, so at most ``store.max_model_rows``.
        self._model_counters: dict[tuple[str | None, int], TokenCounter] = {}
        self._max_model_counters = settings.store.max_model_rows

    def model_config(self, model: str | None, owner: str = ANONYMOUS) -> ModelConfig:
        """The model's configuration with the windows stated for it and learned
        by (or agreed for) ``owner``, held to the working limit empty streams taught."""
        config = self.resolver.resolve(model)
        window, server, limit = self.models.windows(calibration_key(config), owner)
        if window is None and server is None and limit is None:
            return config
        learned = {config.model: window} if window is not None else None
        return self.resolver.resolve(model, learned, server, limit)

    def counter(self, config: ModelConfig) -> TokenCounter:
        """One counter (and so one token cache) per encoding, image cost and
        way of counting digits (:func:`compaction.tokens.splits_digits`)."""
        model, image_tokens = config.model, config.profile.image_tokens
        counter = self._model_counters.get((model, image_tokens))
        if counter is not None:  # a model's next request: its encoding was found
            return counter
        key = (encoding_for_model(model), image_tokens, splits_digits(model))
        counter = self._counters.get(key)
        if counter is None:
            counter = TokenCounter(encoding=key[0], image_tokens=key[1], digits_apart=key[2])
            self._counters[key] = counter
        counters = self._model_counters
        counters[model, image_tokens] = counter
        while len(counters) > self._max_model_counters:
            del counters[next(iter(counters))]
        return counter

    def warm(self) -> None:
        """Load the tokenizers before serving: loading one takes most of a second
        and holds the GIL, which would stall every request in flight."""
        for model in (None, *self.settings.models):
            self.counter(self.model_config(model))
        for encoding in ("o200k_base", "cl100k_base"):
            load_encoding(encoding)

    def summary_pace(self, config: ModelConfig) -> Pace:
        """How fast ``config``'s upstream writes summaries with its summary model."""
        return self.upstream.paces.of(calibration_key(config, config.summary_model))

    def single_slot(self, config: ModelConfig) -> bool:
        """Whether ``config``'s upstream serves one request at a time, as it states
        (``total_slots``) or as seen (:meth:`~proxy.upstream.traffic.Traffic.single_slot`)."""
        return self.upstream.traffic.single_slot(calibration_key(config), self.models.slots(config))

    async def sending(self, config: ModelConfig) -> Sending:
        """A user's request is about to be sent upstream: counted in flight until
        its answer is over (:meth:`proxy.upstream.traffic.Sending.answered`), and on a
        one-slot upstream the background summaries to it cancelled first."""
        key = calibration_key(config)
        return await self.upstream.traffic.begin(key, stated=self.models.slots(config))

    def discover(self, config: ModelConfig, base: str, headers: Mapping[str, str]) -> None:
        """Ask ``config``'s server for its window off the request path; what it
        states is kept (:meth:`ModelKnowledge.server_stated`)."""
        self.upstream.discover(
            calibration_key(config), config, base, headers, self.models.server_stated
        )
