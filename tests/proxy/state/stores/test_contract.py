"""The store contract: every backend (memory, SQLite, Redis) passes these same tests."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from compaction.conversation.checkpoints import Checkpoint
from compaction.types import Message
from proxy.state.stores import INTERRUPTED, Event, EventType, RedisStore, SessionSettings, Store
from tests.proxy.state.stores.conftest import Backend
from tests.proxy.state.stores.test_figures_contract import record

pytestmark = pytest.mark.anyio

DAY = 86400.0


def checkpoint(end_hash: str = "h1", session: str = "s1", **changes: Any) -> Checkpoint:
    values: dict[str, Any] = {
        "session": session,
        "end_hash": end_hash,
        "covered": 4,
        "replacement": (
            {"role": "user", "content": "Summary of the earlier conversation.", "x-extra": [1, 2]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "x"}]},
        ),
        "stage": "summarize",
        "reason": "threshold",
        "tokens_before": 12_345,
        "tokens_after": 2_345,
        "model": "gpt-4o",
        "id": uuid.uuid4().hex,
        "created_at": time.time(),
    }
    values.update(changes)
    return Checkpoint(**values)


def event(
    compaction_id: str,
    type: EventType = "compaction.queued",
    *,
    session: str = "s1",
    instance: str = "old",
    created_at: float | None = None,
    **changes: Any,
) -> Event:
    return Event(
        compaction_id=compaction_id,
        type=type,
        session=session,
        model="gpt-4o",
        reason="threshold",
        instance=instance,
        created_at=time.time() if created_at is None else created_at,
        **changes,
    )


ORIGINALS: list[Message] = [
    {"role": "user", "content": "hello", "name": "ann"},
    {"role": "assistant", "content": "hi", "unknown": {"kept": True}},
]


# -- checkpoints -----------------------------------------------------------


async def test_put_then_get_and_lookup_round_trip_exactly(store: Store) -> None:
    made = checkpoint(created_at=1_700_000_000.123456789)
    await store.put(made)
    assert await store.get(made.id) == made
    found = await store.lookup(["h1"])
    assert found == {"h1": made}
    assert found["h1"].replacement[0]["x-extra"] == [1, 2]
    assert isinstance(found["h1"].replacement, tuple)


async def test_lookup_several_hashes_at_once_with_misses(store: Store) -> None:
    first, second = checkpoint("a"), checkpoint("c", session="s2")
    await store.put(first)
    await store.put(second)
    assert await store.lookup(["a", "b", "c", "d", "a"]) == {"a": first, "c": second}
    assert await store.lookup(["x", "y"]) == {}
    assert await store.lookup([]) == {}


async def test_unknown_id_is_none(store: Store) -> None:
    assert await store.get("nope") is None
    assert await store.originals("nope") is None


async def test_newer_checkpoint_for_the_same_span_replaces_the_older(store: Store) -> None:
    old, new = checkpoint("h", tokens_after=900), checkpoint("h", tokens_after=800)
    await store.put(old, ORIGINALS)
    await store.put(new, ORIGINALS)
    assert await store.lookup(["h"]) == {"h": new}
    assert await store.get(new.id) == new
    assert await store.get(old.id) is None


async def test_putting_the_same_checkpoint_twice_is_harmless(store: Store) -> None:
    made = checkpoint()
    await store.put(made, ORIGINALS)
    await store.put(made, ORIGINALS)
    assert await store.get(made.id) == made
    assert await store.originals(made.id) == ORIGINALS


# -- originals -------------------------------------------------------------


async def test_originals_are_kept(store: Store) -> None:
    made = checkpoint()
    await store.put(made, ORIGINALS)
    assert await store.originals(made.id) == ORIGINALS


async def test_no_originals_given_means_none(store: Store) -> None:
    made = checkpoint()
    await store.put(made)
    assert await store.originals(made.id) is None


async def test_store_originals_false_keeps_none(backend: Backend) -> None:
    store = backend.open(store_originals=False)
    made = checkpoint()
    await store.put(made, ORIGINALS)
    assert await store.get(made.id) == made
    assert await store.originals(made.id) is None


async def test_retention_drops_old_originals(backend: Backend) -> None:
    if backend.expires:
        # Long enough to read the originals back on a loaded machine; then
        # they are waited out (a bounded wait: the store's clock is Redis's).
        store = backend.open(retention_seconds=1.5)
        made = checkpoint()
        await store.put(made, ORIGINALS)
        assert await store.originals(made.id) == ORIGINALS
        deadline = time.monotonic() + 15
        while await store.originals(made.id) is not None:
            assert time.monotonic() < deadline, "the originals outlived their retention"
            await asyncio.sleep(0.1)
        assert await store.purge() == 0  # nothing to do: the TTLs did it
        return
    store = backend.open(retention_seconds=DAY)
    now = time.time()
    old = checkpoint("old", created_at=now - 3 * DAY)
    new = checkpoint("new", created_at=now)
    await store.put(old, ORIGINALS)
    await store.put(new, ORIGINALS)
    assert await store.purge(now=now - 10 * DAY) == 0
    assert await store.purge(now=now) == 1
    assert await store.originals(old.id) is None
    assert await store.originals(new.id) == ORIGINALS
    assert await store.purge(now=now) == 0


# -- events ----------------------------------------------------------------


async def test_event_round_trips_every_field(store: Store) -> None:
    made = event(
        "c1",
        "compaction.failed",
        stage="summarize",
        tokens_before=100,
        tokens_after=50,
        replaced_hashes=("h1", "h2"),
        error="upstream 502: bad gateway",
        checkpoint_id="cp1",
        created_at=1_700_000_000.5,
        owner="owner-a",
    )
    await store.add_event(made)
    assert await store.events() == [made]
    assert (await store.events())[0].replaced_hashes == ("h1", "h2")


async def test_events_newest_first_filtered_by_session_with_limit(store: Store) -> None:
    start = time.time()
    made = [
        event(f"c{index}", session="a" if index % 2 else "b", created_at=start + index)
        for index in range(6)
    ]
    for item in made:
        await store.add_event(item)
    assert await store.events() == made[::-1]
    assert await store.events(limit=2) == [made[5], made[4]]
    assert await store.events(session="a") == [made[5], made[3], made[1]]
    assert await store.events(session="b", limit=1) == [made[4]]
    assert await store.events(session="nobody") == []
    assert await store.events(limit=0) == []


# -- owners: one caller's records are hidden from the others -----------------------


async def test_a_checkpoint_is_found_by_id_for_its_owner_only(store: Store) -> None:
    made = checkpoint()
    await store.put(made, ORIGINALS, owner="alice")
    assert await store.get(made.id, owner="alice") == made
    assert await store.get(made.id, owner="bob") is None
    assert await store.get(made.id, owner="") is None
    assert await store.get(made.id) == made  # no owner given: anyone's (the admin)
    assert await store.lookup(["h1"]) == {"h1": made}  # the chain is scoped on its own


async def test_a_newer_checkpoint_of_the_span_takes_its_owner_along(store: Store) -> None:
    older, newer = checkpoint(), checkpoint()
    await store.put(older, owner="alice")
    await store.put(newer, owner="alice")
    assert await store.get(older.id, owner="alice") is None
    assert await store.get(newer.id, owner="alice") == newer
    assert await store.get(newer.id, owner="bob") is None


async def test_a_checkpoints_stored_owner_is_read_as_it_was_stored(store: Store) -> None:
    mine, anonymous = checkpoint("h1"), checkpoint("h2")
    await store.put(mine, ORIGINALS, owner="alice")
    await store.put(anonymous)
    assert await store.owner_of(mine.id) == "alice"
    assert await store.owner_of(anonymous.id) == ""  # recorded with no owner: still read
    assert await store.owner_of("no-such-id") is None


async def test_a_checkpoint_replaced_for_its_span_has_no_owner_left(store: Store) -> None:
    older, newer = checkpoint(), checkpoint()
    await store.put(older, owner="alice")
    await store.put(newer, owner="bob")
    assert await store.owner_of(older.id) is None
    assert await store.owner_of(newer.id) == "bob"


async def test_the_owners_of_a_session_are_every_owner_with_events_or_figures_of_it(
    store: Store,
) -> None:
    assert await store.owners_of_session("s") == []
    await store.add_event(event("a1", session="s", owner="bob"))
    await store.add_event(event("a2", session="s", owner="alice"))
    await store.add_event(event("a3", session="other", owner="dave"))
    await store.record_requests([record("s", owner="carol"), record("t", owner="erin")])
    assert await store.owners_of_session("s") == ["alice", "bob", "carol"]
    assert await store.owners_of_session("t") == ["erin"]


async def test_an_owner_stays_among_a_sessions_owners_however_many_events_another_adds(
    store: Store,
) -> None:
    await store.add_event(event("mine", session="s", owner="alice"))
    for number in range(1_001):  # past the events kept per session
        await store.add_event(event(f"theirs-{number}", session="s", owner="bob"))
    assert await store.owners_of_session("s") == ["alice", "bob"]


async def test_an_owner_gets_its_own_last_events_however_busy_the_others_are(
    store: Store,
) -> None:
    start = time.time()
    mine = [event(f"a{i}", owner="alice", created_at=start + i) for i in range(3)]
    for item in mine:
        await store.add_event(item)
    theirs = [event(f"b{i}", owner="bob", created_at=start + 10 + i) for i in range(150)]
    for item in theirs:
        await store.add_event(item)
    # A filter after a global "last 3" would find bob's only.
    assert await store.events(limit=3, owner="alice") == mine[::-1]
    assert await store.events(limit=2, owner="alice") == [mine[2], mine[1]]
    assert await store.events(limit=2, owner="bob") == [theirs[-1], theirs[-2]]
    assert await store.events(owner="carol") == []
    assert len(await store.events(limit=1000)) == len(mine) + len(theirs)  # everyone's


async def test_one_owners_events_of_one_session(store: Store) -> None:
    start = time.time()
    made = [
        event("a1", session="s", owner="alice", created_at=start),
        event("b1", session="s", owner="bob", created_at=start + 1),
        event("a2", session="t", owner="alice", created_at=start + 2),
        event("a3", session="s", owner="alice", created_at=start + 3),
    ]
    for item in made:
        await store.add_event(item)
    assert await store.events(session="s", owner="alice") == [made[3], made[0]]
    assert await store.events(session="s", owner="alice", limit=1) == [made[3]]
    assert await store.events(session="s", owner="bob") == [made[1]]
    assert await store.events(session="t", owner="bob") == []
    assert await store.events(session="s") == [made[3], made[1], made[0]]


async def test_an_interrupted_compaction_stays_its_owners(store: Store) -> None:
    await store.add_event(event("c", "compaction.started", instance="dead", owner="alice"))
    assert await store.fail_interrupted("me") == 1
    closed = await store.events(owner="alice")
    assert [item.type for item in closed] == ["compaction.failed", "compaction.started"]
    assert closed[0].owner == "alice"
    assert await store.events(owner="bob") == []


async def test_fail_interrupted_closes_what_dead_instances_left_open(store: Store) -> None:
    start = time.time()
    lifecycle = [
        event("queued-by-dead", "compaction.queued", instance="dead"),
        event("started-by-dead", "compaction.queued", instance="dead", session="s2"),
        event("started-by-dead", "compaction.started", instance="dead", session="s2"),
        event("finished-by-dead", "compaction.queued", instance="dead"),
        event("finished-by-dead", "compaction.started", instance="dead"),
        event("finished-by-dead", "context.compacted", instance="dead"),
        event("failed-by-dead", "compaction.started", instance="dead"),
        event("failed-by-dead", "compaction.failed", instance="dead", error="boom"),
        event("mine", "compaction.started", instance="me"),
    ]
    for offset, item in enumerate(lifecycle):
        await store.add_event(Event(**{**vars(item), "created_at": start + offset}))

    assert await store.fail_interrupted("me") == 2
    closed = {item.compaction_id: item for item in (await store.events(limit=2))}
    assert set(closed) == {"queued-by-dead", "started-by-dead"}
    for compaction_id, item in closed.items():
        assert item.type == "compaction.failed"
        assert item.error == INTERRUPTED
        assert item.instance == "me"
        assert item.reason == "threshold"
        assert item.session == ("s2" if compaction_id == "started-by-dead" else "s1")
    assert (await store.events(session="s2"))[0].type == "compaction.failed"

    assert await store.fail_interrupted("me") == 0  # idempotent
    assert len(await store.events()) == len(lifecycle) + 2
    assert (await store.events(limit=len(lifecycle) + 2))[-1].compaction_id == "queued-by-dead"


async def test_fail_interrupted_with_a_custom_message(store: Store) -> None:
    await store.add_event(event("c", "compaction.started", instance="dead"))
    assert await store.fail_interrupted("me", "killed") == 1
    assert (await store.events())[0].error == "killed"


async def test_heartbeat_is_accepted(store: Store) -> None:
    await store.heartbeat("me", 5.0)


# -- learned windows -------------------------------------------------------


async def test_learned_windows(store: Store) -> None:
    assert await store.learned_windows() == {}
    await store.set_learned_window("gpt-4o", 128_000)
    await store.set_learned_window("local/llama", 8_192)
    await store.set_learned_window("gpt-4o", 64_000)
    assert await store.learned_windows() == {"gpt-4o": 64_000, "local/llama": 8_192}


# -- calibration ratios ----------------------------------------------------

UPSTREAM_KEY = "http://127.0.0.1:8080/v1\x1fqwen3-coder"


async def test_calibrations_start_empty_and_overwrite(store: Store) -> None:
    assert await store.calibrations() == {}
    await store.set_calibration(UPSTREAM_KEY, 1.12)
    await store.set_calibration("other\x1fgpt-4o", 0.94)
    await store.set_calibration(UPSTREAM_KEY, 1.0375)
    found = await store.calibrations()
    assert found == {UPSTREAM_KEY: 1.0375, "other\x1fgpt-4o": 0.94}
    assert all(type(ratio) is float for ratio in found.values())


async def test_a_calibration_round_trips_exactly(store: Store) -> None:
    ratio = 1 / 3 + 1e-12  # every digit of the double, not a rounded text
    await store.set_calibration(UPSTREAM_KEY, ratio)
    assert (await store.calibrations())[UPSTREAM_KEY] == ratio
    await store.set_calibration(UPSTREAM_KEY, 2)  # an int is kept as a float
    assert (await store.calibrations())[UPSTREAM_KEY] == 2.0
    assert type((await store.calibrations())[UPSTREAM_KEY]) is float


@pytest.mark.parametrize(
    "key",
    [
        "",
        "https://api.example.com/v1?x=1&y=%20\x1fmodel:with/odd chars",
        "ünïcødé \N{SNOWMAN}\x1f模型",
        "line\nbreak\ttab\x00nul\x1f'quote\" -- ; DROP TABLE calibrations",
        "*?[glob]\x1f{hash}:tag",
    ],
)
async def test_calibration_keys_with_odd_characters_round_trip(store: Store, key: str) -> None:
    await store.set_calibration(key, 1.2)
    assert await store.calibrations() == {key: 1.2}


@pytest.mark.parametrize("ratio", [0.0, -1.1, float("nan"), float("inf"), float("-inf")])
async def test_a_calibration_that_is_not_finite_and_positive_is_refused(
    store: Store, ratio: float
) -> None:
    with pytest.raises(ValueError, match="finite and positive"):
        await store.set_calibration(UPSTREAM_KEY, ratio)
    assert await store.calibrations() == {}


async def test_invented_model_names_leave_at_most_the_cap_of_rows(backend: Backend) -> None:
    store = backend.open(max_model_rows=5)
    for number in range(12):
        await store.set_learned_window(f"invented-{number}", 1_000 + number)
        await store.set_calibration(f"url\x1finvented-{number}", 1.0 + number / 100)
    assert await store.learned_windows() == {f"invented-{n}": 1_000 + n for n in range(7, 12)}
    assert await store.calibrations() == {
        f"url\x1finvented-{n}": 1.0 + n / 100 for n in range(7, 12)
    }


async def test_past_the_cap_the_least_recently_set_row_goes(backend: Backend) -> None:
    store = backend.open(max_model_rows=3)
    for name in ("a", "b", "c"):
        await store.set_learned_window(name, 100)
        await store.set_calibration(name, 1.5)
    await store.set_learned_window("a", 90)  # set again: now the most recent
    await store.set_calibration("a", 1.25)
    await store.set_learned_window("d", 100)
    await store.set_calibration("d", 1.5)
    assert await store.learned_windows() == {"a": 90, "c": 100, "d": 100}
    assert await store.calibrations() == {"a": 1.25, "c": 1.5, "d": 1.5}


async def test_purge_drops_windows_and_calibrations_not_set_within_the_retention(
    backend: Backend,
) -> None:
    store = backend.open(retention_seconds=DAY)
    await store.set_learned_window("m", 8_192)
    await store.set_calibration(UPSTREAM_KEY, 1.2)
    await store.purge(now=time.time() + DAY / 2)
    assert await store.learned_windows() == {"m": 8_192}
    assert await store.calibrations() == {UPSTREAM_KEY: 1.2}
    await store.purge(now=time.time() + 2 * DAY)
    assert await store.learned_windows() == {}
    assert await store.calibrations() == {}


async def test_purge_drops_session_settings_not_set_within_the_retention(
    backend: Backend,
) -> None:
    chosen = SessionSettings(enabled=False, instructions="keep the API names")
    if backend.expires:
        store = backend.open(retention_seconds=0.3)
        await store.set_session_settings("s1", "ann", chosen)
        assert await store.session_settings("s1", "ann") == chosen
        await asyncio.sleep(0.5)
        await store.purge()  # nothing to do: the expiry did it
        assert await store.session_settings("s1", "ann") == SessionSettings()
        return
    store = backend.open(retention_seconds=DAY)
    await store.set_session_settings("s1", "ann", chosen)
    await store.purge(now=time.time() + DAY / 2)
    assert await store.session_settings("s1", "ann") == chosen
    await store.purge(now=time.time() + 2 * DAY)
    assert await store.session_settings("s1", "ann") == SessionSettings()


async def test_calibrations_and_learned_windows_are_kept_apart(store: Store) -> None:
    await store.set_learned_window("m", 8_192)
    await store.set_calibration("m", 1.5)
    assert await store.learned_windows() == {"m": 8_192}
    assert await store.calibrations() == {"m": 1.5}


# -- locks -----------------------------------------------------------------


async def test_lock_is_mutually_exclusive(store: Store) -> None:
    log: list[str] = []

    async def worker(name: str) -> None:
        async with store.lock("span", ttl=10):
            log.append(f"{name} in")
            await asyncio.sleep(0.05)
            log.append(f"{name} out")

    await asyncio.gather(worker("a"), worker("b"), worker("c"))
    assert len(log) == 6
    for index in range(0, 6, 2):  # nobody entered while another was inside
        assert log[index].endswith(" in")
        assert log[index + 1] == log[index].replace(" in", " out")


async def test_second_holder_waits_for_the_first(store: Store) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()

    async def first() -> None:
        async with store.lock("span", ttl=10):
            entered.set()
            await release.wait()

    holder = asyncio.create_task(first())
    await entered.wait()
    waiter = asyncio.create_task(_hold(store, "span", 10))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    async with asyncio.timeout(2):  # other keys are independent
        async with store.lock("other span", ttl=10):
            pass
    release.set()
    async with asyncio.timeout(5):
        await holder
        await waiter


async def _hold(store: Store, key: str, ttl: float) -> None:
    async with store.lock(key, ttl):
        pass


async def test_a_live_holder_keeps_its_lock_past_the_ttl(store: Store) -> None:
    """A summarization slower than the lock's expiry is still done once: the
    holder's lease is renewed while it works."""
    log: list[str] = []

    async def holder() -> None:
        async with store.lock("span", ttl=0.1):
            log.append("holder in")
            await asyncio.sleep(0.6)  # six expiries
            log.append("holder out")

    async def waiter() -> None:
        await asyncio.sleep(0.05)
        async with store.lock("span", ttl=0.1):
            log.append("waiter in")

    async with asyncio.timeout(10):
        await asyncio.gather(holder(), waiter())
    assert log == ["holder in", "holder out", "waiter in"]


