"""A minimal HTTP/1.1 keep-alive client on asyncio (uvloop), for every measurement.

One client for all targets, so whatever it costs is the same on the direct
connection and through a proxy and cancels out of every difference. It is
deliberately small: a request is one prebuilt ``bytes``, a response is read
with ``Content-Length`` or chunked framing. httpx costs ~0.3 ms of Python per
request on the client side, which would cap the direct throughput on the shared
core and add noise to every percentile; this costs a few tens of µs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")

AUTH = "Bearer sk-bench"


@dataclass(frozen=True)
class Target:
    """Where one side of a comparison listens: ``direct``, ``compaction-proxy``, ``litellm``."""

    name: str
    host: str
    port: int
    prefix: str = "/v1"

    def request(self, path: str, body: bytes) -> bytes:
        """A complete ``POST`` request for ``prefix + path``."""
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\n"
            f"Host: {self.host}:{self.port}\r\n"
            f"Authorization: {AUTH}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float


@dataclass
class Stream:
    """One streamed answer as the client saw it."""

    status: int
    first_frame: float  #: seconds from sending the request to the first complete frame
    gaps: list[float] = field(default_factory=list)  #: seconds between consecutive frames
    frames: int = 0  #: data frames other than ``[DONE]``
    done: bool = False  #: ``data: [DONE]`` arrived


class Connection:
    """One keep-alive connection to a target."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        await self._open()
        return self

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(
                self.target.host, self.target.port, limit=1 << 22
            )
        return self._reader, self._writer

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None

    async def call(self, request: bytes) -> Reply:
        reader, writer = await self._open()
        started = time.perf_counter()
        writer.write(request)
        status, headers = await _read_head(reader)
        body = b"".join([chunk async for chunk in _read_body(reader, headers)])
        elapsed = time.perf_counter() - started
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return Reply(status, headers, body, elapsed)

    async def stream(self, request: bytes) -> Stream:
        """Send a streaming request; time every SSE frame as it completes."""
        reader, writer = await self._open()
        started = time.perf_counter()
        writer.write(request)
        status, headers = await _read_head(reader)
        result = Stream(status, first_frame=0.0)
        buffer = b""
        last = 0.0
        async for chunk in _read_body(reader, headers):
            now = time.perf_counter()
            buffer += chunk
            *frames, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
            for frame in frames:
                if not frame.startswith(b"data:"):
                    continue  # comments and keep-alives
                if frame[5:].strip() == b"[DONE]":
                    result.done = True
                    continue
                if result.frames == 0:
                    result.first_frame = now - started
                else:
                    result.gaps.append(now - last)
                last = now
                result.frames += 1
        await self.close()  # a stream's connection is not reused: same cost on every side
        return result


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> Any:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        yield await reader.read()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a fresh uvloop event loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


async def sequential(target: Target, request: bytes, count: int, warmup: int = 20) -> list[Reply]:
    """``count`` requests one after the other on one connection (concurrency 1)."""
    connection = Connection(target)
    try:
        for _ in range(warmup):
            await connection.call(request)
        return [await connection.call(request) for _ in range(count)]
    finally:
        await connection.close()


@dataclass(frozen=True)
class Load:
    """A closed-loop run: ``concurrency`` connections each sending back to back."""

    requests: int
    seconds: float
    latencies: list[float]
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


async def closed_loop(
    target: Target,
    next_request: Callable[[], bytes],
    *,
    concurrency: int,
    seconds: float | None = None,
    total: int | None = None,
    warmup: float = 0.2,
) -> Load:
    """Keep ``concurrency`` requests in flight for ``seconds`` (or until ``total`` are sent).

    Latencies and the count cover only the measured span, after ``warmup``.
    """
    latencies: list[float] = []
    errors = 0
    sent = 0
    begin = time.perf_counter()
    measure_from = begin + (warmup if seconds is not None else 0.0)
    stop_at = measure_from + seconds if seconds is not None else float("inf")

    async def worker() -> None:
        nonlocal errors, sent
        connection = Connection(target)
        try:
            while time.perf_counter() < stop_at and (total is None or sent < total):
                sent += 1
                reply = await connection.call(next_request())
                if reply.status != 200:
                    errors += 1
                if time.perf_counter() - reply.seconds >= measure_from:
                    latencies.append(reply.seconds)
        finally:
            await connection.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - (measure_from if seconds is not None else begin)
    return Load(len(latencies), elapsed, latencies, errors)


async def concurrent_streams(target: Target, request: bytes, count: int) -> list[Stream]:
    """``count`` streams started at once, each on its own connection.

    The connections are opened first, so the time to the first frame counts
    the request only, as on a client's kept-alive connection.
    """
    connections = await asyncio.gather(*(Connection(target).open() for _ in range(count)))
    return list(await asyncio.gather(*(c.stream(request) for c in connections)))
