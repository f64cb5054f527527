"""What the running proxy holds per upstream and model (learned windows, the
prompts each answered, calibration ratios) is bounded as the store's rows are:
a client may send any number of invented model names."""

from __future__ import annotations

import asyncio

import pytest

from config import ModelResolver, load_settings
from proxy.state.runtime import ProxyState, build_transport, calibration_key
from proxy.state.stores import MemoryStore

pytestmark = pytest.mark.anyio

CAP = 4


def _state() -> ProxyState:
    settings = load_settings(None, store={"url": "memory://", "max_model_rows": CAP})
    return ProxyState(
        settings=settings,
        transport=build_transport(settings),
        store=MemoryStore(max_model_rows=CAP),
        resolver=ModelResolver(settings),
    )


async def test_invented_model_names_leave_at_most_the_cap_in_memory() -> None:
    state = _state()
    configs = [state.resolve(f"invented-{number}") for number in range(1_100)]
    for config in configs:
        state.prove(config, 1_000)
        state.observe(config, 1_000, 1_100)  # learns a ratio
        assert await state.learn_window(config, 50_000)
    await asyncio.gather(*state._writes)
    newest = {calibration_key(config) for config in configs[-CAP:]}
    assert set(state.proven) == newest
    assert set(state.ratios) == newest
    assert set(state.learned_windows) == newest
    assert len(await state.store.calibrations()) == CAP
    assert len(await state.store.learned_windows()) == CAP
    await state.transport.aclose()


async def test_a_row_updated_again_is_kept_over_older_ones() -> None:
    state = _state()
    first, *others = [state.resolve(f"model-{number}") for number in range(CAP + 1)]
    state.prove(first, 100)
    for config in others[:-1]:
        state.prove(config, 100)
    state.prove(first, 200)  # the oldest, updated: now the newest
    state.prove(others[-1], 100)
    assert calibration_key(first) in state.proven
    assert calibration_key(others[0]) not in state.proven
    assert len(state.proven) == CAP
    await state.transport.aclose()
