"""What the upstream server says it serves: its context window, and its slots.

A local server's window is whatever it was started with (``llama-server -c
8192``), often a fraction of the model's trained window that the built-in
table knows. Most local servers say it, each in its own place; this module
asks them, in order of cheapness, and stops at the first that states it:

* llama.cpp ``llama-server``: ``GET {root}/props`` —
  ``default_generation_settings.n_ctx`` (a slot's window) and ``total_slots``;
* vLLM, OpenRouter: ``GET {base}/models`` — ``max_model_len``, or
  ``context_length`` (and its top provider's);
* LM Studio: ``GET {root}/api/v0/models`` — ``loaded_context_length``;
* Ollama: ``POST {root}/api/show`` — ``num_ctx`` in ``parameters``; else
  ``GET {root}/api/ps`` — the loaded model's ``context_length``.

``{base}`` is the upstream URL, ``{root}`` the same without its ``/v1``.
Only figures that state the window *served* are read, never the model's
trained one: llama.cpp's ``meta.n_ctx_train``, LM Studio's
``max_context_length`` and Ollama's ``model_info["<arch>.context_length"]``
are what the model could hold, while the server serves what it was loaded
with (Ollama's default ``num_ctx`` is 2,048 to 4,096 or more by version and
memory, and ``OLLAMA_CONTEXT_LENGTH``, which its API does not show; LM
Studio loads a model with its own default). Trusting them would budget for
a window the server then cuts silently. llama-cpp-python states nothing (its
``/v1/models`` lists names only).

The server is not trusted further than its figures: every answer is read to
at most :data:`MAX_ANSWER_BYTES`, every figure must be an integer within
:data:`compaction.WINDOW_BOUNDS` (slots within :data:`MAX_SLOTS`), and
anything else — garbage, a huge or negative number, a string — is ignored.

:class:`Discoveries` keeps the questions off the request path: one task per
(upstream, model) at a time, at most :data:`MAX_RUNNING` at once, a server
that stated nothing asked again only after :data:`RETRY_SILENT_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec
from urllib.parse import urlsplit

import orjson

from compaction import WINDOW_BOUNDS
from proxy.upstream.transport import ConnectFailed, Transport, TransportError

logger = logging.getLogger(__name__)

#: An answer is read to this many bytes at most. The largest one asked for is
#: a hosted listing of every model (OpenRouter's, a few hundred entries with
#: their descriptions); a local server's answers are a few kilobytes.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
#: More slots than this is a misreading: a server splits its memory among them.
MAX_SLOTS = 1024
#: Discoveries running at once: model names are the clients', so a client
#: inventing names must not turn each request into several to the server.
MAX_RUNNING = 2
#: A server that stated nothing is asked again after this long: it may have
#: been loading the model (Ollama and LM Studio state a window once it is loaded).
RETRY_SILENT_SECONDS = 600.0
#: Host names that stand for this machine or its network (besides loopback,
#: private and link-local addresses and names without a dot).
_LOCAL_SUFFIXES = (".local", ".internal", ".localhost", ".lan", ".home.arpa")
_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d{1,9})\s*$", re.MULTILINE)
_P = ParamSpec("_P")


@dataclass(frozen=True)
class ServerFacts:
    """What one server stated about one model."""

    #: The window one request may fill, in the server's tokens (``None``: not stated).
    window: int | None
    #: How many requests it serves at once (llama.cpp's slots; ``None``: not stated).
    slots: int | None = None
    #: Which answer said it, for the log: ``"llama.cpp /props"``, …
    source: str = ""


# --- reading the answers ---------------------------------------------------------


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _window(value: Any) -> int | None:
    """A plausible window, or ``None`` (a bool is an int to Python, not here)."""
    low, high = WINDOW_BOUNDS
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    return None


def _slots(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_SLOTS:
        return value
    return None


def _entries(answer: Any, key: str) -> list[dict[str, Any]]:
    """The objects listed under ``key`` of a JSON object (others skipped)."""
    listed = answer.get(key) if isinstance(answer, dict) else None
    if not isinstance(listed, list):
        return []
    return [entry for entry in listed if isinstance(entry, dict)]


def _named(entries: list[dict[str, Any]], model: str, *fields: str) -> dict[str, Any] | None:
    """The entry for ``model``: named exactly, else case-insensitively, else
    the only one listed (a server of one model, which serves it under any name)."""
    for exact in (True, False):
        for entry in entries:
            for name in (entry.get(field) for field in fields):
                if isinstance(name, str) and (
                    name == model if exact else name.lower() == model.lower()
                ):
                    return entry
    return entries[0] if len(entries) == 1 else None


def parse_llama_props(raw: bytes) -> ServerFacts | None:
    """llama.cpp's ``GET /props``: ``default_generation_settings.n_ctx`` is the
    window of one slot — the server's ``-c`` divided among its ``--parallel``
    slots, or all of it with a unified KV cache — which is what one request
    may fill; ``total_slots`` how many it serves at once."""
    answer = _json(raw)
    if not isinstance(answer, dict):
        return None
    settings = answer.get("default_generation_settings")
    window = _window(settings.get("n_ctx")) if isinstance(settings, dict) else None
    slots = _slots(answer.get("total_slots"))
    if window is None and slots is None:
        return None
    return ServerFacts(window, slots, "llama.cpp /props")


def parse_model_listing(raw: bytes, model: str) -> ServerFacts | None:
    """An OpenAI-style ``GET /models`` listing: vLLM's ``max_model_len``, or
    OpenRouter's ``context_length`` (the smaller of the model's and its top
    provider's, where the request may be routed)."""
    entry = _named(_entries(_json(raw), "data"), model, "id", "root")
    if entry is None:
        return None
    window = _window(entry.get("max_model_len"))
    if window is not None:
        return ServerFacts(window, None, "vLLM /v1/models")
    top = entry.get("top_provider")
    stated = [
        _window(entry.get("context_length")),
        _window(top.get("context_length")) if isinstance(top, dict) else None,
    ]
    windows = [w for w in stated if w is not None]
    return ServerFacts(min(windows), None, "/models context_length") if windows else None


