"""The store is asked for a session's settings only where they can change
what the proxy does (compaction.steering_can_matter): a small request with no
checkpoint, most of what a proxy forwards, costs no settings read."""

from __future__ import annotations

from typing import Any

from compaction import session_key
from proxy.state.stores import MemoryStore, SessionSettings
from tests.proxy.conftest import AppFactory
from tests.proxy.session.conftest import figures_written
from tests.synthetic import agent_session

MODELS = {"gpt-4o": {"context_window": 8192, "precompute_share": 0}}
KEY = {"authorization": "Bearer sk-alice-0123456789"}


class CountingStore(MemoryStore):
    """A memory store counting the reads of session settings."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings_reads = 0

    async def session_settings(self, session: str, owner: str) -> SessionSettings:
        self.settings_reads += 1
        return await super().session_settings(session, owner)


def _chat(proxy: Any, messages: list[dict[str, Any]]) -> dict[str, str]:
    body = {"model": "gpt-4o", "messages": messages}
    response = proxy.http.post("/v1/chat/completions", json=body, headers=KEY)
    assert response.status_code == 200, response.text
    return dict(response.headers)


def test_a_small_request_reads_no_settings_and_one_over_the_trigger_reads_them(
    start_app: AppFactory,
) -> None:
    store = CountingStore()
    proxy = start_app(models=MODELS, store=store)
    messages = agent_session(seed=7, steps=60, task="Settings only where they matter.")
    assert _chat(proxy, messages[:2])["x-compaction-stage"] == "none"
    assert store.settings_reads == 0

    figures_written(proxy)  # a session is steered once the proxy has seen it
    session = session_key(messages)
    answer = proxy.http.put(
        f"/v1/compaction/sessions/{session}/settings", json={"enabled": False}, headers=KEY
    )
    assert answer.status_code == 200, answer.text
    store.settings_reads = 0
    # Over the trigger, the settings are read — and honoured: switched off.
    assert _chat(proxy, messages)["x-compaction-stage"] == "none"
    assert store.settings_reads == 1
