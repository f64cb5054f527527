"""What the proxy learned about each upstream's model: :class:`ModelKnowledge`.

Per upstream and model (:func:`calibration_key`), what the server did or
stated, the same whoever asked:

* ``window_stated`` and ``slots`` — what the server states it serves (its
  /props, /v1/models, …: :mod:`proxy.upstream.discovery`); stored, under
  :func:`server_key` and :func:`slots_key` in the learned-window rows.
* ``proven`` — the largest prompt the upstream's ``usage`` counted as answered:
  a window stated below it is a lie and is not learned. Stored (under
  :func:`proven_key`), so the guard holds after a restart too.
* ``streamed`` — the largest streamed prompt (our estimate × the ratio) that
  began to be answered, for servers that send no ``usage`` on streams; read
  only by the empty-stream rule; memory only.
* ``refused`` — the smallest streamed prompt an empty stream was taken for an
  overflow at: with ``window_stated``, the most a streamed estimate can prove
  was answered (a larger one means the server dropped part of it); memory only.
* ``working_limit`` — the window empty streams narrowed
  (:func:`compaction.empty_stream_lesson`): a guess, not a statement, so
  memory only (a restart forgets it, the next empty stream teaches it again).

Per caller as well (the owner, :func:`proxy.edge.access.owner_of`), what that
caller's own requests taught — their content and their key decide it:

* ``window_learned`` — the window a genuine overflow error stated
  (:func:`compaction.window_to_learn`); stored under :func:`owned_key`.
* ``ratio`` and ``calibration`` — the upstream's count ÷ our estimate, and the
  samples it follows (:func:`compaction.calibrate`); the ratio is stored under
  :func:`owned_key`, the samples are not (a restarted process takes the ratio
  for a prior).

A caller that learned no window or ratio of its own gets what
:data:`compaction.lessons.AGREEING_CALLERS` callers agree on
(:func:`compaction.agreed_window`, :func:`compaction.agreed_ratio`), or
nothing: one caller's counts or overflow errors never move another's limit.
:meth:`ModelKnowledge.of` is one caller's view, as a :class:`Known`.

The rules are the engine's (:mod:`compaction.lessons`, :mod:`compaction.calibration`);
this class only applies them and keeps the results. The records are bounded:
past ``store.max_model_rows`` upstreams and models the least recently updated
goes, and likewise past as many (caller, upstream and model) pairs — model
names and keys cost nothing to invent. A store that fails never fails the
caller: what it could not write is logged and kept in memory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from compaction import (
    Calibration,
    EmptyStream,
    EmptyStreamLesson,
    agreed_ratio,
    agreed_window,
    calibrate,
    empty_stream_lesson,
    proven_floor,
    ratio_sample,
    restored_calibration,
    stream_answered,
    window_to_learn,
    working_limit_after_answer,
)
from config import ModelConfig, with_working_limit
from proxy.edge.access import owner_digest
from proxy.state.stores import Store
from proxy.upstream.discovery import ServerFacts

logger = logging.getLogger(__name__)

#: A learned ratio is written to the store again only when it moved by more
#: than this share: every answer refines it, and a write per request would cost.
RATIO_WRITE_STEP = 0.005
#: Likewise the largest prompt answered, which grows with every conversation:
#: the guard a restart reads back is at most this share below the real one.
PROVEN_WRITE_STEP = 0.02

#: Prefixes of the rows the store's learned-window table keeps for what
#: servers state (windows, slots) and answered (the guard), apart from the
#: windows overflow errors taught each caller.
SERVER_PREFIX = "server\x1f"
SLOTS_PREFIX = "slots\x1f"
PROVEN_PREFIX = "proven\x1f"
#: Prefix of a caller's own rows (learned windows, ratios). Rows without any
#: prefix were written before lessons were per caller: the anonymous caller's.
OWNER_PREFIX = "owner\x1f"
#: The caller that sends no key of its own (most single-user setups), whose
#: view the owner-less readers get.
ANONYMOUS = owner_digest("")


def calibration_key(config: ModelConfig, model: str | None = None) -> str:
    """Everything is learned per upstream and model: one model name may be
    served by different upstreams (and tokenizers) through per-model settings.
    ``model``: another model of the same upstream (its summary model)."""
    return f"{config.upstream}\x1f{model or config.model}"


def server_key(key: str) -> str:
    """The store's row for the window the server states under ``key``."""
    return SERVER_PREFIX + key


