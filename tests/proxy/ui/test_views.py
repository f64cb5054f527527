"""What one session's page and JSON read from the store, as one view."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from proxy.state.stores import RequestRecord
from proxy.state.stores.memory import MemoryStore
from proxy.ui.views import read_session
from tests.proxy.state.stores.test_figures_contract import record


class _WrittenMeanwhile(MemoryStore):
    """A store whose figures gain a request right after each read of the
    requests, as the recorder's batch can land between a view's reads."""

    async def requests(
        self, session: str, *, owner: str | None = None, limit: int = 100
    ) -> list[RequestRecord]:
        found = await super().requests(session, owner=owner, limit=limit)
        await self.record_requests([record(owner="ann")])
        return found


def test_a_session_view_never_counts_requests_its_list_does_not_hold() -> None:
    async def view() -> tuple[int, Sequence[RequestRecord]]:
        store = _WrittenMeanwhile()
        await store.record_requests([record(owner="ann")])
        found = await read_session(store, "s1", "ann")
        assert found.summary is not None
        return found.summary.requests, found.requests

    counted, listed = asyncio.run(view())
    assert counted <= len(listed)