def parse_lmstudio_models(raw: bytes, model: str) -> ServerFacts | None:
    """LM Studio's ``GET /api/v0/models``: a loaded model's ``loaded_context_length``."""
    entry = _named(_entries(_json(raw), "data"), model, "id")
    if entry is None:
        return None
    window = _window(entry.get("loaded_context_length"))
    return ServerFacts(window, None, "LM Studio /api/v0/models") if window else None


def parse_ollama_show(raw: bytes) -> ServerFacts | None:
    """Ollama's ``POST /api/show``: ``num_ctx`` when the model's Modelfile sets it
    (in ``parameters``, one ``name value`` a line)."""
    answer = _json(raw)
    parameters = answer.get("parameters") if isinstance(answer, dict) else None
    if not isinstance(parameters, str):
        return None
    found = _NUM_CTX.findall(parameters)
    window = _window(int(found[-1])) if found else None
    return ServerFacts(window, None, "Ollama /api/show num_ctx") if window else None


def parse_ollama_ps(raw: bytes, model: str) -> ServerFacts | None:
    """Ollama's ``GET /api/ps``: the ``context_length`` a loaded model was given."""
    entries = _entries(_json(raw), "models")
    names = (model, f"{model}:latest")
    entry = next((e for e in entries if any(e.get(f) in names for f in ("name", "model"))), None)
    window = _window(entry.get("context_length")) if entry is not None else None
    return ServerFacts(window, None, "Ollama /api/ps") if window else None


# --- asking ----------------------------------------------------------------------------


def server_root(upstream_url: str) -> str:
    """The server's own root: the upstream URL without its ``/v1``."""
    base = upstream_url.rstrip("/")
    return base.removesuffix("/v1")


@functools.lru_cache(maxsize=64)
def is_local(upstream_url: str) -> bool:
    """Whether the upstream is on this machine or its network, by its host:
    loopback, private or link-local addresses, names without a dot (a
    container's service name) and the local suffixes. (Asked on every
    request; upstreams are the settings', so the answers kept are few.)"""
    host = (urlsplit(upstream_url).hostname or "").lower().rstrip(".")
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "." not in host or host == "localhost" or host.endswith(_LOCAL_SUFFIXES)
    return address.is_loopback or address.is_private or address.is_link_local


async def _ask(
    transport: Transport,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes | None = None,
) -> bytes | None:
    """The body of a 200 answer, read to :data:`MAX_ANSWER_BYTES`; ``None`` for
    any other status. A server that cannot be reached raises :class:`ConnectFailed`."""
    sent = {**headers, "content-type": "application/json"} if body is not None else dict(headers)
    try:
        response = await transport.request(method, url, sent, body)
    except ConnectFailed:
        raise
    except (TransportError, ValueError):
        return None
    try:
        if response.status != 200:
            return None
        return await response.read(MAX_ANSWER_BYTES)
    except TransportError:
        return None
    finally:
        response.release()


