"""proxy.upstream.discovery: each server's answer read, against loopback fakes of
their documented metadata endpoints (tests/proxy/upstream/metadata_servers.py),
and the discoveries kept off the request path."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import orjson
import pytest

from proxy.upstream.discovery import (
    MAX_ANSWER_BYTES,
    Discoveries,
    ServerFacts,
    discover,
    is_local,
    parse_llama_props,
    parse_lmstudio_models,
    parse_model_listing,
    parse_ollama_ps,
    parse_ollama_show,
    server_root,
)
from proxy.upstream.transport import Transport
from tests.proxy.upstream.metadata_servers import (
    MetadataServer,
    llama_cpp_models,
    llama_cpp_props,
    llama_cpp_python_models,
    lmstudio_models,
    ollama_ps,
    ollama_show,
    openrouter_models,
    serving,
    vllm_models,
)

MODEL = "qwen2.5-coder"


def _discover(
    server: MetadataServer, model: str = MODEL, timeout: float = 5.0, suffix: str = "/v1"
) -> ServerFacts | None:
    async def run() -> ServerFacts | None:
        transport = Transport(
            connect_timeout=2,
            read_timeout=timeout,
            max_connections=4,
            keepalive_expiry=1,
            trust_env=False,
        )
        try:
            return await discover(
                transport,
                url + suffix,
                model,
                {"authorization": "Bearer sk-local"},
                timeout=timeout,
            )
        finally:
            await transport.aclose()

    with serving(server) as url:
        return asyncio.run(run())


# --- each server, as documented -------------------------------------------------------


def test_llama_cpp_states_a_slots_window_and_its_slots_at_props() -> None:
    server = MetadataServer({("GET", "/props"): (200, llama_cpp_props(8192, total_slots=1))})
    facts = _discover(server)
    assert facts == ServerFacts(8192, 1, "llama.cpp /props")
    # The first question answered it: nothing else was asked, with the caller's key.
    assert [s.path for s in server.probes] == ["/props"]
    assert server.probes[0].headers["authorization"] == "Bearer sk-local"


def test_llama_cpps_trained_window_in_its_model_listing_is_not_taken_for_the_served_one() -> None:
    server = MetadataServer({("GET", "/v1/models"): (200, llama_cpp_models(MODEL, 32768))})
    assert _discover(server) is None


def test_vllm_states_max_model_len_in_its_model_listing() -> None:
    server = MetadataServer({("GET", "/v1/models"): (200, vllm_models(MODEL, 16384))})
    facts = _discover(server)
    assert facts is not None and facts.window == 16384 and facts.slots is None


def test_an_openrouter_style_listing_gives_the_smaller_of_the_models_and_its_providers() -> None:
    listing = openrouter_models("qwen/qwen-2.5-coder-32b-instruct", 131072, 32768)
    facts = parse_model_listing(listing, "qwen/qwen-2.5-coder-32b-instruct")
    assert facts is not None and facts.window == 32768


def test_llama_cpp_python_states_nothing_and_every_question_is_asked_once() -> None:
    server = MetadataServer({("GET", "/v1/models"): (200, llama_cpp_python_models(MODEL))})
    assert _discover(server) is None
    assert [(s.method, s.path) for s in server.probes] == [
        ("GET", "/props"),
        ("GET", "/v1/models"),
        ("GET", "/api/v0/models"),
        ("POST", "/api/show"),
        ("GET", "/api/ps"),
    ]


def test_lm_studio_states_the_loaded_context_length_not_the_models_maximum() -> None:
    loaded = MetadataServer(
        {("GET", "/api/v0/models"): (200, lmstudio_models(MODEL, loaded=4096, max_length=32768))}
    )
    facts = _discover(loaded)
    assert facts is not None and facts.window == 4096
    # Not loaded: its maximum is not what it will load the model with.
    unloaded = lmstudio_models(MODEL, loaded=None, max_length=32768)
    assert parse_lmstudio_models(unloaded, MODEL) is None


def test_ollama_states_num_ctx_when_the_modelfile_sets_it() -> None:
    server = MetadataServer({("POST", "/api/show"): (200, ollama_show(num_ctx=16384))})
    facts = _discover(server)
    assert facts is not None and facts.window == 16384
    show = next(s for s in server.probes if s.path == "/api/show")
    assert orjson.loads(show.body) == {"model": MODEL}


def test_ollama_without_num_ctx_states_the_loaded_models_context_never_the_trained_one() -> None:
    unset = ollama_show(num_ctx=None, trained=32768)
    assert parse_ollama_show(unset) is None
    server = MetadataServer(
        {
            ("POST", "/api/show"): (200, unset),
            ("GET", "/api/ps"): (200, ollama_ps(MODEL, 4096)),
        }
    )
    facts = _discover(server)
    assert facts is not None and facts.window == 4096
    # Not loaded (nothing in /api/ps): nothing stated.
    assert parse_ollama_ps(orjson.dumps({"models": []}), MODEL) is None


def test_the_server_root_is_the_upstream_url_without_its_v1() -> None:
    assert server_root("http://127.0.0.1:11434/v1") == "http://127.0.0.1:11434"
    assert server_root("http://127.0.0.1:8080/v1/") == "http://127.0.0.1:8080"
    assert server_root("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    server = MetadataServer({("GET", "/props"): (200, llama_cpp_props(4096))})
    facts = _discover(server, suffix="")
    assert facts is not None and facts.window == 4096


# --- a hostile or broken server ------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        b"\x00\xffnot json",
        b"[1, 2, 3]",
        b'{"default_generation_settings": "n_ctx"}',
        b'{"default_generation_settings": {"n_ctx": -8192}}',
        b'{"default_generation_settings": {"n_ctx": 99999999999999999999999999}}',
        b'{"default_generation_settings": {"n_ctx": 8192.5}}',
        b'{"default_generation_settings": {"n_ctx": "8192"}}',
        b'{"default_generation_settings": {"n_ctx": true}}',
        b'{"default_generation_settings": {"n_ctx": 16}}',
        b'{"total_slots": -1}',
        b'{"total_slots": 1000000}',
    ],
)
def test_a_props_answer_without_a_plausible_figure_states_nothing(answer: bytes) -> None:
    assert parse_llama_props(answer) is None


@pytest.mark.parametrize(
    "listing",
    [
        b'{"data": "qwen"}',
        b'{"data": [1, "x", null]}',
        b'{"data": [{"id": "qwen2.5-coder", "max_model_len": -1}]}',
        b'{"data": [{"id": "qwen2.5-coder", "max_model_len": 1e300}]}',
        b'{"data": [{"id": "other", "max_model_len": 8192}, {"id": "b", "max_model_len": 4096}]}',
    ],
)
def test_a_listing_without_a_plausible_window_for_the_model_states_nothing(listing: bytes) -> None:
    assert parse_model_listing(listing, MODEL) is None


def test_a_num_ctx_too_long_to_be_a_number_is_not_read() -> None:
    raw = orjson.dumps({"parameters": "num_ctx 99999999999999999999"})
    assert parse_ollama_show(raw) is None


def test_an_answer_past_the_size_bound_is_cut_and_states_nothing() -> None:
    padding = b" " * (MAX_ANSWER_BYTES + 10)
    huge = b'{"pad": "' + padding + b'", "default_generation_settings": {"n_ctx": 8192}}'
    server = MetadataServer({("GET", "/props"): (200, huge)})
    assert _discover(server) is None


def test_a_server_that_does_not_answer_costs_one_bounded_wait_and_states_nothing() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    port = listener.getsockname()[1]

    async def run() -> ServerFacts | None:
        transport = Transport(
            connect_timeout=2,
            read_timeout=30,
            max_connections=4,
            keepalive_expiry=1,
            trust_env=False,
        )
        try:
            return await asyncio.wait_for(
                discover(transport, f"http://127.0.0.1:{port}/v1", MODEL, {}, timeout=0.3),
                timeout=10,  # a deadline for "it ended", far past the bound it keeps
            )
        finally:
            await transport.aclose()

    try:
        assert asyncio.run(run()) is None
    finally:
        listener.close()


def test_a_server_that_is_down_is_asked_once_and_states_nothing() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now

    async def run() -> ServerFacts | None:
        transport = Transport(
            connect_timeout=2,
            read_timeout=2,
            max_connections=4,
            keepalive_expiry=1,
            trust_env=False,
        )
        try:
            return await discover(transport, f"http://127.0.0.1:{port}/v1", MODEL, {}, timeout=5)
        finally:
            await transport.aclose()

    assert asyncio.run(run()) is None


# --- which servers are asked -----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8080/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://192.168.1.20:1234/v1", True),
        ("http://10.0.0.5:8000/v1", True),
        ("http://ollama:11434/v1", True),
        ("http://host.docker.internal:8080/v1", True),
        ("http://gpu-box.local:8000/v1", True),
        ("https://api.openai.com/v1", False),
        ("https://openrouter.ai/api/v1", False),
        ("http://8.8.8.8/v1", False),
    ],
)
def test_auto_asks_only_servers_on_this_machine_or_network(url: str, local: bool) -> None:
    assert is_local(url) is local


# --- off the request path --------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _asker(outcomes: list[bool], calls: list[str], key: str) -> Callable[[], Awaitable[bool]]:
    async def ask() -> bool:
        calls.append(key)
        return outcomes.pop(0)

    return ask


def test_a_key_is_asked_once_when_the_server_answered() -> None:
    async def run() -> list[str]:
        calls: list[str] = []
        discoveries = Discoveries(max_keys=10, clock=_Clock())
        assert discoveries.start("k", _asker([True], calls, "k"))
        assert not discoveries.start("k", _asker([True], calls, "k"))  # under way
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not discoveries.start("k", _asker([True], calls, "k"))  # answered
        return calls

    assert asyncio.run(run()) == ["k"]


def test_a_silent_server_is_asked_again_only_after_the_retry_time() -> None:
    async def run() -> list[str]:
        calls: list[str] = []
        clock = _Clock()
        discoveries = Discoveries(max_keys=10, retry_after=600, clock=clock)
        outcomes = [False, True]
        assert discoveries.start("k", _asker(outcomes, calls, "k"))
        for _ in range(3):
            await asyncio.sleep(0)
        clock.now += 599
        assert not discoveries.start("k", _asker(outcomes, calls, "k"))
        clock.now += 2
        assert discoveries.start("k", _asker(outcomes, calls, "k"))
        for _ in range(3):
            await asyncio.sleep(0)
        return calls

    assert asyncio.run(run()) == ["k", "k"]


def test_no_more_than_max_running_discoveries_run_at_once_whatever_names_clients_invent() -> None:
    async def run() -> tuple[int, int]:
        release = asyncio.Event()
        running = 0

        async def slow() -> bool:
            nonlocal running
            running += 1
            await release.wait()
            return False

        discoveries = Discoveries(max_keys=100, max_running=2)
        started = sum(discoveries.start(f"model-{i}", slow) for i in range(50))
        await asyncio.sleep(0)
        at_once = running
        release.set()
        await discoveries.close()
        return started, at_once

    assert asyncio.run(run()) == (2, 2)


def test_the_outcomes_remembered_are_bounded_the_oldest_forgotten_first() -> None:
    async def run() -> list[str]:
        calls: list[str] = []
        discoveries = Discoveries(max_keys=2, max_running=10)
        for key in ("a", "b", "c"):
            discoveries.start(key, _asker([True], calls, key))
            for _ in range(3):
                await asyncio.sleep(0)
        # "a" was forgotten: asked again; "c" is remembered.
        discoveries.start("a", _asker([True], calls, "a"))
        discoveries.start("c", _asker([True], calls, "c"))
        for _ in range(3):
            await asyncio.sleep(0)
        return calls

    assert asyncio.run(run()) == ["a", "b", "c", "a"]


def test_a_discovery_that_fails_is_logged_and_remembered_as_silent() -> None:
    async def run() -> bool:
        async def broken() -> bool:
            raise RuntimeError("a bug")

        discoveries = Discoveries(max_keys=10, clock=_Clock())
        discoveries.start("k", broken)
        for _ in range(3):
            await asyncio.sleep(0)
        return discoveries.start("k", broken)

    assert asyncio.run(run()) is False