async def test_abandoned_lock_expires_and_its_late_release_frees_nothing(store: Store) -> None:
    # A holder that never leaves is renewed up to MAX_HOLD × ttl, then lapses.
    abandoned = store.lock("span", ttl=0.03)
    await abandoned.__aenter__()  # a holder that dies without releasing
    second_in = asyncio.Event()
    second_out = asyncio.Event()

    async def second() -> None:
        async with store.lock("span", ttl=10):
            second_in.set()
            await second_out.wait()

    task = asyncio.create_task(second())
    await asyncio.sleep(0.01)  # a pause well inside the lease (renewed for 0.3 s in all)
    assert not second_in.is_set(), "the lease was taken while its holder still held it"
    async with asyncio.timeout(5):
        await second_in.wait()  # …and the lease lapsed in the end

    await abandoned.__aexit__(None, None, None)  # too late: it no longer owns the lock
    third = asyncio.create_task(_hold(store, "span", 10))
    await asyncio.sleep(0.1)
    assert not third.done()
    second_out.set()
    async with asyncio.timeout(5):
        await task
        await third


async def test_lock_is_released_when_the_body_raises(store: Store) -> None:
    with pytest.raises(RuntimeError):
        async with store.lock("span", ttl=10):
            raise RuntimeError("summarizer failed")
    async with asyncio.timeout(1):
        await _hold(store, "span", 10)


