"""A store that cannot fail the requests the proxy exists for.

    health = StoreHealth()
    store = ResilientStore(open_store(url), timeout=2.0, health=health, observer=metrics)
    health.report()  # what /healthz says

Every call is cut off after ``timeout`` seconds, timed, and on failure
answered according to who asked:

* **the request path degrades**: ``lookup`` finds nothing (the request is
  compacted afresh), ``session_settings`` are the defaults, writes —
  ``put``, ``add_event``, ``record_requests``, ``set_learned_window``,
  ``set_calibration``, heartbeats, ``fail_interrupted``, ``purge`` — are
  skipped, and ``lock`` lets its caller in without the shared lock. Single
  flight is lost only while the store is down, and then there is nothing to
  share: a compaction made now cannot be stored, so the next request
  compacts again whether it waited or not;
* **callers with nothing to fall back on** — ``get``, ``originals`` and
  ``events`` (the state endpoints), the figures (the dashboard),
  ``learned_windows`` and ``calibrations`` (start-up), and
  ``set_session_settings`` (a user must know it did not take) — raise
  :class:`StoreUnavailable`: the app answers 503, or loads them later.

Which operation gets which answer is decided once, in the body of
:class:`ResilientStore`: one line per operation of the contract
(:mod:`proxy.state.stores.protocols`).

The deadline holds whatever the backend does with its cancellation: the call
runs as a task of its own, and the caller is answered when the time is up
even if that task goes on (on Python 3.11 a Redis command's socket write,
``asyncio.wait_for``, loses a cancellation that arrives as the write ends, so
a cancelled call may run on). The task is cancelled, kept until it ends (every
backend loop is bounded, so it does), and a lock it took late is released.

``lock`` waits for another holder at most ``lock_wait`` seconds (the app's
``store.lock_wait_seconds``: as long as one summary may take; by default as
long as the backend waits, the longest a lease lives); then its caller goes
in without the lock, and may compact what the holder is compacting. That is
counted as ``kind="busy"``: the store works, /healthz stays ok. A store that
fails or answers garbage while the lock is taken is a failure like any
other. Releasing the lock is bounded by ``timeout``.

A call that **timed out** makes the calls after it skip the store for
:data:`~proxy.state.stores.health.PAUSE_AFTER_TIMEOUT` seconds: a hung Redis
would otherwise cost every request one timeout per store call (seven for a
compaction). A call that failed at once (a refused connection, a full disk)
costs nothing to repeat, so the next call tries again.

What the outcomes say of the store (``/healthz``) and how failures are
logged is :mod:`proxy.state.stores.health`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial
from typing import (
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    cast,
    overload,
)

from compaction import Checkpoint, Message
from proxy.state.stores.base import checked_ratio
from proxy.state.stores.figures import SessionSettings
from proxy.state.stores.health import Side, StoreHealth
from proxy.state.stores.locks import MAX_HOLD, LockBusy
from proxy.state.stores.protocols import (
    CalibrationStore,
    CheckpointStore,
    EventStore,
    FigureStore,
    LivenessStore,
    SettingsStore,
    Store,
    UpkeepStore,
    WindowStore,
)

logger = logging.getLogger("compaction_proxy.store")

_T = TypeVar("_T")
_P = ParamSpec("_P")

#: ``busy``: a lock that stayed held past its wait (see the module doc).
FailureKind = Literal["error", "timeout", "skipped", "busy"]


class StoreUnavailable(Exception):
    """A store call failed, timed out, or was skipped while the store is failing."""

    def __init__(self, operation: str) -> None:
        super().__init__(f"the store is unavailable ({operation})")
        self.operation = operation


class StoreObserver(Protocol):
    """Told of every store call (the proxy's metrics)."""

    def store_call(self, operation: str, seconds: float) -> None: ...

    def store_answered_at_once(self, operation: str) -> None:
        """An operation answered without a call (``lookup_now``): no latency to count."""
        ...

    def store_failed(self, operation: str, kind: FailureKind) -> None: ...


class _Late(Exception):
    """A call that did not end within its deadline (it may still be running)."""


def _timed_out(exc: BaseException) -> bool:
    # redis-py's TimeoutError (its socket timeout) is no subclass of the
    # built-in one; this module names no backend, so it goes by the name.
    return isinstance(exc, TimeoutError) or type(exc).__name__ == "TimeoutError"


@dataclass(frozen=True)
class _Policy(Generic[_T]):
    """How one operation is called: what its success proves, and what its
    caller gets when the store is unavailable."""

    operation: str
    side: Side
    #: The answer a request can live with; ``None``: :class:`StoreUnavailable`.
    fallback: Callable[[], _T] | None = None
    #: ``False``: a call that may do no I/O, whose success says nothing.
    proves: bool = True
    #: ``False``: asked even while the store is paused (the keep-alive probe).
    skippable: bool = True


class _Guarded(Generic[_P, _T]):
    """One operation of the contract on a :class:`ResilientStore`: the wrapped
    store's method of the same name, called under this operation's policy.

    ``declared`` is the protocol's own method, so the operation's signature is
    the contract's and cannot drift from it. ``fallback`` makes the answer a
    request can live with when the store is unavailable; without one, the
    caller is told (:class:`StoreUnavailable`).
    """

    def __init__(
        self,
        declared: Callable[Concatenate[Any, _P], Coroutine[Any, Any, _T]],
        *,
        fallback: Callable[[], _T] | None,
        side: Side,
        proves: bool,
    ) -> None:
        self.declared = declared
        self.operation = declared.__name__
        self.policy = _Policy(self.operation, side, fallback, proves)

    def __set_name__(self, owner: type[Any], name: str) -> None:
        # ``get = _must_answer(CheckpointStore.originals)`` would answer one
        # operation with another: refused when the class is made.
        if name != self.operation:
            raise TypeError(f"{owner.__name__}.{name} is declared as {self.operation}")

    @overload
    def __get__(self, store: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(
        self, store: ResilientStore, owner: type[Any]
    ) -> Callable[_P, Coroutine[Any, Any, _T]]: ...

    def __get__(
        self, store: ResilientStore | None, owner: type[Any]
    ) -> Self | Callable[_P, Coroutine[Any, Any, _T]]:
        # A store's own operations are bound once, in its __init__ (an instance
        # attribute wins over this descriptor): only the class reaches here.
        if store is None:
            return self
        return self.bound(store)

    def bound(self, store: ResilientStore) -> Callable[_P, Coroutine[Any, Any, _T]]:
        """This operation on ``store``: its backend's method called under the
        policy, by :meth:`ResilientStore._call` directly (no frame between)."""
        method: Callable[_P, Coroutine[Any, Any, _T]] = getattr(store._store, self.operation)
        return cast(
            Callable[_P, Coroutine[Any, Any, _T]], partial(store._call, self.policy, method)
        )


def _degrades(
    declared: Callable[Concatenate[Any, _P], Coroutine[Any, Any, _T]],
    *,
    to: Callable[[], _T],
    side: Side = "write",
    proves: bool = True,
) -> _Guarded[_P, _T]:
    """An operation of the request path: answered ``to()`` when the store is unavailable.
    ``proves=False``: a call that may do no I/O, whose success says nothing."""
    return _Guarded(declared, fallback=to, side=side, proves=proves)


def _must_answer(
    declared: Callable[Concatenate[Any, _P], Coroutine[Any, Any, _T]], *, side: Side = "read"
) -> _Guarded[_P, _T]:
    """An operation whose caller has nothing to fall back on: :class:`StoreUnavailable`."""
    return _Guarded(declared, fallback=None, side=side, proves=True)


def _nothing() -> None:
    return None


# The policies of the operations with a rule of their own (see ResilientStore).
_LOOKUP = _Policy[dict[str, Checkpoint]]("lookup", "read", dict)  # none found: compacted afresh
_HOLDS_CHECKPOINTS = _Policy("holds_checkpoints", "read", bool)  # as lookup: none
_PUT = _Policy("put", "write", _nothing)
_SET_CALIBRATION = _Policy("set_calibration", "write", _nothing)
_UNLOCK = _Policy[bool | None]("unlock", "write", proves=False)
_PROBE = _Policy[object]("probe", "read", skippable=False)  # off the request path


class ResilientStore:
    """The :class:`~proxy.state.stores.protocols.Store` contract over ``store``, whose
    failures degrade instead of failing the caller (see the module doc).

    The class body is the policy, one line per operation: :func:`_degrades` with
    the answer a request can live with, or :func:`_must_answer` for a caller
    that must know. The few with a rule of their own (``lookup``, ``holds_checkpoints``,
    ``put``, ``heartbeat``, ``set_calibration``, ``lock``) are written out below them.
    """

    # -- the request path: degrade -------------------------------------------

    add_event = _degrades(EventStore.add_event, to=_nothing)
    fail_interrupted = _degrades(LivenessStore.fail_interrupted, to=int, proves=False)
    set_learned_window = _degrades(WindowStore.set_learned_window, to=_nothing)
    record_requests = _degrades(FigureStore.record_requests, to=_nothing)
    #: Read when about to compact: a store that cannot say means the defaults.
    session_settings = _degrades(SettingsStore.session_settings, to=SessionSettings, side="read")
    purge = _degrades(UpkeepStore.purge, to=int, proves=False)  # may have nothing to drop

    # -- readers (and one writer) that must know: StoreUnavailable -------------

    get = _must_answer(CheckpointStore.get)
    originals = _must_answer(CheckpointStore.originals)
    owner_of = _must_answer(CheckpointStore.owner_of)  # an owner is read, never guessed
    owners_of_session = _must_answer(SettingsStore.owners_of_session)
    events = _must_answer(EventStore.events)
    learned_windows = _must_answer(WindowStore.learned_windows)
    calibrations = _must_answer(CalibrationStore.calibrations)
    requests = _must_answer(FigureStore.requests)
    sessions = _must_answer(FigureStore.sessions)
    session_count = _must_answer(FigureStore.session_count)
    savings = _must_answer(FigureStore.savings)
    #: A user who set something is told when it did not take.
    set_session_settings = _must_answer(SettingsStore.set_session_settings, side="write")

    def __init__(
        self,
        store: Store,
        *,
        timeout: float,
        health: StoreHealth | None = None,
        observer: StoreObserver | None = None,
        lock_wait: float | None = None,
    ) -> None:
        self._store = store
        self._timeout = timeout
        self.health = health if health is not None else StoreHealth()
        self._observer = observer
        self.tracks_liveness = store.tracks_liveness
        #: A heartbeat proves the store works only where it is a write (else a no-op).
        self._heartbeat = _Policy("heartbeat", "write", _nothing, proves=self.tracks_liveness)
        self._lock_wait = lock_wait
        #: Puts under way (see :meth:`lookup_now`).
        self._putting = 0
        #: Calls given up on that had not ended yet, kept until they do.
        self._abandoned: set[asyncio.Future[Any]] = set()
        for name, operation in vars(ResilientStore).items():
            if isinstance(operation, _Guarded):
                setattr(self, name, operation.bound(self))

    async def _within(
        self,
        seconds: float,
        call: Callable[[], Awaitable[_T]],
        *,
        undo: Callable[[_T], Awaitable[object]] | None = None,
    ) -> _T:
        """``await call()``, given up after ``seconds`` (:class:`_Late`) even if it
        does not honour its cancellation (see the module doc). ``undo`` is applied
        to the result of a call given up on that succeeds after all (a lock taken
        late is released)."""

        task = asyncio.ensure_future(call())
        try:
            done, _ = await asyncio.wait({task}, timeout=seconds)
        except asyncio.CancelledError:  # the caller itself was cancelled
            self._abandon(task, undo)
            raise
        if done:
            return task.result()
        self._abandon(task, undo)
        # One round of the loop to end, for a call that honours its cancellation.
        await asyncio.wait({task}, timeout=0)
        raise _Late

    def _abandon(
        self, task: asyncio.Future[_T], undo: Callable[[_T], Awaitable[object]] | None
    ) -> None:
        task.cancel()
        self._abandoned.add(task)

        def ended(task: asyncio.Future[_T]) -> None:
            self._abandoned.discard(task)
            if task.cancelled() or task.exception() is not None:
                return  # retrieved: the caller was told already
            if undo is not None:
                undoing = asyncio.ensure_future(undo(task.result()))
                self._abandoned.add(undoing)
                undoing.add_done_callback(_quietly(self._abandoned))

        task.add_done_callback(ended)

    async def _call(
        self, policy: _Policy[_T], call: Callable[..., Awaitable[_T]], /, *args: Any, **kwargs: Any
    ) -> _T:
        """``call(*args, **kwargs)`` within the time-box, under ``policy``: when
        it failed, timed out or was skipped (the store paused after a timeout),
        the policy's fallback, or :class:`StoreUnavailable`. While the store is
        healthy its health is asked nothing."""
        health, observer, operation = self.health, self._observer, policy.operation
        if health.failing and policy.skippable and health.paused():
            if observer is not None:
                observer.store_failed(operation, "skipped")
            if policy.fallback is None:
                raise StoreUnavailable(operation)
            return policy.fallback()
        started = time.perf_counter()
        try:
            result = await self._within(self._timeout, partial(call, *args, **kwargs))
        except Exception as exc:
            self._failed(operation, exc, policy.side, timed_out=isinstance(exc, _Late))
            if policy.fallback is None:
                raise StoreUnavailable(operation) from exc
            return policy.fallback()
        finally:
            if observer is not None:
                observer.store_call(operation, time.perf_counter() - started)
        if policy.proves and health.failing:
            health.succeeded(policy.side)
        return result

    def _failed(
        self, operation: str, exc: Exception, side: Side, *, timed_out: bool = False
    ) -> None:
        timed_out = timed_out or _timed_out(exc)
        error = "timeout" if timed_out else type(exc).__name__
        self.health.failed(operation, error, side, timed_out=timed_out)
        if self._observer is not None:
            self._observer.store_failed(operation, "timeout" if timed_out else "error")

    # -- operations with a rule of their own -------------------------------------

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        # Answered at once when the backend knows the answer without I/O;
        # else asked, and a store that cannot say means none (compacted afresh).
        known = self.lookup_now(hashes)
        if known is not None:
            if self._observer is not None:
                self._observer.store_answered_at_once("lookup")
            return known
        return await self._call(_LOOKUP, self._store.lookup, hashes)

    def lookup_now(self, hashes: Sequence[str]) -> dict[str, Checkpoint] | None:
        # No I/O to time out or to prove the store healthy by: a backend that
        # fails here is asked the usual way (and its failure counted then).
        # While a put is under way here it may not have reached the backend
        # yet (its call is a task of its own): the backend is asked after it.
        if self._putting:
            return None
        try:
            return self._store.lookup_now(hashes)
        except Exception:
            return None

    async def holds_checkpoints(self, owner: str, session: str) -> bool:
        # As lookup: at once when the backend knows; a store that cannot say
        # holds none, as its lookup would find none.
        known = self.holds_checkpoints_now(owner, session)
        if known is not None:
            return known
        return await self._call(_HOLDS_CHECKPOINTS, self._store.holds_checkpoints, owner, session)

    def holds_checkpoints_now(self, owner: str, session: str) -> bool | None:
        if self._putting:  # as lookup_now
            return None
        try:
            return self._store.holds_checkpoints_now(owner, session)
        except Exception:
            return None

    async def put(
        self, checkpoint: Checkpoint, originals: Sequence[Message] | None = None, *, owner: str = ""
    ) -> None:
        self._putting += 1
        try:
            await self._call(_PUT, self._store.put, checkpoint, originals, owner=owner)
        finally:
            self._putting -= 1

    async def heartbeat(self, instance: str, ttl: float) -> None:
        await self._call(self._heartbeat, self._store.heartbeat, instance, ttl)

    async def set_calibration(self, key: str, ratio: float) -> None:
        value = checked_ratio(ratio)  # the caller's mistake is not the store's failure
        await self._call(_SET_CALIBRATION, self._store.set_calibration, key, value)

    def lock(self, key: str, ttl: float) -> AbstractAsyncContextManager[None]:
        return self._lock(key, ttl)

    @contextlib.asynccontextmanager
    async def _lock(self, key: str, ttl: float) -> AsyncIterator[None]:
        # Taking the lock waits for another holder (see the module doc); a
        # backend that waits as long as a lease lives gets one store timeout
        # more for its last poll.
        held: AbstractAsyncContextManager[None] | None = None
        observer = self._observer
        if self.health.paused():
            if observer is not None:
                observer.store_failed("lock", "skipped")
        else:
            taking = self._store.lock(key, ttl)

            async def release_late(_: None) -> None:
                await self._within(self._timeout, partial(taking.__aexit__, None, None, None))

            try:
                wait = self._lock_wait
                if wait is None:
                    wait = MAX_HOLD * ttl + self._timeout
                await self._within(wait, taking.__aenter__, undo=release_late)
            except (LockBusy, _Late):  # held by another all along: the store works
                if observer is not None:
                    observer.store_failed("lock", "busy")
            except Exception as exc:
                self._failed("lock", exc, "write")
            else:
                held = taking
                if self.tracks_liveness:  # a shared lock is a write; a local one no I/O
                    self.health.succeeded("write")
        try:
            yield
        finally:
            if held is not None:
                with contextlib.suppress(StoreUnavailable):
                    await self._call(_UNLOCK, held.__aexit__, None, None, None)

    # -- upkeep ------------------------------------------------------------------

    async def probe(self) -> bool:
        """Whether the store answers a read now (never skipped: run off the request path)."""
        try:
            await self._call(_PROBE, self._store.learned_windows)
        except StoreUnavailable:
            return False
        return True

    async def close(self) -> None:
        """Close the store within one ``timeout``, whatever it does; calls given
        up on earlier are cancelled again (shutdown must not wait on them)."""
        for task in list(self._abandoned):
            task.cancel()
        try:
            await self._within(self._timeout, self._store.close)
        except Exception as exc:  # shutting down: nothing is left to serve
            error = "timeout" if isinstance(exc, _Late) else type(exc).__name__
            logger.warning("the store did not close cleanly (%s)", error)


def _quietly(pending: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    """A done callback that forgets a task and retrieves its outcome (a release
    that failed late has nobody left to tell)."""

    def forget(task: asyncio.Future[Any]) -> None:
        pending.discard(task)
        if not task.cancelled():
            task.exception()

    return forget
