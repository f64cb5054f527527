"""What callers learned of a model, read back by a restarted proxy from every
shared store: each caller's own window and ratio, and the guard of the largest
prompt answered (:mod:`proxy.state.models` on the real backends)."""

from __future__ import annotations

import pytest

from config import ModelResolver, load_settings
from proxy.state.models import ModelKnowledge
from proxy.state.stores import Store
from tests.proxy.state.stores.conftest import Backend

pytestmark = pytest.mark.anyio

HONEST, LIAR, NEWCOMER = "a" * 32, "b" * 32, "c" * 32
ESTIMATE = 5_000


async def _restarted(store: Store) -> ModelKnowledge:
    models = ModelKnowledge(store, max_rows=1_000)
    models.restore(await store.learned_windows(), await store.calibrations())
    return models


async def test_each_callers_lessons_and_the_guard_outlive_a_restart(backend: Backend) -> None:
    if not backend.shared:
        pytest.skip("memory:// lives and dies with its store")
    config = ModelResolver(load_settings(None, store={"url": "memory://"})).resolve("gpt-4o")
    models = ModelKnowledge(backend.open(), max_rows=1_000)
    models.observe(config, ESTIMATE, 5_100, HONEST)
    assert await models.learn_window(config, 6_000, LIAR)
    models.observe(config, ESTIMATE, 2 * ESTIMATE, LIAR)
    await models.written()

    restarted = await _restarted(backend.open())
    assert restarted.ratio(config, HONEST) == pytest.approx(1.02)
    assert restarted.of(config, HONEST).window_learned is None
    assert restarted.of(config, LIAR).window_learned == 6_000
    assert restarted.ratio(config, LIAR) == pytest.approx(2.0)
    assert restarted.of(config, NEWCOMER).window_learned is None
    assert restarted.ratio(config, NEWCOMER) == 1.0
    assert restarted.answered(config) >= 2 * ESTIMATE / 1.02  # the guard, as last stored
    assert not await restarted.learn_window(config, 4_000, NEWCOMER)  # below what was answered
