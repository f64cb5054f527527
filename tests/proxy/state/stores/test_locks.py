"""LeaseLocks: single flight in one process, and a waiter that never waits for ever."""

from __future__ import annotations

import asyncio
import math

import pytest

from proxy.state.stores.locks import MAX_HOLD, LeaseLocks, LockBusy

pytestmark = pytest.mark.anyio


async def test_a_waiter_gives_up_once_the_longest_a_lease_lives_has_passed() -> None:
    locks = LeaseLocks()
    ttl = 0.01
    async with locks.hold("span", ttl=60):
        # A lease that never lapses, as no holder's could: only the waiter's
        # own bound can end its wait.
        locks._leases["span"].deadline = math.inf
        async with asyncio.timeout(10):  # a deadline for "it gave up", not a measure
            with pytest.raises(LockBusy) as caught:
                async with locks.hold("span", ttl=ttl):
                    pytest.fail("the lock was held")
    assert caught.value.key == "span"
    assert f"{MAX_HOLD * ttl:g} s" in str(caught.value)


async def test_a_waiter_still_gets_a_lock_its_holder_releases() -> None:
    locks = LeaseLocks()
    order: list[str] = []

    async def holder() -> None:
        async with locks.hold("span", ttl=60):
            order.append("holder")
            await asyncio.sleep(0.01)

    task = asyncio.create_task(holder())
    await asyncio.sleep(0)
    async with asyncio.timeout(10), locks.hold("span", ttl=60):
        order.append("waiter")
    await task
    assert order == ["holder", "waiter"]
