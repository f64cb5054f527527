"""The window a local server states, through the proxy: asked once per model in the
background, used before the built-in table, kept in the store across a restart.

Proxy and server are real, both on loopback: the proxy's own aiohttp transport
asks the fakes of tests/proxy/upstream/metadata_servers.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from compaction import session_key
from config import load_settings
from proxy.app import create_app
from proxy.session.service import Conversations
from tests.proxy.inprocess import services_of_app
from tests.proxy.servers import serve_in_thread
from tests.proxy.upstream.metadata_servers import (
    MetadataServer,
    llama_cpp_props,
    llama_cpp_python_models,
    overflow_error,
    serving,
)
from tests.synthetic import agent_session

MODEL = "qwen2.5-coder"  # the built-in table says 32,768
TABLE_WINDOW = 32_768
#: Deadline for "the discovery finished" (it takes milliseconds on loopback).
DEADLINE = 10.0


@dataclass
class Proxied:
    server: MetadataServer
    upstream: str
    url: str
    state: Conversations
    http: httpx.Client

    def preview(self, model: str = MODEL) -> dict[str, Any]:
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
        answer = self.http.post(f"{self.url}/compaction/preview", json=body)
        assert answer.status_code == 200, answer.text
        report: dict[str, Any] = answer.json()["report"]
        return report

    def chat(self, messages: list[dict[str, Any]]) -> httpx.Response:
        body = {"model": MODEL, "messages": messages}
        return self.http.post(f"{self.url}/chat/completions", json=body)

    def settled(self) -> None:
        """Wait (to a deadline) until no discovery is under way."""
        deadline = time.monotonic() + DEADLINE
        while len(self.state.upstream.discoveries):
            assert time.monotonic() < deadline, "the discovery never finished"
            time.sleep(0.01)


Start = Callable[..., Proxied]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """A proxy (SQLite store in ``tmp_path``, asking local servers) in front of
    ``server`` (served now, or already at ``upstream``); ``models`` as
    ``[models."…"]``. Started again, it reopens the same file."""
    with ExitStack() as stack:

        def started(server: MetadataServer, upstream: str = "", **models: Any) -> Proxied:
            upstream = upstream or stack.enter_context(serving(server))
            settings = load_settings(
                None,
                upstream={
                    "base_url": upstream + "/v1",
                    "trust_env": False,
                    "discover_windows": "auto",
                },
                store={"url": f"sqlite:///{tmp_path / 'state.db'}"},
                compaction={"summarizer": "extractive"},
                models=models,
            )
            app: Any = create_app(settings)
            url = stack.enter_context(serve_in_thread(app))
            http = stack.enter_context(httpx.Client(timeout=30))
            return Proxied(server, upstream, url + "/v1", _state_of(app), http)

        yield started


def _state_of(app: Any) -> Conversations:
    """The conversations service of the running app."""
    return services_of_app(app).conversations


def _llama_cpp(n_ctx: int = 8192, slots: int = 1) -> MetadataServer:
    return MetadataServer({("GET", "/props"): (200, llama_cpp_props(n_ctx, total_slots=slots))})


def test_the_window_a_llama_cpp_server_states_replaces_the_tables_after_the_first_request(
    start: Start,
) -> None:
    proxied = start(_llama_cpp(n_ctx=8192, slots=1))
    # The request that sets the question off is served on the table's window, unwaiting.
    first = proxied.preview()
    assert (first["context_window"], first["window_source"]) == (TABLE_WINDOW, "table")
    proxied.settled()
    later = proxied.preview()
    assert (later["context_window"], later["window_source"]) == (8192, "server")
    assert later["input_limit"] < first["input_limit"]
    assert proxied.server.asked("/props") == 1
    models = proxied.state.models
    slots = {key: models.get(key).slots for key in models if models.get(key).slots}
    assert slots == {f"{proxied.upstream}/v1\x1f{MODEL}": 1}


def test_a_conversation_too_long_for_the_stated_window_is_compacted_for_it(start: Start) -> None:
    proxied = start(_llama_cpp(n_ctx=8192))
    proxied.preview()
    proxied.settled()
    conversation = agent_session(seed=5, steps=30, output_chars=1500)
    answer = proxied.chat(conversation)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-compaction-stage"] != "none"
    assert int(answer.headers["x-compaction-tokens-before"]) > 8192
    assert int(answer.headers["x-compaction-tokens-after"]) < 8192


def test_a_server_stating_nothing_is_asked_once_and_the_table_serves_without_an_error(
    start: Start,
) -> None:
    server = MetadataServer({("GET", "/v1/models"): (200, llama_cpp_python_models(MODEL))})
    proxied = start(server)
    assert proxied.chat([{"role": "user", "content": "hi"}]).status_code == 200
    proxied.settled()
    asked = len(server.probes)
    assert asked == 5  # each server's question, once
    for _ in range(3):
        answer = proxied.chat([{"role": "user", "content": "hi again"}])
        assert answer.status_code == 200
        assert proxied.preview()["window_source"] == "table"
    assert len(proxied.state.upstream.discoveries) == 0
    assert len(server.probes) == asked  # not asked again on every request


def test_a_window_set_in_the_configuration_wins_over_the_servers(start: Start) -> None:
    proxied = start(_llama_cpp(n_ctx=8192), **{MODEL: {"context_window": 20_000}})
    proxied.preview()
    proxied.settled()
    assert proxied.server.asked("/props") == 1
    report = proxied.preview()
    assert (report["context_window"], report["window_source"]) == (20_000, "override")


def test_garbage_from_the_server_is_ignored_and_the_table_serves(start: Start) -> None:
    server = MetadataServer(
        {
            ("GET", "/props"): (200, b"\x00\xff{{not json"),
            ("GET", "/v1/models"): (
                200,
                b'{"data": [{"id": "qwen2.5-coder", "max_model_len": -3}]}',
            ),
            ("GET", "/api/v0/models"): (500, b"oops"),
            ("POST", "/api/show"): (200, b'{"parameters": "num_ctx 1e9"}'),
            ("GET", "/api/ps"): (
                200,
                b'{"models": [{"name": "qwen2.5-coder", "context_length": 7}]}',
            ),
        }
    )
    proxied = start(server)
    assert proxied.chat([{"role": "user", "content": "hi"}]).status_code == 200
    proxied.settled()
    report = proxied.preview()
    assert (report["context_window"], report["window_source"]) == (TABLE_WINDOW, "table")
    assert all(proxied.state.models.get(key).window_stated is None for key in proxied.state.models)


def test_a_restarted_proxy_uses_the_stored_window_at_once_and_asks_again_to_stay_current(
    start: Start,
) -> None:
    server = _llama_cpp(n_ctx=8192)
    first = start(server)
    first.preview()
    first.settled()
    assert first.preview()["window_source"] == "server"
    # The server restarted with another -c, and a new proxy on the same store file.
    server.answers[("GET", "/props")] = (200, llama_cpp_props(4096))
    second = start(server, upstream=first.upstream)
    report = second.preview()
    assert (report["context_window"], report["window_source"]) == (8192, "server")
    second.settled()
    assert server.asked("/props") == 2  # once by each process
    assert second.preview()["context_window"] == 4096


def test_a_smaller_window_taught_by_an_overflow_wins_over_the_stated_one(start: Start) -> None:
    proxied = start(_llama_cpp(n_ctx=8192))
    proxied.preview()
    proxied.settled()
    assert proxied.preview()["window_source"] == "server"
    proxied.server.chat_answers.append(overflow_error(6000, 7100))
    conversation = agent_session(seed=6, steps=16, output_chars=1200)
    answer = proxied.chat(conversation)
    assert answer.status_code == 200, answer.text  # retried, smaller
    report = proxied.preview()
    assert (report["context_window"], report["window_source"]) == (6000, "learned")


def test_a_larger_window_taught_by_an_overflow_does_not_replace_the_stated_one(
    start: Start,
) -> None:
    proxied = start(_llama_cpp(n_ctx=8192))
    proxied.preview()
    proxied.settled()
    proxied.server.chat_answers.append(overflow_error(16000, 17000))
    proxied.chat([{"role": "user", "content": "hi"}])
    report = proxied.preview()
    assert (report["context_window"], report["window_source"]) == (8192, "server")


def test_the_dashboard_names_the_server_as_the_source_of_the_window(start: Start) -> None:
    proxied = start(_llama_cpp(n_ctx=8192))
    proxied.preview()
    proxied.settled()
    messages = agent_session(seed=9, steps=6, task="Dashboard: whose window")
    assert proxied.chat(messages).status_code == 200
    root = proxied.url.removesuffix("/v1")
    page = _wait_for(proxied.http, f"{root}/ui/sessions/{session_key(messages)}", "window-source")
    source = page.split('id="window-source"', 1)[1].split("</span>", 1)[0]
    assert "window stated by the server" in source
    assert "8k" in page.split('id="window-source"', 1)[0].rsplit('class="card"', 1)[1]


def _wait_for(http: httpx.Client, url: str, text: str) -> str:
    """The page at ``url`` once it says ``text`` (the figures are written in batches)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        page = http.get(url).text
        if text in page or time.monotonic() > deadline:
            return page
        time.sleep(0.05)
