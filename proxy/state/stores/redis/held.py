"""Whether a session holds any checkpoint, on Redis: one key per session, and the
one-time backfill that makes those keys complete after an upgrade.

A request far under its trigger is forwarded as it came unless its session
holds a checkpoint (``proxy/session/untouched.py``): a ``/compact`` made on a
small conversation must still apply to its later, small requests. ``put``
sets ``held:<owner>\\x1f<session>`` beside each checkpoint, living as long as
it, so asking is one round trip.

A proxy from before held keys wrote checkpoints without them; were their
sessions answered "none", each such ``/compact`` would silently stop applying
after an upgrade. So "none" is answered only once the store's ``scheme`` key
says every checkpoint's session is held (:data:`~.core.SCHEME` or later),
read in the same ``MGET`` as the session's key. Until then the answer is
"maybe": the request goes the full way and its chain is looked up, as before
the short way existed — slower, never wrong. The first such answer starts the
backfill in the background (:meth:`RedisHeld._upgrade`); start-up never waits
for it, and no request scans anything. A run:

1. holds the store's lock ``upgrade:held``, so replicas work one at a time (a
   second waits for it, then finds the work done);
2. marks nothing while a replica from before held keys is alive — its
   heartbeat says ``1``, this version's :data:`~.core.SCHEME` — since it may
   still write a checkpoint without its key (a rolling upgrade); looked at
   again every :data:`RECHECK_SECONDS`;
3. gives every checkpoint (``SCAN`` of ``ckpt:*``, :data:`BACKFILL_BATCH` keys
   a round, whose reads are one pipeline and whose writes one script) its
   session's key with the checkpoint's remaining expiry. A key is lengthened,
   never shortened (:data:`~.scripts.HOLD`): two replicas racing, or a put
   meanwhile, lose nothing;
4. sets ``scheme`` (no expiry).

A run that fails — Redis down, a reply no Redis gives (a checkpoint that does
not decode), a ``SCAN`` that would not end — is logged and tried again after
:data:`RECHECK_SECONDS`; the answers stay "maybe" meanwhile. A downgrade to a
version from before held keys writes checkpoints without them again: delete
``<prefix>scheme`` when upgrading once more (docs/state.md, "Upgrading").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any, Final

from redis.commands.core import AsyncScript

from proxy.state.stores import codec
from proxy.state.stores.redis.core import SCHEME, RedisCore, logger
from proxy.state.stores.redis.replies import GarbledReply, awaited, expect

#: Keys a ``SCAN`` round of the backfill asks for (and reads and writes at once).
BACKFILL_BATCH: Final = 500
#: Pause before the backfill looks again: while a replica from before held keys
#: is alive, or after a run that failed.
RECHECK_SECONDS: Final = 30.0
#: The lease on the backfill's lock, renewed while it runs (for at most
#: ``MAX_HOLD`` times this, then another replica may start over: harmless).
UPGRADE_LEASE_SECONDS: Final = 30.0
#: The key saying which scheme every record follows (the module doc).
SCHEME_KEY: Final = "scheme"
_LOCK: Final = "upgrade:held"


class RedisHeld(RedisCore):
    """Held keys, asked and backfilled, on the shared client and keys."""

    # Set by RedisStore's constructor.
    _hold: AsyncScript
    _upgrading: asyncio.Task[None] | None

    def _held_key(self, owner: str, session: str) -> str:
        return self._key("held", f"{owner}\x1f{session}")

    async def holds_checkpoints(self, owner: str, session: str) -> bool:
        keys = [self._held_key(owner, session), self._key(SCHEME_KEY)]
        held, scheme = await awaited(self._client.mget(keys))
        if held is not None:
            return True
        if scheme is not None and int(scheme) >= SCHEME:
            return False
        # A checkpoint from before held keys may be this session's: cannot say no.
        self._upgrade_soon()
        return True

    def holds_checkpoints_now(self, owner: str, session: str) -> bool | None:
        return None  # replicas write it with nothing to tell this one: a round trip

    async def held_keys_complete(self) -> None:
        """Return once every checkpoint's session is held (``scheme`` set): the
        backfill :meth:`holds_checkpoints` starts, started or joined, and awaited."""
        task = self._upgrade_soon()
        await asyncio.shield(task)

    def _upgrade_soon(self) -> asyncio.Task[None]:
        """The backfill, started unless it is running already (one per store)."""
        task = self._upgrading
        if task is None or task.done():
            task = self._upgrading = asyncio.ensure_future(self._upgrade())
        return task

    async def _upgrade(self) -> None:
        """Runs until ``scheme`` is set, one every :data:`RECHECK_SECONDS` while a
        replica from before held keys is alive or after a run that failed."""
        told = False
        while True:
            try:
                async with self.lock(_LOCK, UPGRADE_LEASE_SECONDS):
                    done = await self._backfill()
            except Exception as exc:  # in the background: nobody else to tell
                logger.warning(
                    "the held keys' backfill failed (%s); tried again in %g s",
                    type(exc).__name__,
                    RECHECK_SECONDS,
                )
            else:
                if done:
                    return
                if not told:
                    told = True
                    logger.info(
                        "a replica from before held keys is alive: small requests are "
                        "looked up the full way until it is gone"
                    )
            await self._sleep(RECHECK_SECONDS)

    async def _backfill(self) -> bool:
        """One run (the module doc): ``False`` while a replica from before held
        keys is alive, else ``True`` once ``scheme`` is set."""
        scheme = await awaited(self._client.get(self._key(SCHEME_KEY)))
        if scheme is not None and int(scheme) >= SCHEME:
            return True  # another replica did it
        if await self._older_replica_alive():
            return False
        read = written = 0
        async with contextlib.aclosing(self._scan("ckpt:*")) as batches:
            async for keys in batches:
                read += len(keys)
                written += await self._hold_sessions(keys)
        done = await awaited(self._client.set(self._key(SCHEME_KEY), SCHEME))
        if done is not True:  # a SET without a condition always answers OK
            raise GarbledReply(f"Redis answered SET with {type(done).__name__}")
        logger.info("held keys backfilled: %d checkpoint(s) read, %d key(s) set", read, written)
        return True

    async def _older_replica_alive(self) -> bool:
        """Whether a heartbeat names a scheme before this one's."""
        older = False
        async with contextlib.aclosing(self._scan("alive:*")) as batches:
            async for keys in batches:
                beats = await awaited(self._client.mget(keys))
                older = older or any(beat is not None and int(beat) < SCHEME for beat in beats)
        return older

    async def _hold_sessions(self, keys: list[bytes]) -> int:
        """Each checkpoint of ``keys`` (``ckpt:<id>``) its session's key, held
        at least as long as the checkpoint lives; how many keys were set."""
        start = len(self._key("ckpt", ""))
        async with self._client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
                pipe.get(self._key("owner", key.decode()[start:]))
            replies: list[Any] = await pipe.execute()
        wanted: dict[str, int] = {}
        for index in range(0, len(replies), 3):
            raw, left, owner = replies[index : index + 3]
            left = expect(left, int, "PTTL")
            if raw is None or left == -2 or left == 0:
                continue  # expired since the SCAN found it, or expiring (SET refuses PX 0)
            # No owner key: a checkpoint from before owners, read as get() reads it.
            held = self._held_key((owner or b"").decode(), codec.load_checkpoint(raw).session)
            before = wanted.get(held, 0)
            wanted[held] = -1 if -1 in (left, before) else max(left, before)  # -1: for ever
        if not wanted:
            return 0
        written = await self._hold(keys=list(wanted), args=list(wanted.values()))
        return int(expect(written, int, "the held keys' script"))

    async def _scan(self, pattern: str) -> AsyncGenerator[list[bytes], None]:
        """The keys under the prefix matching ``pattern``, :data:`BACKFILL_BATCH`
        a round. A walk whose cursor never comes back to 0 — no Redis's — is
        given up after four times the rounds the keyspace's size takes."""
        size = expect(await awaited(self._client.dbsize()), int, "DBSIZE")
        rounds = 4 * (size // BACKFILL_BATCH + 1) + 16
        match = _glob_quoted(self._prefix) + pattern
        cursor = 0
        for _ in range(rounds):
            cursor, keys = await awaited(
                self._client.scan(cursor, match=match, count=BACKFILL_BATCH)
            )
            if keys:
                yield list(keys)
            if expect(cursor, int, "SCAN") == 0:
                return
        raise GarbledReply(f"SCAN did not end after {rounds} rounds")


def _glob_quoted(text: str) -> str:
    """``text`` matched as itself by a Redis pattern (a prefix may hold ``*``)."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)
