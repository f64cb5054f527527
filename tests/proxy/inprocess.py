"""The proxy in-process: a recording transport in place of aiohttp, and the app
driven through its ASGI interface, with no socket on either side.

``create_app(settings, transport=…)`` is the seam. :class:`RecordingTransport`
implements the transport's one call, ``request(method, url, headers, body)``,
and records every request it was asked. Each answer comes from, in order:

1. the script — :class:`Reply` values queued with :meth:`RecordingTransport.script`
   (JSON answers, event streams, empty streams, context-length errors, a
   stream that breaks, a transport error raised instead of any answer);
2. else the ASGI application for the URL (``routes`` by base URL, else
   ``app``), answering like a real upstream (usually
   :meth:`tests.proxy.servers.FakeUpstream.app`), called in the same event loop
   and streamed back message by message, so a stream is relayed as it is made;
3. else a 404.

:class:`InProcessProxy` runs the app with Starlette's ``TestClient``: the
lifespan runs (the store, the recorder, background work), responses stream
(the client reads each body message as the app sends it), and the client's
disconnect comes only once the response is complete, as from a real client.
What stays on real servers is what is about the network: timeouts enforced
by aiohttp, disconnects, TLS and HTTP proxies, real CLI clients, processes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import openai
import orjson
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Message

from config import Settings, load_settings
from proxy.app import create_app
from proxy.flow.services import Services
from proxy.upstream.transport import BodyLost, NoResponse, TransportError, UpstreamResponse
from tests.proxy.servers import OVERFLOW_ERRORS

#: The upstream base URL the in-process proxies are configured with; nothing
#: listens there, every request goes to the recording transport.
UPSTREAM_URL = "http://upstream.test/v1"
#: The proxy's base URL as its in-process clients address it (a loopback
#: name, so the host guard lets it through as it does a local client).
PROXY_URL = "http://127.0.0.1/v1"


# --- what the transport was asked ---------------------------------------------


@dataclass(frozen=True)
class Asked:
    """One request the proxy asked the transport for, as it asked it."""

    method: str
    url: str
    #: As given to the transport (the wire adds host, length and encoding).
    headers: Mapping[str, str]
    #: The body's bytes; a streamed body is read whole to record it.
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.url).path

    def json(self) -> Any:
        return orjson.loads(self.body)


# --- scripted answers ------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a status, headers and body chunks; or an error."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    chunks: tuple[bytes, ...] = ()
    #: Whether the body is sent with its ``Content-Length`` (a JSON answer) or
    #: without (an event stream, read until its end).
    declared: bool = True
    #: Raised by ``request`` instead of any answer (refused, timed out, …).
    error: TransportError | None = None
    #: Raised after the chunks: the body broke off.
    broken: BodyLost | None = None


def json_reply(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return Reply(
        status,
        (("content-type", "application/json"), *(headers or {}).items()),
        (raw,),
    )


def _event(event: Any) -> bytes:
    if isinstance(event, bytes):
        return event
    if isinstance(event, str):
        return event.encode()
    return b"data: " + orjson.dumps(event) + b"\n\n"


def sse_reply(*events: Any, done: bool = True, status: int = 200) -> Reply:
    """An event stream: each event a JSON ``data:`` line (or bytes as given),
    then ``data: [DONE]`` unless ``done`` is False."""
    chunks = tuple(_event(e) for e in events) + ((b"data: [DONE]\n\n",) if done else ())
    return Reply(status, (("content-type", "text/event-stream"),), chunks, declared=False)


def empty_stream() -> Reply:
    """HTTP 200, an event stream with no event in it (llama-cpp-python's overflow)."""
    return sse_reply(done=False)


def cut_stream(*events: Any) -> Reply:
    """An event stream that breaks off after ``events``."""
    stream = sse_reply(*events, done=False)
    return Reply(
        stream.status,
        stream.headers,
        stream.chunks,
        declared=False,
        broken=BodyLost("the upstream connection broke mid-body"),
    )


def failure(error: TransportError) -> Reply:
    """No answer at all: ``request`` raises ``error``."""
    return Reply(error=error)


def context_length_error(window: int, tokens: int, style: str = "openai") -> Reply:
    """The overflow error body of a provider (``style`` as in ``OVERFLOW_ERRORS``)."""
    status, template = OVERFLOW_ERRORS[style]
    text = orjson.dumps(template).decode()
    for placeholder, value in (("{n}", tokens), ("{w}", window)):
        text = text.replace(f'"{placeholder}"', str(value)).replace(placeholder, str(value))
    return json_reply(text.encode(), status)


# --- the responses the proxy reads ---------------------------------------------------


class _Response(UpstreamResponse):
    """What ``Transport.request`` returns, fed from an async source of chunks
    that may raise :class:`BodyLost`. Only the source is the fake's:
    reading the body and ``wait_body`` are the real response's, over ``next_chunk``."""

    def __init__(
        self,
        url: str,
        status: int,
        headers: list[tuple[bytes, bytes]],
        chunks: AsyncIterator[bytes],
        on_abort: Callable[[], None] = lambda: None,
    ) -> None:
        self._url = url
        self.status = status
        self.raw_headers = [(name.lower(), value) for name, value in headers]
        declared = self._header(b"content-length")
        self.length = int(declared) if declared is not None else None
        self._chunks = chunks
        self._ahead: bytes | None = None
        self._ended = False
        self._on_abort = on_abort
        self.on_end = None
        self.over = False
        #: Whether the proxy stopped the body before its end (the connection closed).
        self.aborted = False

    @property
    def url(self) -> str:
        return self._url

    def _header(self, name: bytes) -> str | None:
        for key, value in self.raw_headers:
            if key == name:
                return value.decode("latin-1")
        return None

    def header(self, name: str) -> str | None:
        return self._header(name.lower().encode("latin-1"))

    async def next_chunk(self) -> bytes | None:
        if self._ahead is not None:
            chunk, self._ahead = self._ahead, None
            return chunk or None
        if self._ended:
            return None
        try:
            while True:
                chunk = await self._chunks.__anext__()
                if chunk:
                    return chunk
        except StopAsyncIteration:
            self._ended = True
            self.release()  # as the real one's: a body read to its end is over
            return None
        except BodyLost:
            self.abort()
            raise

    async def read(self, limit: int = 1 << 20) -> bytes:
        return await self._gathered(limit)  # the real one, less aiohttp's one-go read

    def release(self) -> None:
        if not self._ended:
            self.abort()
            return
        self.over = True
        if self.on_end is not None:  # as the real one's: its end is told
            self.on_end()

    def abort(self) -> None:
        if not self._ended and not self.aborted:
            self.aborted = True
            self._on_abort()
        self._ended = self.over = True
        if self.on_end is not None:
            self.on_end()


async def _scripted_chunks(reply: Reply) -> AsyncIterator[bytes]:
    for chunk in reply.chunks:
        yield chunk
    if reply.broken is not None:
        raise reply.broken


def _scripted(url: str, reply: Reply) -> _Response:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers]
    if reply.declared:
        headers.append((b"content-length", b"%d" % sum(len(c) for c in reply.chunks)))
    return _Response(url, reply.status, headers, _scripted_chunks(reply))


