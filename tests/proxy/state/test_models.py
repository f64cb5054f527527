"""What the proxy learned about each upstream's model (:class:`ModelKnowledge`):
bounded as the store's rows are, since a client may send any number of invented
model names; a ratio one odd answer moves by a step at most, before or after a
restart; and the store's rows restored under what was learned meanwhile. What
one caller's requests teach is that caller's: another caller's limit moves by
a few percent at most, before and after a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction import calibrated_budget
from compaction.budget.lessons import AGREEING_CALLERS
from compaction.tokens.calibration import MAX_STEP, WINDOW
from config import ModelConfig, ModelResolver, load_settings
from proxy.state.models import ModelKnowledge, calibration_key, server_key, slots_key
from proxy.state.stores import MemoryStore, Store, open_store
from proxy.upstream.discovery import ServerFacts

pytestmark = pytest.mark.anyio

CAP = 4
ESTIMATE = 5_000
MODEL = "qwen2.5-coder-1.5b-instruct"


def _resolver() -> ModelResolver:
    return ModelResolver(load_settings(None, store={"url": "memory://"}))


def _configs(names: list[str]) -> list[ModelConfig]:
    resolver = _resolver()
    return [resolver.resolve(name) for name in names]


def _models(store: Store | None = None, cap: int = CAP) -> ModelKnowledge:
    return ModelKnowledge(store or MemoryStore(max_model_rows=cap), max_rows=cap)


async def test_invented_model_names_leave_at_most_the_cap_in_memory_and_in_the_store() -> None:
    store = MemoryStore(max_model_rows=CAP)
    models = _models(store)
    configs = _configs([f"invented-{number}" for number in range(1_100)])
    for config in configs:
        models.prove(config, 1_000)
        models.observe(config, 1_000, 1_100)  # learns a ratio
        assert await models.learn_window(config, 50_000)
    await models.written()
    newest = [calibration_key(config) for config in configs[-CAP:]]
    assert list(models) == newest
    for key in newest:
        known = models.get(key)
        assert (known.proven, known.window_learned) == (1_100, 50_000)
        assert known.ratio == pytest.approx(1.1)
    assert len(await store.calibrations()) == CAP
    assert len(await store.learned_windows()) == CAP


async def test_a_row_updated_again_is_kept_over_older_ones() -> None:
    models = _models()
    first, *others = _configs([f"model-{number}" for number in range(CAP + 1)])
    models.prove(first, 100)
    for config in others[:-1]:
        models.prove(config, 100)
    models.prove(first, 200)  # the oldest, updated: now the newest
    models.prove(others[-1], 100)
    assert calibration_key(first) in list(models)
    assert calibration_key(others[0]) not in list(models)
    assert len(models) == CAP


async def test_a_row_answered_again_with_nothing_new_is_kept_over_older_ones() -> None:
    # Most answers prove no larger prompt than the last: the row is not copied
    # then, but it is still the one most recently in use.
    models = _models()
    first, *others = _configs([f"model-{number}" for number in range(CAP + 1)])
    models.prove(first, 200)
    for config in others[:-1]:
        models.prove(config, 100)
    models.prove(first, 200)
    models.prove(others[-1], 100)
    assert list(models)[-2:] == [calibration_key(first), calibration_key(others[-1])]
    assert calibration_key(others[0]) not in list(models)
    assert models.get(calibration_key(first)).proven == 200


async def test_one_digit_heavy_answer_moves_the_limit_of_the_models_conversations_by_a_step() -> (
    None
):
    models = _models()
    (config,) = _configs([MODEL])
    for upstream in (5_500, 5_480, 5_530, 5_510, 5_490):  # about 1.10 of our estimate
        models.observe(config, ESTIMATE, upstream)
    settled = models.ratio(config)
    limit = calibrated_budget(config.profile, ratio=settled).input_limit
    models.observe(config, ESTIMATE, 2 * ESTIMATE)  # a tool output full of digits
    assert models.ratio(config) <= settled * (1 + MAX_STEP)
    after = calibrated_budget(config.profile, ratio=models.ratio(config)).input_limit
    assert after >= limit * (1 - MAX_STEP) - 1
    await models.written()


async def test_a_restarted_proxy_takes_the_stored_ratio_as_a_prior_moved_by_steps() -> None:
    store = MemoryStore()
    first = _models(store)
    (config,) = _configs([MODEL])
    first.observe(config, ESTIMATE, 5_500)
    await first.written()

    second = _models(store)
    second.restore(await store.learned_windows(), await store.calibrations())
    assert second.ratio(config) == pytest.approx(1.1)
    second.observe(config, ESTIMATE, 2 * ESTIMATE)
    assert second.ratio(config) == pytest.approx(1.1 * (1 + MAX_STEP))
    calibration = second.of(config).calibration
    assert calibration is not None and calibration.samples == (2.0,)
    await second.written()


async def test_the_samples_kept_are_bounded_as_the_ratios_are() -> None:
    """A window of samples per upstream and model, for at most
    ``store.max_model_rows`` of them: model names are the clients' to invent."""
    models = _models(cap=3)
    configs = _configs([f"invented-{number}" for number in range(50)])
    for config in configs:
        for _ in range(20):
            models.observe(config, ESTIMATE, 5_500)
    assert list(models) == [calibration_key(config) for config in configs[-3:]]
    kept = [models.get(key).calibration for key in models]
    assert all(c is not None and len(c.samples) <= WINDOW for c in kept)
    await models.written()