async def discover(
    transport: Transport,
    upstream_url: str,
    model: str,
    headers: Mapping[str, str],
    *,
    timeout: float,
) -> ServerFacts | None:
    """Ask the server at ``upstream_url`` what it serves ``model`` with, within
    ``timeout`` seconds in all; ``None`` when it states no window. ``headers``
    are the credentials to send (the caller's own, for this upstream).

    Never raises for what the server does: a server that is down, slow,
    answers garbage or states nothing is ``None``.
    """
    base, root = upstream_url.rstrip("/"), server_root(upstream_url)
    slots: int | None = None
    probes: list[Callable[[], Awaitable[ServerFacts | None]]] = [
        lambda: _then(_ask(transport, "GET", f"{root}/props", headers), parse_llama_props),
        lambda: _then(
            _ask(transport, "GET", f"{base}/models", headers),
            lambda raw: parse_model_listing(raw, model),
        ),
        lambda: _then(
            _ask(transport, "GET", f"{root}/api/v0/models", headers),
            lambda raw: parse_lmstudio_models(raw, model),
        ),
        lambda: _then(
            _ask(transport, "POST", f"{root}/api/show", headers, orjson.dumps({"model": model})),
            parse_ollama_show,
        ),
        lambda: _then(
            _ask(transport, "GET", f"{root}/api/ps", headers),
            lambda raw: parse_ollama_ps(raw, model),
        ),
    ]
    try:
        async with asyncio.timeout(timeout):
            for probe in probes:
                facts = await probe()
                if facts is None:
                    continue
                slots = slots or facts.slots
                if facts.window is not None:
                    return ServerFacts(facts.window, slots, facts.source)
    except (TimeoutError, ConnectFailed):
        pass
    return ServerFacts(None, slots, "llama.cpp /props") if slots else None


async def _then(
    answer: Awaitable[bytes | None], parse: Callable[[bytes], ServerFacts | None]
) -> ServerFacts | None:
    raw = await answer
    return parse(raw) if raw is not None else None


# --- off the request path ---------------------------------------------------------------


class Discoveries:
    """The discoveries under way and their outcomes, by (upstream, model) key.

    :meth:`start` never waits: the request that asks is served on the window
    believed now. A key is asked once per process when the server answered,
    again after :data:`RETRY_SILENT_SECONDS` when it stated nothing; at most
    ``max_keys`` outcomes are remembered (the oldest forgotten first).
    """

    def __init__(
        self,
        *,
        max_keys: int,
        max_running: int = MAX_RUNNING,
        retry_after: float = RETRY_SILENT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_keys = max_keys
        self._max_running = max_running
        self._retry_after = retry_after
        self._clock = clock
        #: When each key may be asked again (``inf``: not in this process).
        self._next: dict[str, float] = {}
        self._running: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._running)

    def start(
        self,
        key: str,
        ask: Callable[_P, Awaitable[bool]],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> bool:
        """Run ``ask(*args, **kwargs)`` (which answers whether the server stated
        a window) in the background, unless ``key`` is being or was recently
        asked, or :data:`MAX_RUNNING` others are under way; whether it was
        started. Every request asks, and most find their key asked already:
        the question is put together only when it is to be asked."""
        if key in self._running or len(self._running) >= self._max_running:
            return False
        if self._clock() < self._next.get(key, float("-inf")):
            return False
        self._remember(key, float("inf"))  # until it answers: asked once at a time
        task = asyncio.ensure_future(self._run(key, functools.partial(ask, *args, **kwargs)))
        self._running[key] = task
        task.add_done_callback(lambda _: self._running.pop(key, None))
        return True

    async def _run(self, key: str, ask: Callable[[], Awaitable[bool]]) -> None:
        try:
            stated = await ask()
        except Exception:  # a bug here must not surface anywhere but the log
            logger.warning("asking the upstream for its window failed", exc_info=True)
            stated = False
        self._remember(key, float("inf") if stated else self._clock() + self._retry_after)

    def _remember(self, key: str, when: float) -> None:
        self._next.pop(key, None)
        self._next[key] = when
        while len(self._next) > self._max_keys:
            del self._next[next(iter(self._next))]

    async def close(self) -> None:
        """Cancel the discoveries under way (at shutdown)."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
