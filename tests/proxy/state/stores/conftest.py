"""Backends for the shared contract suite, and a real redis-server for the Redis cases.

The Redis server is ``$COMPACTION_PROXY_TEST_REDIS_URL`` if set, else a
``redis-server`` started here on a free loopback port (no persistence), else
the Redis cases are skipped with the reason. Every test gets its own key prefix.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from config.settings import DEFAULT_STORE_TIMEOUT_SECONDS
from proxy.state.stores import ResilientStore, Store, open_store

REDIS_URL_ENV = "COMPACTION_PROXY_TEST_REDIS_URL"
#: "resilient" is SQLite behind the ResilientStore the app puts in front of
#: every backend: the wrapper must keep the whole contract.
BACKENDS = ("memory", "sqlite", "redis", "resilient")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_redis(binary: str, port: int) -> subprocess.Popen[bytes]:
    """``redis-server`` on loopback ``port``, without persistence, answering."""
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(f"redis://127.0.0.1:{port}/0", process)
    except BaseException:
        process.kill()
        process.wait(timeout=10)
        raise
    return process


def _wait_for(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    client = redis.Redis.from_url(url)
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str | None]:
    """A Redis URL for the tests, or ``None`` with the reason in ``redis_skip_reason``."""
    configured = os.environ.get(REDIS_URL_ENV)
    if configured:
        yield configured
        return
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    port = free_port()
    process = start_redis(binary, port)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


def require_redis(url: str | None) -> str:
    if url is None:
        pytest.skip(f"no Redis: set {REDIS_URL_ENV} or install redis-server")
    return url


@dataclass
class Backend:
    """Opens stores of one kind on one shared place (file, key prefix)."""

    kind: str
    url: str
    key_prefix: str
    opened: list[Store] = field(default_factory=list)

    @property
    def shared(self) -> bool:
        """Whether two stores opened here see the same data (not for memory://)."""
        return self.kind != "memory"

    @property
    def expires(self) -> bool:
        """Whether old records expire by themselves (Redis TTLs) instead of by purge()."""
        return self.kind == "redis"

    def open(self, **options: Any) -> Store:
        store = open_store(self.url, key_prefix=self.key_prefix, **options)
        if self.kind == "resilient":
            store = ResilientStore(store, timeout=DEFAULT_STORE_TIMEOUT_SECONDS)
        self.opened.append(store)
        return store

    async def close_all(self) -> None:
        for store in self.opened:
            await store.close()


@pytest.fixture(params=BACKENDS)
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str | None, anyio_backend: str
) -> AsyncIterator[Backend]:
    kind: str = request.param
    prefix = f"test-{uuid.uuid4().hex}:"
    if kind == "memory":
        url = "memory://"
    elif kind in ("sqlite", "resilient"):
        url = f"sqlite://{tmp_path / 'state' / 'state.db'}"
    else:
        url = require_redis(redis_url)
    made = Backend(kind, url, prefix)
    try:
        yield made
    finally:
        await made.close_all()
        if kind == "redis":
            await _delete_prefix(url, prefix)


async def _delete_prefix(url: str, prefix: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.open()
