"""What every part of the Redis store stands on: the client and the settings
:class:`~proxy.state.stores.redis.store.RedisStore`'s constructor sets, its keys
(all under one prefix), the store's clock, and the two ways it keeps writers
apart — the single-flight lock (``SET NX`` with a lease its holder renews) and
the WATCH … EXEC transaction tried a bounded number of times.

No loop here runs for ever on a Redis that answers garbage: a waiter for a lock
gives up after the longest a lease can live
(:class:`~proxy.state.stores.locks.LockBusy`), a transaction whose watched key
keeps changing (or whose EXEC keeps answering nil) is tried
:data:`TRANSACTION_ATTEMPTS` times with a pause between, then :class:`Contended`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import WatchError

from proxy.state.stores.base import StoreError
from proxy.state.stores.locks import MAX_HOLD, RENEW_EVERY, LockBusy
from proxy.state.stores.redis.replies import GarbledReply, awaited, expect

logger = logging.getLogger(__package__)  # "proxy.state.stores.redis", as before the split
_POLL_FIRST: Final = 0.01
_POLL_MAX: Final = 0.25
#: Tries of a WATCH … EXEC transaction whose watched key changed meanwhile.
TRANSACTION_ATTEMPTS: Final = 3
#: Pause before the second try (doubled for the next, with jitter).
TRANSACTION_BACKOFF: Final = 0.02
#: The key scheme this version writes: 2, a key per session beside its checkpoints
#: (:mod:`~proxy.state.stores.redis.held`). A replica's heartbeat says the scheme
#: it writes; replicas from before held keys wrote ``1`` there.
SCHEME: Final = 2


Sleep = Callable[[float], Awaitable[None]]


class Contended(StoreError):
    """A transaction's watched key changed at every try (or EXEC kept answering nil)."""


class RedisCore:
    """The client, the keys, the clock, the lock and the transaction the
    :class:`~proxy.state.stores.redis.store.RedisStore`'s parts share."""

    # Set by RedisStore's constructor.
    _client: aioredis.Redis
    _sleep: Sleep  #: the pauses of the lock's poll and the transactions' retries
    _prefix: str
    _retention_ms: int
    _figures_ms: int
    _max_model_rows: int
    _store_originals: bool
    _session_events: int
    _global_events: int
    _release: AsyncScript
    _renew: AsyncScript
    _close_open: AsyncScript

    def _key(self, *parts: str) -> str:
        return self._prefix + ":".join(parts)

    async def _now(self) -> float:
        """The store's clock, in seconds since the epoch: one clock for every replica."""
        seconds, microseconds = await awaited(self._client.time())
        return int(seconds) + int(microseconds) / 1_000_000

    @contextlib.asynccontextmanager
    async def lock(self, key: str, ttl: float) -> AsyncIterator[None]:
        """Held once ``SET NX`` answers OK; a waiter polls (asking how long the
        holder's lease has left, which a real Redis always knows) for at most
        ``MAX_HOLD`` × ``ttl``, the longest a lease lives, then :class:`LockBusy`."""
        name = self._key("lock", key)
        token = uuid.uuid4().hex
        ttl_ms = max(1, int(ttl * 1000))
        delay, waited, longest, lapsed = _POLL_FIRST, 0.0, MAX_HOLD * ttl, False
        give_up = asyncio.get_running_loop().time() + longest
        while True:
            taken = await awaited(self._client.set(name, token, nx=True, px=ttl_ms))
            if taken is True:
                break
            if taken is not None:
                raise GarbledReply(f"Redis answered SET NX with {type(taken).__name__}")
            left = expect(await awaited(self._client.pttl(name)), int, "PTTL")
            if left == -2 and not lapsed:
                lapsed = True  # it lapsed between the two: try again at once (once:
                continue  # a store that says so every time must not make this spin)
            lapsed = False
            if waited >= longest or asyncio.get_running_loop().time() >= give_up:
                raise LockBusy(key, longest)
            pause = delay * random.uniform(0.5, 1.0)  # jitter: waiters spread out
            if left >= 0:  # no later than the lease lapses, and never no pause at all
                pause = max(min(pause, left / 1000), _POLL_FIRST / 2)
            await self._sleep(pause)
            waited += pause
            delay = min(delay * 2, _POLL_MAX)
        keeper = asyncio.ensure_future(self._keep(name, token, ttl_ms))
        try:
            yield
        finally:
            keeper.cancel()
            expect(await self._release(keys=[name], args=[token]), int, "the lock's release")

    async def _keep(self, name: str, token: str, ttl_ms: int) -> None:
        """Renew a held lock every third of its expiry: a live holder (a slow
        summarization) keeps it, up to ``MAX_HOLD`` × ``ttl``; a dead one loses it
        after ``ttl``."""
        for _ in range(RENEW_EVERY * (MAX_HOLD - 1)):
            await asyncio.sleep(ttl_ms / 1000 / RENEW_EVERY)
            try:
                renewed = await awaited(self._renew(keys=[name], args=[token, ttl_ms]))
            except Exception:  # a blip: the next round tries again
                logger.warning("could not renew the lock %s", name, exc_info=True)
                continue
            if renewed != 1:  # lost it, or an answer that makes no sense
                return

    async def _transaction(self, update: Callable[[Any], Awaitable[None]], *watched: str) -> None:
        """WATCH ``watched``, ``update`` (reads, then MULTI and the writes), EXEC;
        tried again while a watched key changed meanwhile, at most
        :data:`TRANSACTION_ATTEMPTS` times with a growing pause, then
        :class:`Contended`. (redis-py's own ``transaction`` retries for ever and
        at once: a Redis whose EXEC answers nil would make it spin.)"""
        delay = TRANSACTION_BACKOFF
        for attempt in range(TRANSACTION_ATTEMPTS):
            if attempt:
                await self._sleep(delay * random.uniform(0.5, 1.0))
                delay *= 2
            async with self._client.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(*watched)
                    await update(pipe)
                    await pipe.execute()
                except WatchError:
                    continue
                return
        raise Contended(f"{watched[0]} changed under {TRANSACTION_ATTEMPTS} tries of a transaction")
