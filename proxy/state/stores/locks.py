"""Single flight inside one process: leases that expire, like the Redis lock.

A lease that is never released (a bug, a task that hangs) stops blocking its
waiters after ``ttl`` seconds, so the memory and SQLite backends honour the
same contract as Redis, where the holder may be a dead replica. A holder that
is alive keeps its lease: it is renewed every ``ttl / 3`` while held, up to
:data:`MAX_HOLD` × ``ttl`` in all, so a summarization slower than ``ttl`` is
still done once, and a holder that hangs frees its waiters in the end.

A waiter waits at most :data:`MAX_HOLD` × ``ttl`` in all (the Redis lock's
waiters too), the longest any one lease can live: past that the key is being
taken over and over by others, and the waiter is told :class:`LockBusy`
rather than wait on for ever. (The proxy waits less: ``store.lock_wait_seconds``,
in :class:`~proxy.state.stores.resilient.ResilientStore`.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

#: A held lease is renewed this many times per ``ttl``…
RENEW_EVERY = 3
#: …until it has been held this many ``ttl`` in all.
MAX_HOLD = 10


class LockBusy(TimeoutError):
    """The lock stayed held by another for all of the waiter's wait."""

    def __init__(self, key: str, waited: float) -> None:
        super().__init__(f"the lock {key!r} stayed held for {waited:g} s")
        self.key = key


@dataclass
class _Lease:
    token: object
    deadline: float  #: loop.time() at which the lease lapses
    released: asyncio.Event = field(default_factory=asyncio.Event)


class LeaseLocks:
    """Named locks with expiry, for the tasks of one event loop."""

    def __init__(self) -> None:
        self._leases: dict[str, _Lease] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str, ttl: float) -> AsyncIterator[None]:
        token = object()
        loop = asyncio.get_running_loop()
        give_up = loop.time() + MAX_HOLD * ttl
        while True:
            now = loop.time()
            lease = self._leases.get(key)
            if lease is None or lease.deadline <= now:
                self._leases[key] = _Lease(token, now + ttl)
                break
            if now >= give_up:
                raise LockBusy(key, MAX_HOLD * ttl)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(lease.deadline, give_up) - now):
                    await lease.released.wait()
        keeper = asyncio.ensure_future(self._renew(key, token, ttl))
        try:
            yield
        finally:
            keeper.cancel()
            lease = self._leases.get(key)
            if lease is not None and lease.token is token:
                del self._leases[key]
                lease.released.set()

    async def _renew(self, key: str, token: object, ttl: float) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(RENEW_EVERY * (MAX_HOLD - 1)):
            await asyncio.sleep(ttl / RENEW_EVERY)
            lease = self._leases.get(key)
            if lease is None or lease.token is not token:
                return
            lease.deadline = loop.time() + ttl
