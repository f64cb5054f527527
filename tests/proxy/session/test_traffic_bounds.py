"""What the one-slot bookkeeping remembers per upstream and model is bounded:
model names are the client's to invent."""

from __future__ import annotations

import asyncio
import gc

import pytest

from proxy.upstream import traffic as traffic_module
from proxy.upstream.traffic import Traffic
from proxy.upstream.transport import UpstreamResponse


async def _reply() -> str:
    return "a summary"


def test_the_traffic_of_invented_model_names_is_forgotten_oldest_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(traffic_module, "TRAFFIC_KEYS", 8)
    traffic = Traffic()

    async def run() -> None:
        for n in range(50):
            key = f"http://upstream\x1fmodel-{n}"
            await traffic.summary(key, _reply(), single=False, patience=1)
            sending = await traffic.begin(key, stated=None)
            sending.end()
            traffic.tell_once(key)

    asyncio.run(run())
    for rows in (traffic._ended, traffic._overlaps, traffic._told):
        assert len(rows) <= 8
    assert "http://upstream\x1fmodel-49" in traffic._ended
    assert "http://upstream\x1fmodel-0" not in traffic._ended


@pytest.mark.parametrize("stated", [1, 4])
def test_a_user_request_cancels_the_summaries_in_flight_only_where_the_upstream_has_one_slot(
    stated: int,
) -> None:
    async def run() -> tuple[bool, bool]:
        traffic = Traffic()
        started = asyncio.Event()

        async def summary() -> str:
            started.set()
            await asyncio.sleep(3600)  # until cancelled, or the test ends
            return "a summary"

        key = "http://upstream\x1fmodel"
        running = asyncio.ensure_future(traffic.summary(key, summary(), single=False, patience=1))
        await started.wait()
        sending = await traffic.begin(key, stated=stated)
        gave_way = running.done()
        running.cancel()
        results = await asyncio.gather(running, return_exceptions=True)
        sending.end()
        return gave_way, isinstance(results[0], traffic_module.GaveWay)

    gave_way, told = asyncio.run(run())
    assert gave_way == told == (stated == 1)


def _unreleased(key: str, traffic: Traffic) -> None:
    """An answer counted in flight, then dropped without being read, released or aborted."""

    async def run() -> None:
        sending = await traffic.begin(key, stated=None)
        response = UpstreamResponse.__new__(UpstreamResponse)  # no connection behind it
        response.on_end = None
        sending.answered(response)
        assert traffic._requests[key] == 1

    asyncio.run(run())


def test_an_answer_dropped_unreleased_ends_its_count_when_collected() -> None:
    traffic = Traffic()
    _unreleased("http://upstream\x1fm", traffic)
    gc.collect()
    assert "http://upstream\x1fm" not in traffic._requests
