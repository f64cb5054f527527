"""What the proxy learned about each upstream's model: :class:`ModelKnowledge`.

One :class:`Known` record per (upstream, model), by :func:`calibration_key`:

* ``window_learned`` — the window a genuine overflow error stated
  (:func:`compaction.window_to_learn`); stored.
* ``window_stated`` and ``slots`` — what the server states it serves (its
  /props, /v1/models, …: :mod:`proxy.upstream.discovery`); stored, under
  :func:`server_key` and :func:`slots_key` in the learned-window rows.
* ``proven`` — the largest prompt the upstream's ``usage`` counted as answered:
  a stated window below it is a lie and is not learned; memory only.
* ``streamed`` — the largest streamed prompt (our estimate × the ratio) that
  began to be answered, for servers that send no ``usage`` on streams; read
  only by the empty-stream rule; memory only.
* ``working_limit`` — the window empty streams narrowed
  (:func:`compaction.empty_stream_lesson`): a guess, not a statement, so
  memory only (a restart forgets it, the next empty stream teaches it again).
* ``ratio`` and ``calibration`` — the upstream's count ÷ our estimate, and the
  samples it follows (:func:`compaction.calibrate`); the ratio is stored, the
  samples are not (a restarted process takes the ratio for a prior).

The rules are the engine's (:mod:`compaction.lessons`, :mod:`compaction.calibration`);
this class only applies them and keeps the results. The records are one
bounded dict: past ``store.max_model_rows`` keys the least recently updated
goes, whatever it held — the keys hold model names clients send, which cost
nothing to invent. A store that fails never fails the caller: what it could
not write is logged and kept in memory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from compaction import (
    Calibration,
    EmptyStream,
    EmptyStreamLesson,
    calibrate,
    empty_stream_lesson,
    proven_floor,
    ratio_sample,
    restored_calibration,
    window_to_learn,
    working_limit_after_answer,
)
from config import ModelConfig
from proxy.state.stores import Store
from proxy.upstream.discovery import ServerFacts

logger = logging.getLogger(__name__)

#: A learned ratio is written to the store again only when it moved by more
#: than this share: every answer refines it, and a write per request would cost.
RATIO_WRITE_STEP = 0.005

#: Prefixes of the rows the store's learned-window table keeps for what
#: servers state (windows, slots), apart from the windows overflow errors taught.
SERVER_PREFIX = "server\x1f"
SLOTS_PREFIX = "slots\x1f"


def calibration_key(config: ModelConfig) -> str:
    """Everything is learned per upstream and model: one model name may be
    served by different upstreams (and tokenizers) through per-model settings."""
    return f"{config.upstream}\x1f{config.model}"


def server_key(key: str) -> str:
    """The store's row for the window the server states under ``key``."""
    return SERVER_PREFIX + key


def slots_key(key: str) -> str:
    """The store's row for the slots the server states under ``key``."""
    return SLOTS_PREFIX + key


@dataclass(frozen=True)
class Known:
    """What is known of one upstream and model (the module doc says where each
    comes from, and which are stored)."""

    window_learned: int | None = None
    window_stated: int | None = None
    slots: int | None = None
    proven: int = 0
    streamed: int = 0
    working_limit: int | None = None
    ratio: float | None = None
    calibration: Calibration | None = None

    @property
    def answered(self) -> int:
        """The largest prompt answered, as far as the empty-stream rule knows:
        by the upstream's ``usage``, or by our estimate of a stream."""
        return max(self.proven, self.streamed)


NOTHING = Known()
#: The figures of a :class:`Known` the store keeps.
STORED = ("window_learned", "window_stated", "slots", "ratio")


