"""What each candidate HTTP client costs the proxy per relayed request.

The proxy pays its upstream client's CPU on every request, so the client was
chosen by this measurement: sequential small chat POSTs from this process to
the bench upstream (own process, own core), each answer read whole, CPU time
(``time.process_time``) and wall time per request. ``compaction-proxy`` is the
proxy's own :class:`~proxy.upstream.transport.Transport` (aiohttp with its guards).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import uvloop

from tests.bench.workloads import small_body

REQUESTS = 2000
WARM_UP = 200
HEADERS = {"content-type": "application/json", "authorization": "Bearer bench"}


@dataclass(frozen=True)
class ClientCost:
    name: str
    cpu_ms: float  #: median over rounds, per request
    wall_ms: float
    cpu_range: tuple[float, float]


Send = Callable[[], Awaitable[None]]


async def _time(send: Send, requests: int) -> tuple[float, float]:
    for _ in range(WARM_UP):
        await send()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(requests):
        await send()
    return (
        (time.process_time() - cpu) / requests * 1000,
        (time.perf_counter() - wall) / requests * 1000,
    )


async def _httpx(url: str, body: bytes, requests: int) -> tuple[float, float]:
    import httpx

    async with httpx.AsyncClient(trust_env=False) as client:

        async def send() -> None:
            response = await client.post(url, content=body, headers=HEADERS)
            await response.aread()

        return await _time(send, requests)


async def _httpcore(url: str, body: bytes, requests: int) -> tuple[float, float]:
    import httpcore

    headers = [(k.encode(), v.encode()) for k, v in HEADERS.items()]
    async with httpcore.AsyncConnectionPool() as pool:

        async def send() -> None:
            await pool.request("POST", url, headers=headers, content=body)

        return await _time(send, requests)


async def _aiohttp(url: str, body: bytes, requests: int) -> tuple[float, float]:
    import aiohttp

    async with aiohttp.ClientSession(auto_decompress=False) as session:

        async def send() -> None:
            async with session.post(url, data=body, headers=HEADERS) as response:
                await response.read()

        return await _time(send, requests)


async def _transport(url: str, body: bytes, requests: int) -> tuple[float, float]:
    from proxy.upstream.transport import Transport

    transport = Transport(
        connect_timeout=10, read_timeout=60, max_connections=10, keepalive_expiry=4, trust_env=False
    )
    try:

        async def send() -> None:
            response = await transport.request("POST", url, HEADERS, body)
            await response.read()

        return await _time(send, requests)
    finally:
        await transport.aclose()


CANDIDATES = {
    "httpx": _httpx,
    "httpcore": _httpcore,
    "aiohttp": _aiohttp,
    "compaction-proxy Transport": _transport,
}


def measure(upstream_url: str, rounds: int = 3, requests: int = REQUESTS) -> list[ClientCost]:
    """Each candidate, ``rounds`` times in turn (so drift hits all alike)."""
    url = f"{upstream_url}/chat/completions"
    body = small_body()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in CANDIDATES}
    for _ in range(rounds):
        for name, run in CANDIDATES.items():
            samples[name].append(uvloop.run(run(url, body, requests)))
    costs = []
    for name, values in samples.items():
        cpu = [c for c, _ in values]
        costs.append(
            ClientCost(
                name=name,
                cpu_ms=statistics.median(cpu),
                wall_ms=statistics.median(w for _, w in values),
                cpu_range=(min(cpu), max(cpu)),
            )
        )
    return costs


if __name__ == "__main__":  # ad hoc: python -m tests.bench.clients URL
    import sys

    for cost in measure(sys.argv[1], rounds=1):
        print(f"{cost.name:28s} cpu {cost.cpu_ms:.3f} ms  wall {cost.wall_ms:.3f} ms")