# -- lifecycle -------------------------------------------------------------


async def test_an_empty_store_is_still_true(store: Store) -> None:
    # ``store or default`` and ``if store:`` must not mistake an empty store
    # for no store at all (a store with a length would be false while empty).
    assert bool(store) is True
    assert not hasattr(store, "__len__")


async def test_close_is_idempotent(store: Store) -> None:
    await store.put(checkpoint())
    await store.close()
    await store.close()


async def test_data_survives_reopening(backend: Backend) -> None:
    if not backend.shared:
        pytest.skip("memory:// lives and dies with its store")
    first = backend.open()
    made = checkpoint()
    await first.put(made, ORIGINALS, owner="alice")
    await first.add_event(event("c1", owner="alice"))
    await first.set_learned_window("m", 1000)
    await first.set_calibration(UPSTREAM_KEY, 1.17)
    await first.close()

    second = backend.open()
    assert await second.lookup(["h1"]) == {"h1": made}
    assert await second.get(made.id, owner="alice") == made
    assert await second.get(made.id, owner="bob") is None
    assert await second.originals(made.id) == ORIGINALS
    assert [item.compaction_id for item in await second.events()] == ["c1"]
    assert [item.compaction_id for item in await second.events(owner="alice")] == ["c1"]
    assert await second.events(owner="bob") == []
    assert await second.learned_windows() == {"m": 1000}
    assert await second.calibrations() == {UPSTREAM_KEY: 1.17}