async def test_what_a_server_states_is_restored_apart_from_what_an_overflow_taught() -> None:
    store = MemoryStore()
    first = _models(store)
    stated, learned = _configs(["served-model", "overflowed-model"])
    assert await first.server_stated(stated, ServerFacts(8_192, slots=1, source="test"))
    assert await first.learn_window(learned, 4_096)
    rows = await store.learned_windows()
    key = calibration_key(stated)
    assert rows[server_key(key)] == 8_192 and rows[slots_key(key)] == 1

    second = _models(store)
    second.restore(rows, {})
    assert (second.of(stated).window_stated, second.slots(stated)) == (8_192, 1)
    assert second.of(stated).window_learned is None
    assert second.of(learned).window_learned == 4_096
    assert second.of(learned).window_stated is None


async def test_a_restore_keeps_what_was_learned_meanwhile_and_the_cap() -> None:
    """The store answered late (it was down at start-up): each figure this
    process learned since is the newer; the restored rows count as older, so
    they are the first to go past the cap."""
    models = _models(cap=3)
    meanwhile, *stored = _configs(["meanwhile", "stored-a", "stored-b", "stored-c"])
    assert await models.learn_window(meanwhile, 6_000)
    windows = {calibration_key(meanwhile): 9_000}
    windows |= {calibration_key(config): 5_000 for config in stored}
    models.restore(windows, {calibration_key(meanwhile): 1.2})
    assert models.of(meanwhile).window_learned == 6_000  # not the store's 9,000
    assert models.ratio(meanwhile) == pytest.approx(1.2)  # it had learned none
    assert models.of(stored[0]).window_learned is None  # the oldest went past the cap
    assert [models.of(config).window_learned for config in stored[1:]] == [5_000, 5_000]


HONEST, LIAR = "a" * 32, "b" * 32  # two callers (owner digests)


def _on_sqlite(tmp_path: Path) -> tuple[Store, ModelKnowledge, ModelConfig]:
    """A real SQLite store, what a process learns on it, and the model it learns of."""
    store = open_store(f"sqlite://{tmp_path / 'state.db'}")
    (config,) = _configs([MODEL])
    return store, _models(store, cap=1_000), config


async def _restarted(store: Store) -> ModelKnowledge:
    """A new process on ``store``: what it reads back at start-up."""
    models = ModelKnowledge(store, max_rows=1_000)
    models.restore(await store.learned_windows(), await store.calibrations())
    return models


def _limit(models: ModelKnowledge, config: ModelConfig, owner: str) -> int:
    """The input limit of ``owner``'s conversations on ``config`` as the proxy
    would budget them: the window learned or agreed, scaled by the ratio."""
    window = models.of(config, owner).window_learned
    profile = config.profile
    if window is not None:
        profile = (
            ModelResolver(load_settings(None, store={"url": "memory://"}))
            .resolve(config.model, {config.model: window})
            .profile
        )
    return calibrated_budget(profile, ratio=models.ratio(config, owner)).input_limit


async def test_one_callers_lying_counts_and_overflow_move_anothers_limit_by_five_percent_at_most(
    tmp_path: Path,
) -> None:
    store, models, config = _on_sqlite(tmp_path)
    for _ in range(3):
        models.observe(config, ESTIMATE, 5_100, HONEST)  # the honest caller settles first
    before = _limit(models, config, HONEST)
    assert await models.learn_window(config, 6_000, LIAR)  # the other caller's overflow
    for _ in range(32):  # and its content the upstream counts at twice our estimate
        models.observe(config, ESTIMATE, 2 * ESTIMATE, LIAR)
    assert models.of(config, LIAR).window_learned == 6_000  # its own lessons are kept
    assert _limit(models, config, HONEST) >= before * 0.95
    await models.written()

    restarted = await _restarted(store)
    assert _limit(restarted, config, HONEST) >= before * 0.95
    assert restarted.of(config, LIAR).window_learned == 6_000
    assert restarted.ratio(config, LIAR) == pytest.approx(2.0)
    await store.close()


