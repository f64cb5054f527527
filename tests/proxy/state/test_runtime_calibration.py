"""The running proxy's calibration: one odd answer cannot move a model's ratio
(and so every conversation's limit on it) by more than a step, before or
after a restart."""

from __future__ import annotations

import asyncio

import pytest

from compaction import calibrated_budget
from compaction.calibration import MAX_STEP, WINDOW
from config import ModelResolver, load_settings
from proxy.state.runtime import ProxyState, build_transport, calibration_key
from proxy.state.stores import MemoryStore

pytestmark = pytest.mark.anyio

ESTIMATE = 5_000


def _state(store: MemoryStore | None = None) -> ProxyState:
    settings = load_settings(None, store={"url": "memory://"})
    return ProxyState(
        settings=settings,
        transport=build_transport(settings),
        store=store or MemoryStore(),
        resolver=ModelResolver(settings),
    )


async def test_one_digit_heavy_answer_moves_the_limit_of_the_models_conversations_by_a_step() -> (
    None
):
    state = _state()
    config = state.resolve("qwen2.5-coder-1.5b-instruct")
    for upstream in (5_500, 5_480, 5_530, 5_510, 5_490):  # about 1.10 of our estimate
        state.observe(config, ESTIMATE, upstream)
    settled = state.ratio(config)
    limit = calibrated_budget(config.profile, ratio=settled).input_limit
    state.observe(config, ESTIMATE, 2 * ESTIMATE)  # a tool output full of digits
    assert state.ratio(config) <= settled * (1 + MAX_STEP)
    after = calibrated_budget(config.profile, ratio=state.ratio(config)).input_limit
    assert after >= limit * (1 - MAX_STEP) - 1
    await asyncio.gather(*state._writes)
    await state.transport.aclose()


async def test_a_restarted_proxy_takes_the_stored_ratio_as_a_prior_moved_by_steps() -> None:
    store = MemoryStore()
    first = _state(store)
    config = first.resolve("qwen2.5-coder-1.5b-instruct")
    first.observe(config, ESTIMATE, 5_500)
    await asyncio.gather(*first._writes)
    await first.transport.aclose()

    second = _state(store)
    second.ratios.update(await store.calibrations())  # what the app's start-up does
    assert second.ratio(config) == pytest.approx(1.1)
    second.observe(config, ESTIMATE, 2 * ESTIMATE)
    assert second.ratio(config) == pytest.approx(1.1 * (1 + MAX_STEP))
    assert second.calibrations[calibration_key(config)].samples == (2.0,)
    await asyncio.gather(*second._writes)
    await second.transport.aclose()


async def test_the_samples_kept_are_bounded_as_the_ratios_are() -> None:
    """A window of samples per upstream and model, for at most
    ``store.max_model_rows`` of them: model names are the clients' to invent."""
    settings = load_settings(None, store={"url": "memory://", "max_model_rows": 3})
    state = ProxyState(
        settings=settings,
        transport=build_transport(settings),
        store=MemoryStore(max_model_rows=3),
        resolver=ModelResolver(settings),
    )
    configs = [state.resolve(f"invented-{number}") for number in range(50)]
    for config in configs:
        for _ in range(20):
            state.observe(config, ESTIMATE, 5_500)
    assert set(state.calibrations) == {calibration_key(config) for config in configs[-3:]}
    assert all(len(c.samples) <= WINDOW for c in state.calibrations.values())
    await asyncio.gather(*state._writes)
    await state.transport.aclose()
