"""What the running proxy holds: settings, the upstream transport, the store,
what it learned of each upstream's model (:mod:`proxy.state.models`), caches.

Built once in the app's lifespan and passed to the handlers; there are no
module globals.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import uuid
from dataclasses import dataclass, field

from starlette.requests import HTTPConnection

from compaction import ReadingCache, TokenCounter, encoding_for_model, load_encoding, splits_digits
from config import ModelConfig, ModelResolver, Settings
from proxy.session.background import Background, Traffic
from proxy.state.metrics import Metrics
from proxy.state.models import ANONYMOUS, ModelKnowledge, calibration_key
from proxy.state.prompts import LastPrompts
from proxy.state.recalls import RecallMemory
from proxy.state.recorder import Recorder
from proxy.state.stores import Store
from proxy.upstream.discovery import Discoveries, discover, is_local
from proxy.upstream.pace import Pace, Paces
from proxy.upstream.transport import Transport

logger = logging.getLogger(__name__)


@dataclass
class ProxyState:
    settings: Settings
    #: Every request upstream: relayed ones and the llm summarizer's.
    transport: Transport
    store: Store
    resolver: ModelResolver
    #: What the proxy learned about each upstream's model (:mod:`proxy.state.models`),
    #: writing to ``store``; at most ``store.max_model_rows`` of them.
    models: ModelKnowledge = field(init=False)
    metrics: Metrics = field(default_factory=Metrics)
    #: This process, as named in the events it writes.
    instance: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    #: The questions to the upstream servers about their windows, off the request path.
    discoveries: Discoveries = field(default_factory=lambda: Discoveries(max_keys=1024))
    #: Compactions prepared ahead of need, running off the request path.
    background: Background = field(default_factory=Background)
    #: The user requests and background summaries in flight, by
    #: :func:`~proxy.state.models.calibration_key` (upstream and model):
    #: a preparation for a one-slot server never runs beside a user's request
    #: (``background.single_slot``).
    traffic: Traffic = field(default_factory=Traffic)
    #: How fast each upstream and model writes summaries, by calibration_key:
    #: the summarizer's deadline and the background's head start.
    paces: Paces = field(default_factory=Paces)
    #: The pool their summaries are asked through, apart from ``transport``
    #: so that they never hold a connection a request waits for; ``None``
    #: sends them through ``transport`` (a test's recording one).
    background_transport: Transport | None = None
    #: Per-request figures on their way to the store (set in the app's lifespan).
    recorder: Recorder | None = None
    #: (owner, session) asked to "compact now" from the dashboard: their next
    #: request through this process is compacted as by ``/compact``.
    compact_now: set[tuple[str, str]] = field(default_factory=set)
    #: The latest request of each conversation, read (see compaction.incremental):
    #: the next one is read in proportion to what it adds.
    readings: ReadingCache = field(default_factory=ReadingCache)
    #: Recall exchanges the clients never saw, put back on their next turns.
    recalls: RecallMemory = field(default_factory=RecallMemory)
    #: Each conversation's previous client request: the prompt cache it would
    #: have had without compaction (the cost figures' estimate).
    prompts: LastPrompts = field(default_factory=LastPrompts)
    _counters: dict[tuple[str, int, bool], TokenCounter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.models = ModelKnowledge(self.store, max_rows=self.settings.store.max_model_rows)

    def resolve(self, model: str | None, owner: str = ANONYMOUS) -> ModelConfig:
        """The model's configuration with the windows stated for it and learned
        by (or agreed for) ``owner``, held to the working limit empty streams taught."""
        config = self.resolver.resolve(model)
        known = self.models.of(config, owner)
        window, server = known.window_learned, known.window_stated
        if window is None and server is None:
            return self.models.within_working_limit(config)
        learned = {config.model: window} if window is not None else None
        return self.models.within_working_limit(self.resolver.resolve(model, learned, server))

    def summary_pace(self, config: ModelConfig) -> Pace:
        """How fast ``config``'s upstream writes summaries with its summary model."""
        summarizing = dataclasses.replace(config, model=config.summary_model)
        return self.paces.of(calibration_key(summarizing))

    def counter(self, config: ModelConfig) -> TokenCounter:
        """One counter (and so one token cache) per encoding, image cost and
        way of counting digits (:func:`compaction.tokens.splits_digits`)."""
        model = config.model
        key = (encoding_for_model(model), config.profile.image_tokens, splits_digits(model))
        counter = self._counters.get(key)
        if counter is None:
            counter = TokenCounter(encoding=key[0], image_tokens=key[1], digits_apart=key[2])
            self._counters[key] = counter
        return counter

    def warm(self) -> None:
        """Load the tokenizers before serving: loading one takes most of a second
        and holds the GIL, which would stall every request in flight."""
        for model in (None, *self.settings.models):
            self.counter(self.resolve(model))
        for encoding in ("o200k_base", "cl100k_base"):
            load_encoding(encoding)

    def discover(self, config: ModelConfig, base: str, credentials: dict[str, str]) -> None:
        """Ask the upstream, in the background, which window it serves this model
        with, unless it was asked already (:class:`Discoveries`); never waits.

        Only for a request going to ``config.upstream`` (``base``), whose
        ``credentials`` are then for that server, and only as
        ``upstream.discover_windows`` allows.
        """
        mode = self.settings.upstream.discover_windows
        if base != config.upstream or mode == "never":
            return
        if mode == "auto" and not is_local(config.upstream):
            return
        ask = functools.partial(self._ask_server, config, credentials)
        self.discoveries.start(calibration_key(config), ask)

    async def _ask_server(self, config: ModelConfig, credentials: dict[str, str]) -> bool:
        """One discovery: what the server states is kept (:meth:`ModelKnowledge.server_stated`);
        whether it stated a window."""
        facts = await discover(
            self.background_transport or self.transport,
            config.upstream,
            config.model,
            credentials,
            timeout=self.settings.upstream.discovery_timeout_seconds,
        )
        if facts is None:
            logger.info("the upstream states no context window for %r", config.model)
            return False
        return await self.models.server_stated(config, facts)

    def configured_key(self, env: str | None) -> str | None:
        """The key in the variable ``env`` (a model's ``api_key_env`` or
        ``anthropic_api_key_env``), used only when a client sends none."""
        return (os.environ.get(env) or None) if env else None


def state_of(request: HTTPConnection) -> ProxyState:
    """The running proxy's state, from a request to its app (set in the lifespan)."""
    state: ProxyState = request.app.state.proxy
    return state


def build_transport(settings: Settings, *, background: bool = False) -> Transport:
    """The pool of the requests (``upstream.max_connections``), or with
    ``background`` the preparations' own (``background.max_connections``), whose
    summaries wait their turn for a connection up to their deadline: nobody is
    waiting on the other side."""
    upstream = settings.upstream
    if not background and "max_keepalive_connections" in upstream.model_fields_set:
        logger.warning(
            "upstream.max_keepalive_connections is ignored: idle connections "
            "expire after upstream.keepalive_expiry (%.1f s)",
            upstream.keepalive_expiry,
        )
    return Transport(
        connect_timeout=upstream.connect_timeout,
        read_timeout=upstream.read_timeout,
        max_connections=(
            settings.background.max_connections if background else upstream.max_connections
        ),
        keepalive_expiry=upstream.keepalive_expiry,
        trust_env=upstream.trust_env,
        ca_bundle=str(upstream.ca_bundle) if upstream.ca_bundle else None,
        pool_timeout=upstream.summarizer_timeout_seconds if background else None,
    )