async def test_a_newcomer_gets_what_enough_callers_agree_on_and_no_single_callers_lesson(
    tmp_path: Path,
) -> None:
    store, models, config = _on_sqlite(tmp_path)
    newcomer = "c" * 32
    assert await models.learn_window(config, 3_000, LIAR)
    models.observe(config, ESTIMATE, 2 * ESTIMATE, LIAR)
    assert models.of(config, newcomer).window_learned is None
    assert models.ratio(config, newcomer) == 1.0
    callers = [f"{number:032x}" for number in range(AGREEING_CALLERS)]
    for caller in callers:  # as many callers as agreement takes, besides the liar
        models.observe(config, ESTIMATE, 5_500, caller)
        assert await models.learn_window(config, 16_000, caller)
    assert models.of(config, newcomer).window_learned == 16_000  # not the liar's 3,000
    assert models.ratio(config, newcomer) == pytest.approx(1.1)
    await models.written()
    restarted = await _restarted(store)
    assert restarted.of(config, newcomer).window_learned == 16_000
    assert restarted.ratio(config, newcomer) == pytest.approx(1.1)
    await store.close()


async def test_the_largest_prompt_answered_outlives_a_restart_and_refuses_a_smaller_window(
    tmp_path: Path,
) -> None:
    store, models, config = _on_sqlite(tmp_path)
    models.prove(config, 4_457)  # a caller's request answered
    await models.written()

    restarted = await _restarted(store)
    assert restarted.answered(config) >= 4_457 / (1 + 0.02)
    assert not await restarted.learn_window(config, 3_000, LIAR)  # below what was answered
    assert restarted.of(config, LIAR).window_learned is None
    await store.close()


@pytest.mark.parametrize("stated", [8_192, None])
async def test_a_stream_estimated_above_what_the_server_said_does_not_raise_the_working_limit(
    stated: int | None,
) -> None:
    """The server states 8,192 (or refused 9,000 with an empty stream), then
    begins to answer what we estimated at 10,979 — it dropped the tool text:
    the working limit stays below what the server said."""
    models = _models(cap=1_000)
    (config,) = _configs([MODEL])
    if stated is not None:
        assert await models.server_stated(config, ServerFacts(stated, slots=1, source="test"))
    models.stream_answered(config, 5_000)
    assert models.empty_stream(config, 9_000).overflow
    narrowed = models.working_limit(config)
    assert narrowed is not None and narrowed < 8_192
    models.stream_answered(config, 10_979)
    assert models.working_limit(config) == narrowed
    assert models.answered(config) == 5_000
    models.stream_answered(config, 7_000)  # below both: an answer that does prove more
    assert models.working_limit(config) == 7_000


async def test_a_callers_ratio_is_its_own_else_what_the_others_agree_on_as_it_moves() -> None:
    models = _models(cap=16)
    (config,) = _configs([MODEL])
    assert models.ratio(config, "newcomer") == 1.0  # nothing learned, nothing agreed
    callers = [f"caller-{n}" for n in range(AGREEING_CALLERS)]
    for caller in callers:
        models.observe(config, ESTIMATE, int(ESTIMATE * 1.2), caller)
    agreed = models.ratio(config, "newcomer")
    assert agreed == pytest.approx(1.2, abs=0.01)
    assert agreed == models.of(config, "newcomer").ratio  # the view says the same
    models.observe(config, ESTIMATE, int(ESTIMATE * 1.6), "loner")
    assert models.ratio(config, "loner") == pytest.approx(1.6, abs=0.05)  # its own
    for caller in callers:  # the agreement is worked out again once a caller learns
        for _ in range(WINDOW):
            models.observe(config, ESTIMATE, int(ESTIMATE * 1.4), caller)
    assert models.ratio(config, "newcomer") > agreed + 0.05
    assert models.ratio(config, "newcomer") == models.of(config, "newcomer").ratio


async def test_the_windows_read_in_place_say_what_the_view_says() -> None:
    """``windows`` (read on every request) and ``of`` (the full view) agree for
    a caller with its own window, one under the callers' agreement, one with
    neither; with the server's stated window and an empty stream's limit."""
    models = _models(cap=16)
    (config,) = _configs([MODEL])
    key = calibration_key(config)
    assert models.windows(key, "newcomer") == (None, None, None)
    callers = [f"caller-{n}" for n in range(AGREEING_CALLERS)]
    for caller in callers:
        assert await models.learn_window(config, 16_000, caller)
    assert await models.learn_window(config, 12_000, "own")
    assert await models.learn_window(config, 20_000, "larger")
    assert await models.server_stated(config, ServerFacts(32_768, slots=1, source="test"))
    models.stream_answered(config, 5_000)
    assert models.empty_stream(config, 9_000).overflow
    for owner in ("newcomer", "own", "larger", callers[0]):
        known = models.of(config, owner)
        expected = (known.window_learned, known.window_stated, known.working_limit)
        assert models.windows(key, owner) == expected
    assert models.windows(key, "own")[0] == 12_000  # its own, below the agreement
    assert models.windows(key, "larger")[0] == 16_000  # held to the agreement
    assert models.windows(key, "newcomer")[0] == 16_000
    assert models.windows(key, "newcomer")[1] == 32_768
    assert models.windows(key, "newcomer")[2] is not None
