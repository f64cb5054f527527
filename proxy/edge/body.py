"""Reading a chat request's body: size-limited, parsed once, checked.

A body whose ``Content-Type`` is not JSON gets 415 before it is read (a web
page can send ``text/plain`` cross-site without a CORS preflight; JSON it
cannot); one over the size limit 413 before it is parsed; a compressed one
415; one that is not a JSON object with a ``messages`` list of objects, or
that names a top-level key twice, 400 — all in OpenAI's error shape
(:mod:`proxy.edge.errors`).

:class:`BodyLimit` bounds every other route's body the same way, while it
streams in: whatever reads it — a FastAPI route's ``request.body()``, a form,
an upload streamed on — gets :class:`~proxy.edge.errors.PayloadTooLarge`
from ``receive`` once the body passes its route's limit, so no route ever
holds more than its limit, and each answers the 413 in its own shape.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import orjson
import simdjson
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from compaction import InvalidMessagesError, check_messages
from proxy.edge.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 415 unless it is JSON and with 413 above
    ``limit``, before it is parsed.

    The three headers it asks for are read in one pass over the request's
    own (the first of each, as a server reads it), and the body straight from
    ``receive``: what Starlette's header mapping and body stream would do the
    same way, one lookup and one generator step at a time."""
    content_type = declared = encoding = None
    for name, value in request.scope["headers"]:
        if name == b"content-type":
            content_type = value if content_type is None else content_type
        elif name == b"content-length":
            declared = value if declared is None else declared
        elif name == b"content-encoding":
            encoding = value if encoding is None else encoding
    if content_type is None or not is_json(content_type.decode("latin-1")):
        raise UnsupportedMediaType(
            "The request body must be sent as Content-Type: application/json.",
            code="unsupported_content_type",
        )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    if encoding is not None and encoding.lower() not in (b"identity", b""):
        shown = encoding.decode("latin-1").lower()
        raise UnsupportedMediaType(
            f"Compressed request bodies ({shown}) are not supported; send identity."
        )
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.disconnect":
            raise ClientDisconnect()
        if kind != "http.request":
            continue
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is larger than the limit of {limit:,} bytes.")


def check_model(model: object, limit: int) -> None:
    """A 400 for a model that is not a name (a number, a list: it is matched
    against the configured patterns and used as a key) or a name longer than
    ``limit`` characters: it would be matched against every configured
    pattern, logged and labelled. No model at all is the upstream's to refuse."""
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string.", param="model")
    if isinstance(model, str) and len(model) > limit:
        raise BadRequest(f"The model name is longer than {limit:,} characters.", param="model")


#: Paths whose bodies are small by nature (forms, settings, summary edits).
_SMALL_BODY_PREFIXES = ("/ui", "/v1/compaction/")


class BodyLimit:
    """Every request body bounded while it streams in, per kind of route:
    ``small`` bytes for the dashboard's forms and ``/v1/compaction/*``,
    ``large`` for everything else (the compacted and pass-through routes).

    A body declared within its limit needs nothing here (the server delivers
    no more than a declared length). One declared larger is refused at its
    first read, before a byte of it is taken; one sent without a length as
    soon as it passes the limit. Whatever the route made of that refusal — an
    upload streamed on to the upstream sees only a broken body, a 502 — the
    answer is the 413. Plain ASGI, nothing buffered here.
    """

    def __init__(self, app: ASGIApp, *, large: int, small: int) -> None:
        self.app = app
        self.large = large
        self.small = small

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        small = path == "/ui" or path.startswith(_SMALL_BODY_PREFIXES)
        limit = self.small if small else self.large
        # No length and no chunks is no body in HTTP/1 (RFC 9112 6.3), as a
        # GET's: nothing to watch. A chunked body's length is known at its end.
        declared: int | None = 0 if scope.get("http_version") in ("1.0", "1.1") else None
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                declared = int(value) if value.isdigit() else None
                break
            if key == b"transfer-encoding":
                declared = None
        if declared is not None and declared <= limit:
            await self.app(scope, receive, send)
            return
        size = 0
        refused: PayloadTooLarge | None = None
        replaced = False

        async def bounded() -> Message:
            nonlocal size, refused
            if declared is not None:
                refused = too_large(limit)
                raise refused
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > limit:
                    refused = too_large(limit)
                    raise refused
            return message

        async def answered(message: Message) -> None:
            nonlocal replaced
            if refused is not None and message["type"] == "http.response.start":
                replaced = message["status"] != refused.status
            if not replaced:
                await send(message)
            elif message["type"] == "http.response.start" and refused is not None:
                await _answer(refused, send, scope.get("path", ""))

        await self.app(scope, bounded, answered)


