"""What the running proxy holds: settings, the upstream transport, the store, caches.

Built once in the app's lifespan and passed to the handlers; there are no
module globals.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import TypeVar

from starlette.requests import HTTPConnection

from compaction import (
    Calibration,
    EmptyStream,
    EmptyStreamLesson,
    ReadingCache,
    TokenCounter,
    calibrate,
    empty_stream_lesson,
    encoding_for_model,
    load_encoding,
    proven_floor,
    ratio_sample,
    restored_calibration,
    splits_digits,
    window_to_learn,
    working_limit_after_answer,
)
from config import ModelConfig, ModelResolver, Settings
from proxy.session.background import Background, Traffic
from proxy.state.metrics import Metrics
from proxy.state.recorder import Recorder
from proxy.state.stores import Store
from proxy.upstream.discovery import Discoveries, discover, is_local
from proxy.upstream.transport import Transport

logger = logging.getLogger(__name__)
_V = TypeVar("_V")

#: A learned ratio is written to the store again only when it moved by more
#: than this share: every answer refines it, and a write per request would cost.
RATIO_WRITE_STEP = 0.005


@dataclass
class ProxyState:
    settings: Settings
    #: Every request upstream: relayed ones and the llm summarizer's.
    transport: Transport
    store: Store
    resolver: ModelResolver
    metrics: Metrics = field(default_factory=Metrics)
    #: This process, as named in the events it writes.
    instance: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    #: Context windows stated by genuine upstream overflow errors, by
    #: :func:`calibration_key` (upstream and model).
    learned_windows: dict[str, int] = field(default_factory=dict)
    #: Context windows the upstream server states it serves (its /props,
    #: /v1/models, …: :mod:`proxy.upstream.discovery`), by the same key.
    server_windows: dict[str, int] = field(default_factory=dict)
    #: How many requests each upstream serves at once, where it says (llama.cpp's
    #: ``total_slots``), by the same key.
    server_slots: dict[str, int] = field(default_factory=dict)
    #: The questions to the upstream servers about their windows, off the request path.
    discoveries: Discoveries = field(default_factory=lambda: Discoveries(max_keys=1024))
    #: The largest prompt each upstream and model answered (by the same key):
    #: a window below it is a lie, and is not learned.
    proven: dict[str, int] = field(default_factory=dict)
    #: Windows narrowed by empty streams (:func:`compaction.empty_stream_lesson`),
    #: by the same key: a guess, not a statement, so kept in memory only (a
    #: restart forgets it, and the next empty stream teaches it again).
    working_limits: dict[str, int] = field(default_factory=dict)
    #: The largest streamed prompt (our estimate × the ratio) each upstream and
    #: model began to answer, by the same key: some servers send no ``usage``
    #: on streams, so this is all that tells an empty stream of a size already
    #: answered from an overflow. Only the empty-stream rule reads it; a stated
    #: window is weighed against ``proven`` alone, the upstream's own counts.
    streamed: dict[str, int] = field(default_factory=dict)
    #: The upstream's token count ÷ our estimate, by :func:`calibration_key`.
    ratios: dict[str, float] = field(default_factory=dict)
    #: The recent samples each ratio follows (:mod:`compaction.calibration`), by
    #: the same key. Kept in memory only: the store keeps the ratio, which a
    #: restarted process takes for a prior that the next answers move by steps.
    calibrations: dict[str, Calibration] = field(default_factory=dict)
    #: Compactions prepared ahead of need, running off the request path.
    background: Background = field(default_factory=Background)
    #: The user requests and background summaries in flight, by the same key:
    #: a preparation for a one-slot server never runs beside a user's request
    #: (``background.single_slot``).
    traffic: Traffic = field(default_factory=Traffic)
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
    #: Store writes of learned ratios still under way (kept so none is lost).
    _writes: set[asyncio.Task[None]] = field(default_factory=set)
    _counters: dict[tuple[str, int, bool], TokenCounter] = field(default_factory=dict)

    def resolve(self, model: str | None) -> ModelConfig:
        config = self.resolver.resolve(model)
        key = calibration_key(config)
        window, server = self.learned_windows.get(key), self.server_windows.get(key)
        if window is None and server is None:
            return self.within_working_limit(config)
        learned = {config.model: window} if window is not None else None
        return self.within_working_limit(self.resolver.resolve(model, learned, server))

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

    async def learn_window(self, config: ModelConfig, window: int) -> bool:
        """Remember a window an overflow error stated, for this upstream and model,
        here and in the store; whether it was taken.

        The rule is the engine's (:func:`compaction.window_to_learn`).
        """
        key = calibration_key(config)
        lesson = window_to_learn(self.learned_windows.get(key), window, self.proven.get(key, 0))
        if not lesson.taken:
            logger.warning("an overflow error stated an implausible window; not learned")
            return False
        if lesson.remember is not None:
            self._remember(self.learned_windows, key, lesson.remember)
            try:
                await self.store.set_learned_window(key, lesson.remember)
            except Exception:  # the store being down must not fail a request
                logger.warning("could not store the learned window", exc_info=True)
        return True

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
        key = calibration_key(config)
        self.discoveries.start(key, lambda: self._ask_server(config, key, credentials))

    async def _ask_server(self, config: ModelConfig, key: str, credentials: dict[str, str]) -> bool:
        """One discovery: what the server states is kept here and in the store
        (under :func:`server_key`); whether it stated a window."""
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
        if facts.slots is not None and self.server_slots.get(key) != facts.slots:
            self._remember(self.server_slots, key, facts.slots)
            await self._store_server_figure(slots_key(key), facts.slots)
        if facts.window is None:
            return False
        if self.server_windows.get(key) != facts.window:
            logger.info(
                "the upstream serves %r with a %d-token window (%s)",
                config.model,
                facts.window,
                facts.source,
            )
            self._remember(self.server_windows, key, facts.window)
            await self._store_server_figure(server_key(key), facts.window)
        return True

    async def _store_server_figure(self, key: str, value: int) -> None:
        try:
            await self.store.set_learned_window(key, value)
        except Exception:  # the store being down must not fail anything
            logger.warning("could not store what the upstream stated", exc_info=True)

    def prove(self, config: ModelConfig, prompt_tokens: int) -> None:
        """A prompt of ``prompt_tokens`` was answered: the window is at least that."""
        key = calibration_key(config)
        self._remember(self.proven, key, proven_floor(self.proven.get(key, 0), prompt_tokens))
        self._raise_working_limit(key)

    def working_limit(self, config: ModelConfig) -> int | None:
        """The window empty streams narrowed for this upstream and model, if any."""
        return self.working_limits.get(calibration_key(config))

    def answered(self, config: ModelConfig) -> int:
        """The largest prompt this upstream and model answered, as far as the
        empty-stream rule knows: by its ``usage``, or by our estimate of a stream."""
        key = calibration_key(config)
        return max(self.proven.get(key, 0), self.streamed.get(key, 0))

    def stream_answered(self, config: ModelConfig, tokens: int) -> None:
        """A streamed request of ``tokens`` (our estimate × the ratio) began to be answered."""
        key = calibration_key(config)
        if tokens > self.streamed.get(key, 0):
            self._remember(self.streamed, key, tokens)
            self._raise_working_limit(key)

    def empty_stream(self, config: ModelConfig, tokens: int) -> EmptyStreamLesson:
        """A streamed request of ``tokens`` (our estimate × the ratio) got an empty
        stream: what it teaches (:func:`compaction.empty_stream_lesson`), kept."""
        key = calibration_key(config)
        current = self.working_limits.get(key)
        stream = EmptyStream(tokens=tokens, answered=self.answered(config), limit=current)
        lesson = empty_stream_lesson(stream)
        if lesson.limit is not None and lesson.limit != current:
            self._remember(self.working_limits, key, lesson.limit)
            logger.warning(
                "an empty stream narrowed the working window of %r to %d tokens",
                config.model,
                lesson.limit,
            )
        return lesson

    def _raise_working_limit(self, key: str) -> None:
        limit = self.working_limits.get(key)
        answered = max(self.proven.get(key, 0), self.streamed.get(key, 0))
        raised = working_limit_after_answer(limit, answered)
        if raised is not None and raised != limit:
            self._remember(self.working_limits, key, raised)

    def within_working_limit(self, config: ModelConfig) -> ModelConfig:
        """``config`` with its window held to the working limit, when that is smaller."""
        limit = self.working_limits.get(calibration_key(config))
        if limit is None or limit >= config.profile.context_window:
            return config
        profile = dataclasses.replace(config.profile, context_window=limit)
        return dataclasses.replace(config, profile=profile, window_source="empty-stream")

    def ratio(self, config: ModelConfig) -> float:
        """The calibration ratio for this model's upstream (1.0 until one is learned)."""
        return self.ratios.get(calibration_key(config), 1.0)

    def learn_ratio(self, config: ModelConfig, sample: float) -> None:
        """One answer (or an overflow error's count) showed the upstream counting
        ``sample`` × our estimate: the ratio follows the recent samples by the
        engine's rule (:func:`compaction.calibrate`). The store is written in
        the background, and only when the ratio moved by more than
        :data:`RATIO_WRITE_STEP`."""
        key = calibration_key(config)
        old = self.ratios.get(key)
        previous = self.calibrations.get(key)
        if previous is None and old is not None:  # restored from the store
            previous = restored_calibration(old)
        calibration = calibrate(previous, sample)
        ratio = calibration.ratio
        self._remember(self.calibrations, key, calibration)
        self._remember(self.ratios, key, ratio)
        if old is not None and abs(ratio - old) <= RATIO_WRITE_STEP * old:
            return
        task = asyncio.ensure_future(self._write_ratio(key, ratio))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def observe(self, config: ModelConfig, estimate: int, upstream_tokens: int) -> None:
        """An answer's ``usage`` says the upstream counted ``upstream_tokens`` for a
        request we estimated at ``estimate``: learn from it."""
        self.prove(config, upstream_tokens)
        sample = ratio_sample(upstream_tokens, estimate)
        if sample is not None:
            self.learn_ratio(config, sample)

    async def _write_ratio(self, key: str, ratio: float) -> None:
        try:
            await self.store.set_calibration(key, ratio)
        except Exception:  # the store being down must not fail a request
            logger.warning("could not store the calibration ratio", exc_info=True)

    def _remember(self, rows: dict[str, _V], key: str, value: _V) -> None:
        """``rows[key] = value`` as the most recently updated row; past
        ``store.max_model_rows`` rows the least recently updated go. The keys
        hold model names clients send, which cost nothing to invent."""
        rows.pop(key, None)  # re-inserted last: a dict keeps insertion order
        rows[key] = value
        excess = len(rows) - self.settings.store.max_model_rows
        for stale in list(itertools.islice(rows, max(excess, 0))):
            del rows[stale]

    def configured_key(self, env: str | None) -> str | None:
        """The key in the variable ``env`` (a model's ``api_key_env`` or
        ``anthropic_api_key_env``), used only when a client sends none."""
        return (os.environ.get(env) or None) if env else None


def state_of(request: HTTPConnection) -> ProxyState:
    """The running proxy's state, from a request to its app (set in the lifespan)."""
    state: ProxyState = request.app.state.proxy
    return state


#: Prefixes of the rows the store's learned-window table keeps for what
#: servers state (windows, slots), apart from the windows overflow errors taught.
SERVER_PREFIX = "server\x1f"
SLOTS_PREFIX = "slots\x1f"


def server_key(key: str) -> str:
    """The store's row for the window the server states under ``key``."""
    return SERVER_PREFIX + key


def slots_key(key: str) -> str:
    """The store's row for the slots the server states under ``key``."""
    return SLOTS_PREFIX + key


def calibration_key(config: ModelConfig) -> str:
    """Ratios are learned per upstream and model: one model name may be served
    by different upstreams (and tokenizers) through per-model settings."""
    return f"{config.upstream}\x1f{config.model}"


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
