"""What the one-slot bookkeeping remembers per upstream and model is bounded:
model names are the client's to invent."""

from __future__ import annotations

import asyncio

import pytest

from proxy.upstream import traffic as traffic_module
from proxy.upstream.traffic import Traffic


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
            sending = await traffic.begin(key, single=False)
            sending.end()
            traffic.tell_once(key)

    asyncio.run(run())
    for rows in (traffic._ended, traffic._overlaps, traffic._told):
        assert len(rows) <= 8
    assert "http://upstream\x1fmodel-49" in traffic._ended
    assert "http://upstream\x1fmodel-0" not in traffic._ended