def slots_key(key: str) -> str:
    """The store's row for the slots the server states under ``key``."""
    return SLOTS_PREFIX + key


def proven_key(key: str) -> str:
    """The store's row for the largest prompt answered under ``key``."""
    return PROVEN_PREFIX + key


def owned_key(key: str, owner: str) -> str:
    """The store's row for what ``owner``'s requests taught under ``key`` (an
    owner is a hex digest or ``""``: it holds no separator)."""
    return f"{OWNER_PREFIX}{owner}\x1f{key}"


@dataclass(frozen=True)
class Known:
    """What one caller knows of one upstream and model (the module doc says
    where each comes from, which are the caller's own, and which are stored)."""

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


@dataclass(frozen=True)
class _Served:
    """What the server did or stated for one upstream and model."""

    window_stated: int | None = None
    slots: int | None = None
    proven: int = 0
    #: ``proven`` as the store last took it.
    proven_stored: int = 0
    streamed: int = 0
    working_limit: int | None = None
    #: The smallest streamed prompt an empty stream was taken for an overflow at.
    refused: int | None = None

    @property
    def answered(self) -> int:
        """The largest prompt answered, by the upstream's ``usage`` or by our
        estimate of a stream (:attr:`Known.answered`)."""
        return max(self.proven, self.streamed)


@dataclass(frozen=True)
class _Own:
    """What one caller's requests taught of one upstream and model."""

    window: int | None = None
    ratio: float | None = None
    calibration: Calibration | None = None


_NONE_SERVED = _Served()
_NONE_OWN = _Own()


@dataclass(frozen=True)
class _Agreed:
    window: int | None
    ratio: float | None


class _Agreements(dict[str, _Agreed]):
    """What the callers of each key agree on, worked out the first time it is
    asked after one of them learned something (its entry is then dropped)."""

    def __init__(self, own: dict[str, dict[str, _Own]]) -> None:
        super().__init__()
        self._own = own

    def __missing__(self, key: str) -> _Agreed:
        callers = self._own.get(key, {}).values()
        agreed = self[key] = _Agreed(
            agreed_window([own.window for own in callers if own.window is not None]),
            agreed_ratio([own.ratio for own in callers if own.ratio is not None]),
        )
        return agreed


def _row_of(row: str) -> tuple[str, str, str]:
    """A store row's kind (``server``, ``slots``, ``proven`` or ``own``), key and owner."""
    for kind, prefix in (("server", SERVER_PREFIX), ("slots", SLOTS_PREFIX)):
        if row.startswith(prefix):
            return kind, row.removeprefix(prefix), ""
    if row.startswith(PROVEN_PREFIX):
        return "proven", row.removeprefix(PROVEN_PREFIX), ""
    if row.startswith(OWNER_PREFIX):
        owner, _, key = row.removeprefix(OWNER_PREFIX).partition("\x1f")
        return "own", key, owner
    return "own", row, ANONYMOUS