async def test_an_answer_given_at_once_is_always_the_lookups_answer(backend: Backend) -> None:
    """``lookup_now`` may always say "ask me" (None); whatever else it says is
    what ``lookup`` says, also right after another store on the same place (another
    process) or this one wrote, and while this one's write is still under way."""
    first = backend.open()
    other = backend.open() if backend.shared else first
    chain = ["a", "b", "c"]

    async def agreed() -> dict[str, Checkpoint] | None:
        now = first.lookup_now(chain)
        asked = await first.lookup(chain)
        assert now is None or now == asked
        return now

    await agreed()
    await agreed()  # the steady state of a conversation nothing was stored for
    made = checkpoint("b")
    await other.put(made, ORIGINALS)
    await agreed()
    assert await first.lookup(chain) == {"b": made}

    fresh = ["x", "y"]
    await first.lookup(fresh)
    await first.lookup(fresh)
    mine = checkpoint("y", id="cp-y")
    writing = asyncio.create_task(first.put(mine))
    await asyncio.sleep(0)  # the write has begun, not ended
    assert first.lookup_now(fresh) in (None, {"y": mine})
    await writing
    assert first.lookup_now(fresh) in (None, {"y": mine})
    assert await first.lookup(fresh) == {"y": mine}
    assert first.lookup_now([]) == {}