async def _answer(error: PayloadTooLarge, send: Send, path: str) -> None:
    body = error.json_bytes(path)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def is_json(content_type: str) -> bool:
    """``application/json`` or ``application/*+json``, with any parameters."""
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def parse_object(raw: bytes, *, chat: bool = False) -> dict[str, Any]:
    """The body as a JSON object naming each top-level key once, or a 400 —
    read and checked in one pass; with ``chat``, one with a valid
    ``messages`` list, which the engine reads as it is.

    orjson reads 1024 levels of nesting but writes only 254, and counting,
    hashing and forwarding a rewritten body all write it again: the fields
    are written here once to check them, but for a chat body's ``messages``
    (checked message by message, and written anyway when keyed).
    """
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    repeated = repeated_key(raw)
    if repeated is not None:
        # orjson kept the last value; an upstream parser may read the first.
        repeated = repeated[:100]
        raise BadRequest(f"The key {repeated!r} appears more than once.", param=repeated)
    fields = body
    if chat:
        if "messages" not in body:
            raise BadRequest("'messages' is a required property.", param="messages")
        try:
            check_messages(body["messages"])
        except InvalidMessagesError as exc:
            raise BadRequest(f"Invalid {exc.where}: {exc.problem}.", param=exc.where) from exc
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise BadRequest("'model' must be a string.", param="model")
        fields = dict(body)
        del fields["messages"]
    with deep_nesting_refused():
        orjson.dumps(fields)
    return body


#: What orjson says of a value nested deeper than it writes. Its error class,
#: ``orjson.JSONEncodeError``, *is* the builtin ``TypeError`` that any bug
#: raises too, so the message is what tells the client's fault from ours.
_TOO_DEEP = "Recursion limit reached"


@contextlib.contextmanager
def deep_nesting_refused() -> Iterator[None]:
    """Turn orjson's refusal of a body nested past its limit (met when the
    proxy writes the body back) into the client's 400; any other
    ``TypeError`` is a bug and stays one."""
    try:
        yield
    except TypeError as exc:
        if str(exc) != _TOO_DEEP:
            raise
        raise BadRequest(f"The request body is nested too deeply: {exc}.") from exc


def repeated_key(raw: bytes) -> str | None:
    """The first top-level key that ``raw``, a JSON object, names twice, or None.

    Keys are compared decoded (``"a"`` and ``"\\u0061"`` are one key); nested
    objects are not looked at. simdjson keeps every member of an object, so
    its top-level object lists the keys as written: about 0.1 ms for a 250 KB
    body, about 1 µs for a small one (counting key spellings in the raw bytes
    in Python cost 2 ms). A document it declines (an integer beyond 64 bits)
    is read again by the standard library, slowly but exactly.
    """
    try:
        document = simdjson.Parser().parse(raw)
        keys = list(document) if isinstance(document, simdjson.Object) else []
    except (ValueError, RuntimeError):
        try:
            keys = [key for key, _ in json.loads(raw, object_pairs_hook=list)]
        except RecursionError as exc:
            raise BadRequest("The request body is nested too deeply.") from exc
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    return None