class ModelKnowledge:
    """The :class:`Known` record of each upstream and model, at most ``max_rows``."""

    def __init__(self, store: Store, *, max_rows: int) -> None:
        self._store = store
        self._max_rows = max_rows
        self._rows: dict[str, Known] = {}
        #: Store writes of learned ratios still under way (kept so none is lost).
        self._writes: set[asyncio.Task[None]] = set()

    # --- reading ------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[str]:
        """The keys, least recently updated first."""
        return iter(list(self._rows))

    def get(self, key: str) -> Known:
        """The record under ``key`` (:data:`NOTHING` when nothing is known)."""
        return self._rows.get(key, NOTHING)

    def of(self, config: ModelConfig) -> Known:
        """The record of ``config``'s upstream and model."""
        return self.get(calibration_key(config))

    def slots(self, config: ModelConfig) -> int | None:
        """How many requests the upstream serves at once, where it says."""
        return self.of(config).slots

    def working_limit(self, config: ModelConfig) -> int | None:
        """The window empty streams narrowed for this upstream and model, if any."""
        return self.of(config).working_limit

    def answered(self, config: ModelConfig) -> int:
        """The largest prompt this upstream and model answered (:attr:`Known.answered`)."""
        return self.of(config).answered

    def ratio(self, config: ModelConfig) -> float:
        """The calibration ratio for this model's upstream (1.0 until one is learned)."""
        ratio = self.of(config).ratio
        return 1.0 if ratio is None else ratio

    def within_working_limit(self, config: ModelConfig) -> ModelConfig:
        """``config`` with its window held to the working limit, when that is smaller."""
        limit = self.working_limit(config)
        if limit is None or limit >= config.profile.context_window:
            return config
        profile = dataclasses.replace(config.profile, context_window=limit)
        return dataclasses.replace(config, profile=profile, window_source="empty-stream")

    # --- learning -----------------------------------------------------------------

    def restore(self, windows: Mapping[str, int], ratios: Mapping[str, float]) -> None:
        """Take the store's rows (its learned windows, with what servers stated
        under their prefixes, and its ratios) as older than anything this
        process learned meanwhile, which is the newer and is kept."""
        restored: dict[str, Known] = {}
        for row, value in windows.items():
            if row.startswith(SERVER_PREFIX):  # what a server stated, not an overflow
                key = row.removeprefix(SERVER_PREFIX)
                known = dataclasses.replace(restored.get(key, NOTHING), window_stated=value)
            elif row.startswith(SLOTS_PREFIX):
                key = row.removeprefix(SLOTS_PREFIX)
                known = dataclasses.replace(restored.get(key, NOTHING), slots=value)
            else:
                key = row
                known = dataclasses.replace(restored.get(key, NOTHING), window_learned=value)
            restored[key] = known
        for key, ratio in ratios.items():
            restored[key] = dataclasses.replace(restored.get(key, NOTHING), ratio=ratio)
        for key, known in self._rows.items():  # learned here: each figure it has wins
            stored = restored.pop(key, NOTHING)
            kept = {name: getattr(stored, name) for name in STORED if getattr(known, name) is None}
            restored[key] = dataclasses.replace(known, **kept)
        self._rows = restored
        self._trim()

    async def learn_window(self, config: ModelConfig, window: int) -> bool:
        """Remember a window an overflow error stated, here and in the store;
        whether it was taken (:func:`compaction.window_to_learn`)."""
        key = calibration_key(config)
        known = self.get(key)
        lesson = window_to_learn(known.window_learned, window, known.proven)
        if not lesson.taken:
            logger.warning("an overflow error stated an implausible window; not learned")
            return False
        if lesson.remember is not None:
            self._keep(key, dataclasses.replace(known, window_learned=lesson.remember))
            await self._store_window(key, lesson.remember, "the learned window")
        return True

    async def server_stated(self, config: ModelConfig, facts: ServerFacts) -> bool:
        """Keep what the server stated, here and in the store; whether it stated a window."""
        key = calibration_key(config)
        if facts.slots is not None and self.get(key).slots != facts.slots:
            self._keep(key, dataclasses.replace(self.get(key), slots=facts.slots))
            await self._store_window(slots_key(key), facts.slots, "what the upstream stated")
        if facts.window is None:
            return False
        if self.get(key).window_stated != facts.window:
            logger.info(
                "the upstream serves %r with a %d-token window (%s)",
                config.model,
                facts.window,
                facts.source,
            )
            self._keep(key, dataclasses.replace(self.get(key), window_stated=facts.window))
            await self._store_window(server_key(key), facts.window, "what the upstream stated")
        return True

    def prove(self, config: ModelConfig, prompt_tokens: int) -> None:
        """A prompt of ``prompt_tokens`` was answered: the window is at least that."""
        key = calibration_key(config)
        known = self.get(key)
        proven = proven_floor(known.proven, prompt_tokens)
        # Most answers prove no more than the last one did: the record is kept
        # as it is (now the most recently updated), not copied unchanged.
        self._keep(
            key, known if proven == known.proven else dataclasses.replace(known, proven=proven)
        )
        self._raise_working_limit(key)

    def stream_answered(self, config: ModelConfig, tokens: int) -> None:
        """A streamed request of ``tokens`` (our estimate × the ratio) began to be answered."""
        key = calibration_key(config)
        known = self.get(key)
        if tokens > known.streamed:
            self._keep(key, dataclasses.replace(known, streamed=tokens))
            self._raise_working_limit(key)

    def empty_stream(self, config: ModelConfig, tokens: int) -> EmptyStreamLesson:
        """A streamed request of ``tokens`` (our estimate × the ratio) got an empty
        stream: what it teaches (:func:`compaction.empty_stream_lesson`), kept."""
        key = calibration_key(config)
        known = self.get(key)
        current = known.working_limit
        lesson = empty_stream_lesson(
            EmptyStream(tokens=tokens, answered=known.answered, limit=current)
        )
        if lesson.limit is not None and lesson.limit != current:
            self._keep(key, dataclasses.replace(known, working_limit=lesson.limit))
            logger.warning(
                "an empty stream narrowed the working window of %r to %d tokens",
                config.model,
                lesson.limit,
            )
        return lesson

    def learn_ratio(self, config: ModelConfig, sample: float) -> None:
        """One answer (or an overflow error's count) showed the upstream counting
        ``sample`` × our estimate: the ratio follows the recent samples by the
        engine's rule (:func:`compaction.calibrate`). The store is written in
        the background, and only when the ratio moved by more than
        :data:`RATIO_WRITE_STEP`."""
        key = calibration_key(config)
        known = self.get(key)
        old, previous = known.ratio, known.calibration
        if previous is None and old is not None:  # restored from the store
            previous = restored_calibration(old)
        calibration = calibrate(previous, sample)
        ratio = calibration.ratio
        self._keep(key, dataclasses.replace(known, calibration=calibration, ratio=ratio))
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

    async def written(self) -> None:
        """Wait for the ratio writes under way to end."""
        await asyncio.gather(*self._writes)

    # --- keeping ------------------------------------------------------------------

    def _raise_working_limit(self, key: str) -> None:
        known = self.get(key)
        raised = working_limit_after_answer(known.working_limit, known.answered)
        if raised is not None and raised != known.working_limit:
            self._keep(key, dataclasses.replace(known, working_limit=raised))

    def _keep(self, key: str, known: Known) -> None:
        """``known`` under ``key``, now the most recently updated record; past
        ``max_rows`` the least recently updated go."""
        self._rows.pop(key, None)  # re-inserted last: a dict keeps insertion order
        self._rows[key] = known
        self._trim()

    def _trim(self) -> None:
        while len(self._rows) > self._max_rows:
            del self._rows[next(iter(self._rows))]

    async def _store_window(self, row: str, value: int, what: str) -> None:
        try:
            await self._store.set_learned_window(row, value)
        except Exception:  # the store being down must not fail anything
            logger.warning("could not store %s", what, exc_info=True)

    async def _write_ratio(self, key: str, ratio: float) -> None:
        try:
            await self._store.set_calibration(key, ratio)
        except Exception:  # the store being down must not fail a request
            logger.warning("could not store the calibration ratio", exc_info=True)