class ModelKnowledge:
    """What is known of each upstream and model, and what each caller learned
    of it, each at most ``max_rows``."""

    def __init__(self, store: Store, *, max_rows: int) -> None:
        self._store = store
        self._max_rows = max_rows
        self._served: dict[str, _Served] = {}
        #: Per key, per owner; ``_recent`` holds the pairs, least recently updated first.
        self._own: dict[str, dict[str, _Own]] = {}
        self._recent: dict[tuple[str, str], None] = {}
        #: What the callers of a key agree on, until one of them learns more.
        self._agreed = _Agreements(self._own)
        #: Store writes under way in the background (kept so none is lost).
        self._writes: set[asyncio.Task[None]] = set()

    # --- reading ------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._served)

    def __iter__(self) -> Iterator[str]:
        """The keys of what servers did or stated, least recently updated first."""
        return iter(list(self._served))

    def get(self, key: str, owner: str = ANONYMOUS) -> Known:
        """What ``owner`` knows under ``key`` (an empty :class:`Known` when nothing is known)."""
        served = self._served.get(key, _NONE_SERVED)
        own = self._own.get(key, {}).get(owner, _NONE_OWN)
        window, _, _ = self.windows(key, owner)
        agreed = self._agreed[key]
        return Known(
            window_learned=window,
            window_stated=served.window_stated,
            slots=served.slots,
            proven=served.proven,
            streamed=served.streamed,
            working_limit=served.working_limit,
            ratio=agreed.ratio if own.ratio is None else own.ratio,
            calibration=own.calibration,
        )

    def of(self, config: ModelConfig, owner: str = ANONYMOUS) -> Known:
        """What ``owner`` knows of ``config``'s upstream and model."""
        return self.get(calibration_key(config), owner)

    def windows(
        self, key: str, owner: str = ANONYMOUS
    ) -> tuple[int | None, int | None, int | None]:
        """``owner``'s learned window (its own, held to what the callers agree
        on), the server's stated one and the working limit under ``key``:
        :meth:`get`'s three windows, read in place, not through a
        :class:`Known`, since every request's configuration is resolved with
        them (and where :meth:`get` reads its learned window, so that the
        rule is written once)."""
        served = self._served.get(key, _NONE_SERVED)
        own = self._own.get(key)
        window = own[owner].window if own is not None and owner in own else None
        agreed = self._agreed[key].window
        if agreed is not None:
            window = agreed if window is None else min(window, agreed)
        return window, served.window_stated, served.working_limit

    def slots(self, config: ModelConfig) -> int | None:
        """How many requests the upstream serves at once, where it says."""
        return self._served.get(calibration_key(config), _NONE_SERVED).slots

    def working_limit(self, config: ModelConfig) -> int | None:
        """The window empty streams narrowed for this upstream and model, if any."""
        return self._served.get(calibration_key(config), _NONE_SERVED).working_limit

    def answered(self, config: ModelConfig) -> int:
        """The largest prompt this upstream and model answered (:attr:`Known.answered`)."""
        return self._served.get(calibration_key(config), _NONE_SERVED).answered

    def ratio(self, config: ModelConfig, owner: str = ANONYMOUS) -> float:
        """``owner``'s calibration ratio for this model's upstream (1.0 until
        one is learned or agreed)."""
        # Read in place, not through a Known: asked on every request.
        key = calibration_key(config)
        own = self._own.get(key)
        ratio = own[owner].ratio if own is not None and owner in own else None
        if ratio is None:
            ratio = self._agreed[key].ratio
        return 1.0 if ratio is None else ratio

    def within_working_limit(self, config: ModelConfig) -> ModelConfig:
        """``config`` with its window held to the working limit, when that is smaller."""
        limit = self._served.get(calibration_key(config), _NONE_SERVED).working_limit
        return with_working_limit(config, limit)

    # --- learning -----------------------------------------------------------------

    def restore(self, windows: Mapping[str, int], ratios: Mapping[str, float]) -> None:
        """Take the store's rows (the learned windows, with what servers stated
        and answered under their prefixes, and the ratios) as older than
        anything this process learned meanwhile, which is the newer and is kept."""
        served: dict[str, _Served] = {}
        owned: dict[tuple[str, str], _Own] = {}
        for row, value in windows.items():
            kind, key, owner = _row_of(row)
            if kind == "own":
                own = owned.get((key, owner), _NONE_OWN)
                owned[key, owner] = dataclasses.replace(own, window=value)
                continue
            was = served.get(key, _NONE_SERVED)
            if kind == "server":
                served[key] = dataclasses.replace(was, window_stated=value)
            elif kind == "slots":
                served[key] = dataclasses.replace(was, slots=value)
            else:
                served[key] = dataclasses.replace(was, proven=value, proven_stored=value)
        for row, ratio in ratios.items():
            _, key, owner = _row_of(row)
            owned[key, owner] = dataclasses.replace(owned.get((key, owner), _NONE_OWN), ratio=ratio)
        for key, now in self._served.items():  # learned here: each figure it has wins
            stored = served.pop(key, _NONE_SERVED)
            served[key] = dataclasses.replace(
                now,
                window_stated=now.window_stated or stored.window_stated,
                slots=now.slots or stored.slots,
                proven=max(now.proven, stored.proven),
                proven_stored=max(now.proven_stored, stored.proven),
            )
        for key, owner in self._recent:
            now_own = self._own[key][owner]
            stored_own = owned.pop((key, owner), _NONE_OWN)
            owned[key, owner] = dataclasses.replace(
                now_own,
                window=now_own.window or stored_own.window,
                ratio=now_own.ratio or stored_own.ratio,
            )
        self._served, self._recent = served, {}
        self._own.clear()
        self._agreed.clear()
        for (key, owner), own in owned.items():
            self._own.setdefault(key, {})[owner] = own
            self._recent[key, owner] = None
        self._trim()

    async def learn_window(self, config: ModelConfig, window: int, owner: str = ANONYMOUS) -> bool:
        """Remember a window an overflow error stated to ``owner``, here and in
        the store; whether it was taken (:func:`compaction.window_to_learn`)."""
        key = calibration_key(config)
        own = self._own.get(key, {}).get(owner, _NONE_OWN)
        proven = self._served.get(key, _NONE_SERVED).proven
        lesson = window_to_learn(own.window, window, proven)
        if not lesson.taken:
            logger.warning("an overflow error stated an implausible window; not learned")
            return False
        if lesson.remember is not None:
            self._keep_own(key, owner, dataclasses.replace(own, window=lesson.remember))
            await self._store_window(owned_key(key, owner), lesson.remember, "the learned window")
        return True

    async def server_stated(self, config: ModelConfig, facts: ServerFacts) -> bool:
        """Keep what the server stated, here and in the store; whether it stated a window."""
        key = calibration_key(config)
        served = self._served.get(key, _NONE_SERVED)
        if facts.slots is not None and served.slots != facts.slots:
            self._keep(key, dataclasses.replace(served, slots=facts.slots))
            await self._store_window(slots_key(key), facts.slots, "what the upstream stated")
        if facts.window is None:
            return False
        served = self._served.get(key, _NONE_SERVED)
        if served.window_stated != facts.window:
            logger.info(
                "the upstream serves %r with a %d-token window (%s)",
                config.model,
                facts.window,
                facts.source,
            )
            self._keep(key, dataclasses.replace(served, window_stated=facts.window))
            await self._store_window(server_key(key), facts.window, "what the upstream stated")
        return True

    def prove(self, config: ModelConfig, prompt_tokens: int) -> None:
        """A prompt of ``prompt_tokens`` was answered: the window is at least that.
        The store takes it (in the background) once it grew by more than
        :data:`PROVEN_WRITE_STEP`."""
        key = calibration_key(config)
        served = self._served.get(key, _NONE_SERVED)
        if (
            served is not _NONE_SERVED
            and prompt_tokens <= served.proven
            # served.answered, read in place: this runs on every answer.
            and (
                served.working_limit is None
                or served.working_limit >= max(served.proven, served.streamed)
            )
        ):
            # Most answers prove no more than the last one did and raise no
            # limit: the record is only moved to the most recently updated end
            # (no row added, so none to trim), not copied unchanged.
            del self._served[key]
            self._served[key] = served
            return
        proven = proven_floor(served.proven, prompt_tokens)
        if proven == served.proven:
            self._keep(key, served)
        elif proven > served.proven_stored * (1 + PROVEN_WRITE_STEP):
            self._keep(key, dataclasses.replace(served, proven=proven, proven_stored=proven))
            self._spawn(self._store_window(proven_key(key), proven, "the largest prompt answered"))
        else:
            self._keep(key, dataclasses.replace(served, proven=proven))
        self._raise_working_limit(key)

    def stream_answered(self, config: ModelConfig, tokens: int) -> None:
        """A streamed request of ``tokens`` (our estimate × the ratio) began to be
        answered; above the window the server states, or a size an empty stream
        refused, it proves nothing (:func:`compaction.stream_answered`)."""
        key = calibration_key(config)
        served = self._served.get(key, _NONE_SERVED)
        said = [figure for figure in (served.window_stated, served.refused) if figure is not None]
        streamed = stream_answered(served.streamed, tokens, min(said, default=None))
        if streamed > served.streamed:
            self._keep(key, dataclasses.replace(served, streamed=streamed))
            self._raise_working_limit(key)

    def empty_stream(self, config: ModelConfig, tokens: int) -> EmptyStreamLesson:
        """A streamed request of ``tokens`` (our estimate × the ratio) got an empty
        stream: what it teaches (:func:`compaction.empty_stream_lesson`), kept."""
        key = calibration_key(config)
        served = self._served.get(key, _NONE_SERVED)
        current = served.working_limit
        answered = served.answered
        lesson = empty_stream_lesson(EmptyStream(tokens=tokens, answered=answered, limit=current))
        if lesson.overflow and (served.refused is None or tokens < served.refused):
            served = dataclasses.replace(served, refused=tokens)
            self._keep(key, served)
        if lesson.limit is not None and lesson.limit != current:
            self._keep(key, dataclasses.replace(served, working_limit=lesson.limit))
            logger.warning(
                "an empty stream narrowed the working window of %r to %d tokens",
                config.model,
                lesson.limit,
            )
        return lesson

    def learn_ratio(self, config: ModelConfig, sample: float, owner: str = ANONYMOUS) -> None:
        """One of ``owner``'s answers (or an overflow error's count) showed the
        upstream counting ``sample`` × our estimate: ``owner``'s ratio follows
        its recent samples by the engine's rule (:func:`compaction.calibrate`).
        The store is written in the background, and only when the ratio moved
        by more than :data:`RATIO_WRITE_STEP`."""
        key = calibration_key(config)
        own = self._own.get(key, {}).get(owner, _NONE_OWN)
        old, previous = own.ratio, own.calibration
        if previous is None and old is not None:  # restored from the store
            previous = restored_calibration(old)
        calibration = calibrate(previous, sample)
        ratio = calibration.ratio
        self._keep_own(key, owner, dataclasses.replace(own, calibration=calibration, ratio=ratio))
        if old is not None and abs(ratio - old) <= RATIO_WRITE_STEP * old:
            return
        self._spawn(self._write_ratio(owned_key(key, owner), ratio))

    def observe(
        self, config: ModelConfig, estimate: int, upstream_tokens: int, owner: str = ANONYMOUS
    ) -> None:
        """An answer's ``usage`` says the upstream counted ``upstream_tokens`` for
        ``owner``'s request we estimated at ``estimate``: learn from it."""
        self.prove(config, upstream_tokens)
        sample = ratio_sample(upstream_tokens, estimate)
        if sample is not None:
            self.learn_ratio(config, sample, owner)

    async def written(self) -> None:
        """Wait for the store writes under way to end."""
        await asyncio.gather(*self._writes)

    # --- keeping ------------------------------------------------------------------

    def _raise_working_limit(self, key: str) -> None:
        served = self._served.get(key, _NONE_SERVED)
        answered = served.answered
        raised = working_limit_after_answer(served.working_limit, answered)
        if raised is not None and raised != served.working_limit:
            self._keep(key, dataclasses.replace(served, working_limit=raised))

    def _keep(self, key: str, served: _Served) -> None:
        """``served`` under ``key``, now the most recently updated record; past
        ``max_rows`` the least recently updated go."""
        self._served.pop(key, None)  # re-inserted last: a dict keeps insertion order
        self._served[key] = served
        self._trim()

    def _keep_own(self, key: str, owner: str, own: _Own) -> None:
        """``own`` as what ``owner`` learned under ``key``, now the most recently
        updated pair; past ``max_rows`` pairs the least recently updated go."""
        self._recent.pop((key, owner), None)
        self._recent[key, owner] = None
        self._own.setdefault(key, {})[owner] = own
        self._agreed.pop(key, None)
        self._trim()

    def _trim(self) -> None:
        while len(self._served) > self._max_rows:
            del self._served[next(iter(self._served))]
        while len(self._recent) > self._max_rows:
            key, owner = next(iter(self._recent))
            del self._recent[key, owner]
            callers = self._own[key]
            del callers[owner]
            if not callers:
                del self._own[key]
            self._agreed.pop(key, None)

    def _spawn(self, write: Coroutine[Any, Any, None]) -> None:
        """Run a store write in the background (learning happens on the request
        path, which must not wait on the store)."""
        try:
            task = asyncio.get_running_loop().create_task(write)
        except RuntimeError:  # no loop (a synchronous caller): nothing can write now
            write.close()
            return
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _store_window(self, row: str, value: int, what: str) -> None:
        try:
            await self._store.set_learned_window(row, value)
        except Exception:  # the store being down must not fail anything
            logger.warning("could not store %s", what, exc_info=True)

    async def _write_ratio(self, row: str, ratio: float) -> None:
        try:
            await self._store.set_calibration(row, ratio)
        except Exception:  # the store being down must not fail a request
            logger.warning("could not store the calibration ratio", exc_info=True)