async def test_a_session_holds_checkpoints_once_one_is_put_for_its_owner(backend: Backend) -> None:
    """What lets a small request skip its chain: no checkpoint of its session
    is stored. Whatever is answered at once is what asking answers, also right
    after another store on the same place wrote and while a write is under way."""
    first = backend.open()
    other = backend.open() if backend.shared else first

    async def held(owner: str, session: str) -> bool:
        now = first.holds_checkpoints_now(owner, session)
        asked = await first.holds_checkpoints(owner, session)
        assert now is None or now == asked
        return asked

    if isinstance(first, RedisStore):
        # A keyspace new to held keys says "maybe" until it has looked for
        # checkpoints from before them (proxy/state/stores/redis/held.py).
        await first.held_keys_complete()
    assert not await held("alice", "s1")
    assert not await held("alice", "s1")  # the steady state of a session never compacted
    await other.put(checkpoint(session="s1"), ORIGINALS, owner="alice")
    assert await held("alice", "s1")
    assert not await held("bob", "s1")  # another owner's session of the same name
    assert not await held("alice", "s2")

    writing = asyncio.create_task(first.put(checkpoint("h2", session="s2"), owner="alice"))
    await asyncio.sleep(0)  # the write has begun, not ended
    assert first.holds_checkpoints_now("alice", "s2") in (None, True)
    await writing
    assert await held("alice", "s2")


async def test_purged_checkpoints_no_longer_hold_their_session(backend: Backend) -> None:
    if backend.kind == "redis":
        pytest.skip("Redis lets its keys expire on their own")
    store = backend.open(retention_seconds=DAY)
    now = time.time()
    await store.put(checkpoint("old", created_at=now - 3 * DAY), owner="alice")
    await store.put(checkpoint("new", session="s2", created_at=now), owner="alice")
    assert await store.holds_checkpoints("alice", "s1")
    await store.purge(now=now)
    assert not await store.holds_checkpoints("alice", "s1")
    assert await store.holds_checkpoints("alice", "s2")
