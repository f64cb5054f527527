"""A Redis that answers, but answers garbage, is a store that is down.

The real proxy (``compaction-proxy serve``, its own process) in front of a
scripted upstream, its store a fake Redis on loopback that completes the
handshake and then answers nil — or an integer — to every command. Requests
are served, compacting ones too (nothing stored), /healthz says degraded,
the idle proxy sends the store no more than its keep-alive round asks for
(no loop spins on the answers), and SIGTERM ends it within its documented
shutdown time.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from config import load_settings
from proxy.app import HEARTBEAT_TTL, shutdown_seconds
from tests.proxy.servers import FakeUpstream, ProxyProcess
from tests.proxy.state.stores.fake_redis import NIL, NUMBER, FakeRedis
from tests.synthetic import agent_session

MODELS = {"gpt-4o": {"context_window": 8192}}
#: Condensed on an 8k window (as in test_store_faults.py).
LONG = agent_session(seed=31, steps=120)
SHORT = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "still there?"},
]
#: Commands the idle proxy may send over one keep-alive round and a little
#: more: a probe, a heartbeat and a look for interrupted compactions, each a
#: command or two, and a reconnection's handshake. A loop spinning on the
#: answers sent tens of thousands a second.
IDLE_COMMANDS = 20


def _chat(url: str, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"authorization": "Bearer sk-test"},
        timeout=60,
    )


def _answered(response: httpx.Response, stage: str) -> None:
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-stage"] == stage
    body = response.json()
    assert body["choices"][0]["message"]["role"] == "assistant"


def _stop(proxy: ProxyProcess, within: float) -> tuple[int, str]:
    """SIGTERM, then the exit status and the log, waited for at most ``within``."""
    proxy.process.send_signal(signal.SIGTERM)
    try:
        _, stderr = proxy.process.communicate(timeout=within)
    except BaseException:
        proxy.process.kill()
        proxy.process.communicate(timeout=30)
        raise
    return proxy.process.returncode, stderr.decode(errors="replace")


@pytest.mark.parametrize("reply", [NIL, NUMBER], ids=["nil", "integer"])
def test_a_redis_answering_garbage_is_treated_as_down(
    fake: tuple[FakeUpstream, str], tmp_path: Path, reply: bytes
) -> None:
    _, upstream_url = fake
    with FakeRedis.in_thread(reply=reply) as redis:
        env = {
            "COMPACTION_PROXY_STORE__URL": redis.url,
            "COMPACTION_PROXY_MODELS": json.dumps(MODELS),
        }
        proxy = ProxyProcess(upstream_url, env, str(tmp_path))
        try:
            _answered(_chat(proxy.url, SHORT), "none")
            _answered(_chat(proxy.url, LONG), "condensed")  # compacted, nothing stored
            _answered(_chat(proxy.url, [*LONG, {"role": "user", "content": "and?"}]), "condensed")

            health = httpx.get(proxy.url.removesuffix("/v1") + "/healthz", timeout=10)
            assert health.status_code == 200  # degraded still serves
            assert health.json()["status"] == "degraded"
            assert health.json()["store"]["error"] == "GarbledReply"

            if reply == NIL:  # the answers that made a transaction spin
                time.sleep(2)  # the figures of those requests written, or given up on
                before = redis.commands
                time.sleep(HEARTBEAT_TTL / 3 + 1)  # one keep-alive round, and more
                assert redis.commands - before <= IDLE_COMMANDS, redis.names
        except BaseException:
            proxy.stop(kill=True)
            raise
        # Nothing is open: the shutdown is the app's own, bounded whatever the store does.
        settings = load_settings(None)
        status, log = _stop(proxy, within=shutdown_seconds(settings) + 5)
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly.
    assert status in (0, -signal.SIGTERM), log
    assert "Traceback" not in log, log
