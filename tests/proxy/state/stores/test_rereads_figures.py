"""Re-reads in the stored figures: every backend keeps a request's count and
adds it up in its session, with no schema of its own (the records are JSON)."""

from __future__ import annotations

import time

import pytest

from proxy.state.stores import RequestRecord, Store
from proxy.state.stores.codec import load

pytestmark = pytest.mark.anyio


def _record(created_at: float, rereads: int) -> RequestRecord:
    return RequestRecord(
        session="s1",
        owner="ann",
        model="gpt-4o",
        stage="reused",
        reason="threshold",
        tokens_before=9_000,
        tokens_after=3_000,
        input_limit=100_000,
        trigger=80_000,
        status=200,
        ms=5.0,
        rereads=rereads,
        created_at=created_at,
    )


async def test_a_requests_rereads_are_kept_and_added_up_in_its_session(store: Store) -> None:
    now = time.time()
    records = [_record(now - 3, 2), _record(now - 2, 0), _record(now - 1, 1)]
    await store.record_requests(records)
    assert [r.rereads for r in await store.requests("s1", owner="ann")] == [1, 0, 2]
    (summary,) = await store.sessions(owner="ann")
    assert summary.rereads == 3


def test_figures_written_before_rereads_were_counted_read_as_none() -> None:
    old = b'{"session":"s1","model":"m","stage":"none","reason":"threshold",' + (
        b'"tokens_before":1,"tokens_after":1,"input_limit":2,"trigger":2,"status":200,"ms":1.0}'
    )
    assert load(RequestRecord, old).rereads == 0