_END = object()


def http_scope(
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    *,
    query: bytes = b"",
    scheme: str = "http",
    server: tuple[str, int] = ("127.0.0.1", 80),
    client: tuple[str, int] = ("127.0.0.1", 40000),
) -> dict[str, Any]:
    """The ASGI scope a server gives an app for one HTTP/1.1 request to ``path``
    (its raw form: it is decoded here)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": scheme,
        "path": unquote(path),
        "raw_path": path.encode("latin-1"),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "server": server,
        "client": client,
        "state": {},
    }


async def _asgi_call(
    app: ASGIApp, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> _Response:
    """``app`` asked as a server would ask it; returns once the head is sent.

    The body then arrives as the app sends it. An app that fails before its
    head answers 500 (as uvicorn does); one that fails after it breaks the
    body (:class:`BodyLost`), as a connection closed mid-body does."""
    parts = urlsplit(url)
    scope = http_scope(
        method,
        parts.path,
        headers,
        query=parts.query.encode("latin-1"),
        scheme=parts.scheme,
        server=(parts.hostname or "upstream.test", parts.port or 80),
    )
    queue: asyncio.Queue[Any] = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if gone.is_set():
            raise OSError("the proxy closed the connection")
        await queue.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        except BaseException as exc:
            await queue.put(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            await queue.put(_END)

    task = asyncio.create_task(run())
    first = await queue.get()
    if first is _END or isinstance(first, BaseException):
        if isinstance(first, asyncio.CancelledError):
            raise NoResponse("the upstream closed the connection without an answer")
        return _Response(url, 500, [(b"content-length", b"21")], _one(b"Internal Server Error"))

    async def chunks() -> AsyncIterator[bytes]:
        while True:
            message = await queue.get()
            if message is _END:
                return
            if isinstance(message, BaseException):
                raise BodyLost("the upstream's body was cut short or malformed")
            if message["type"] != "http.response.body":
                continue
            yield bytes(message.get("body", b""))
            if not message.get("more_body", False):
                return

    def close() -> None:
        # The connection closes: the app sees the disconnect, and anything
        # still running for this request is cancelled.
        gone.set()
        task.cancel()

    return _Response(url, first["status"], list(first.get("headers", [])), chunks(), close)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


@dataclass
class RecordingTransport:
    """The ``Transport`` seam, scripted per request and recording every request."""

    #: Answers every request the script does not (an ASGI upstream), if set.
    app: ASGIApp | None = None
    #: Other upstreams by base URL: a request under one goes to its app instead.
    routes: dict[str, ASGIApp] = field(default_factory=dict)
    #: Every request, in the order the proxy asked them.
    requests: list[Asked] = field(default_factory=list)
    #: Every response handed out, in the same order (``.aborted`` tells
    #: whether the proxy cut its body short).
    responses: list[_Response] = field(default_factory=list)
    _script: list[tuple[Callable[[Asked], bool], Reply]] = field(default_factory=list)
    closed: bool = False

    def script(self, *replies: Reply, when: Callable[[Asked], bool] | None = None) -> None:
        """Queue ``replies`` for the next requests (those ``when`` holds for, if given)."""
        self._script += [(when or _always, reply) for reply in replies]

    def asked(self, path_suffix: str = "") -> list[Asked]:
        """The requests whose path ends with ``path_suffix``."""
        return [r for r in self.requests if r.path.endswith(path_suffix)]

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | AsyncIterator[bytes] | None,
    ) -> _Response:
        if body is None or isinstance(body, bytes):
            data = body or b""
        else:
            data = b"".join([chunk async for chunk in body])
        asked = Asked(method, url, dict(headers), data)
        self.requests.append(asked)
        for index, (matches, reply) in enumerate(self._script):
            if matches(asked):
                del self._script[index]
                if reply.error is not None:
                    raise reply.error
                response = _scripted(url, reply)
                break
        else:
            app = self._app_for(url)
            if app is None:
                response = _scripted(url, json_reply({"error": {"message": "not scripted"}}, 404))
            else:
                response = await _asgi_call(app, method, url, _wire(asked, body), data)
        self.responses.append(response)
        return response

    def _app_for(self, url: str) -> ASGIApp | None:
        bases = [base for base in self.routes if url.startswith(base.rstrip("/") + "/")]
        return self.routes[max(bases, key=len)] if bases else self.app

    async def aclose(self) -> None:
        self.closed = True


def _always(asked: Asked) -> bool:
    return True


def _wire(asked: Asked, body: bytes | AsyncIterator[bytes] | None) -> list[tuple[bytes, bytes]]:
    """The headers as they reach an upstream: with its host, the body's length
    (or chunked, for a streamed one) and the identity encoding the transport asks for."""
    headers = {name.lower(): value for name, value in asked.headers.items()}
    headers["host"] = urlsplit(asked.url).netloc
    headers["accept-encoding"] = "identity"
    if isinstance(body, bytes):
        headers["content-length"] = str(len(body))
    elif body is not None:
        headers["transfer-encoding"] = "chunked"
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


# --- the proxy, in-process -----------------------------------------------------------


@dataclass
class InProcessProxy:
    """A running app (its lifespan entered) and the client that talks to it."""

    settings: Settings
    transport: RecordingTransport
    #: An ``httpx.Client`` (Starlette's TestClient) addressed at the app.
    http: TestClient
    url: str = PROXY_URL

    @property
    def app(self) -> Any:
        return self.http.app

    def client(self, **kwargs: Any) -> TestClient:
        """Another client of the same running app, with cookies of its own (a
        second visitor): it runs its requests in the first one's portal, so
        they reach the same app on the same event loop (no second lifespan)."""
        kwargs.setdefault("base_url", self.url.removesuffix("/v1"))
        other = _Visitor(
            self.http.app,
            raise_server_exceptions=False,
            follow_redirects=False,
            client=("127.0.0.1", 50001),
            **kwargs,
        )
        other.portal = self.http.portal
        return other

    def openai(self, **kwargs: Any) -> openai.OpenAI:
        """The real openai SDK, its requests handed to the app in-process."""
        kwargs.setdefault("api_key", "sk-client")
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.url, http_client=self.http, **kwargs)


class _Visitor(TestClient):
    """A TestClient running in another one's portal: entering it starts no
    lifespan (the app's is running), leaving it stops nothing."""

    def __enter__(self) -> _Visitor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@contextlib.contextmanager
def running(
    settings: Settings, transport: RecordingTransport, *, store: Any = None
) -> Iterator[InProcessProxy]:
    """``create_app(settings, transport=…)`` with its lifespan run for the block."""
    app = create_app(settings, transport=transport, store=store)
    client = TestClient(
        app,
        base_url="http://127.0.0.1",
        raise_server_exceptions=False,  # an app failure is a 500, as a server answers
        follow_redirects=False,  # as httpx and the SDKs do
        client=("127.0.0.1", 50000),
    )
    with client:
        yield InProcessProxy(settings, transport, client)


def asking_the_model(sections: dict[str, Any]) -> dict[str, Any]:
    """``sections`` with the llm summarizer asked for every summary, unless a test
    says otherwise: the suite's scripted sessions are a few turns on small
    windows, where a model's summary never pays for itself and the plan would
    take the extractive one (tests/compaction/budget/test_plan.py holds that rule);
    they test what asking a model does."""
    compaction = sections.get("compaction", {})
    return {**sections, "compaction": {"summary_must_pay": False, **compaction}}


def settings_for(**sections: Any) -> Settings:
    """The settings ``start_proxy`` uses: a memory store, the upstream at ``UPSTREAM_URL``,
    a model asked for every summary (:func:`asking_the_model`)."""
    sections = asking_the_model(sections)
    sections.setdefault("store", {"url": "memory://"})
    sections["upstream"] = {"base_url": UPSTREAM_URL, **sections.get("upstream", {})}
    return load_settings(None, **sections)


def services_of_app(app: Any) -> Services:
    """The services the running app's lifespan opened, from inside the
    middleware that wraps it."""
    while not hasattr(app, "state"):
        app = app.app
    services: Services = app.state.services
    return services
