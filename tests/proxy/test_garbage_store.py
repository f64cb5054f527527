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

import signal
import time
from pathlib import Path

import pytest

from config import load_settings
from proxy.app import shutdown_seconds
from tests.proxy.servers import FakeUpstream, ProxyProcess
from tests.proxy.state.stores.fake_redis import NIL, NUMBER, FakeRedis
from tests.proxy.state.stores.outage import LONG, SHORT, answered, chat, healthz, process_env

#: The proxy's keep-alive round comes every third of this (seconds): short,
#: so the test waits one out in about a second.
HEARTBEAT_SECONDS = 3.0
#: Commands the idle proxy may send over one keep-alive round and a little
#: more (two rounds at most): a probe, a heartbeat and a look for interrupted
#: compactions, each a command or two, and a reconnection's handshake. A loop
#: spinning on the answers sent tens of thousands a second.
IDLE_COMMANDS = 20


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
            **process_env(redis.url),
            "COMPACTION_PROXY_STORE__HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
        }
        proxy = ProxyProcess(upstream_url, env, str(tmp_path))
        try:
            answered(chat(proxy.url, SHORT), "none")
            answered(chat(proxy.url, LONG), "condensed")  # compacted, nothing stored
            answered(chat(proxy.url, [*LONG, {"role": "user", "content": "and?"}]), "condensed")

            health = healthz(proxy.url)
            assert health["status"] == "degraded"
            assert health["store"]["error"] == "GarbledReply"

            if reply == NIL:  # the answers that made a transaction spin
                time.sleep(2)  # the figures of those requests written, or given up on
                before = redis.commands
                time.sleep(HEARTBEAT_SECONDS / 3 + 0.5)  # one keep-alive round, and more
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
