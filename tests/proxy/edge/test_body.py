"""proxy/edge/body.py: the JSON content type, reading a chat body, top-level
keys named twice, and which bodies :class:`BodyLimit` watches."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import ClientDisconnect, Request

from proxy.edge.body import (
    BodyLimit,
    deep_nesting_refused,
    is_json,
    parse_object,
    read_body,
    repeated_key,
)
from proxy.edge.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ("APPLICATION/JSON ;charset=UTF-8", True),
        ("application/vnd.api+json", True),
        ("", False),
        ("text/plain", False),
        ("text/plain; charset=utf-8", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("application/jsonl", False),
        ("text/json", False),
        ("+json", False),
    ],
)
def test_only_json_media_types_are_json(content_type: str, expected: bool) -> None:
    assert is_json(content_type) is expected


def reference(raw: bytes) -> str | None:
    """The first top-level key named again, as the standard library sees it."""
    seen: set[str] = set()
    for key, _ in json.loads(raw, object_pairs_hook=list):
        if key in seen:
            return str(key)
        seen.add(key)
    return None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"messages": [], "model": "a"}', None),
        (b'{"messages": [], "messages": []}', "messages"),
        (b'{"a": 1, "b": 2, "b": 3, "a": 4}', "b"),
        (b'{"messages": [], "\\u006Dessages": []}', "messages"),
        (b'{"\\ud83d\\ude00": 1, "\xf0\x9f\x98\x80": 2}', "\U0001f600"),
        (b'{"a": {"b": 1, "b": 2}, "c": [{"a": 1}, {"a": 2}]}', None),
        (b'{"s": "\\"s\\": 1, \\"s\\": 2"}', None),
        (b'{"n": 1, "n": 99999999999999999999999}', "n"),  # beyond simdjson's integers
        (b"{}", None),
    ],
)
def test_repeated_top_level_keys_are_found(raw: bytes, expected: str | None) -> None:
    assert repeated_key(raw) == expected == reference(raw)


# Random JSON objects written with repeated keys, keys spelled with escapes,
# and values that hold the same names (nested objects, strings).

_KEYS = st.sampled_from(["messages", "model", "tools", "a", "é", "\U0001f600", 'q"', "s\\"])


def _spelled(key: str, data: st.DataObject) -> str:
    out = []
    for char in key:
        if data.draw(st.booleans()):
            code = ord(char)
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04X}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(json.dumps(char, ensure_ascii=False)[1:-1])
    return '"' + "".join(out) + '"'


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**25), max_value=10**25)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
    | _KEYS.map(lambda key: json.dumps(key) + ": 1")
)


def _write(value: Any, data: st.DataObject) -> str:
    space = data.draw(st.sampled_from(["", " ", "\n  "]))
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        members = [f"{_spelled(k, data)}:{space}{_write(v, data)}" for k, v in value]
        return "{" + space + ("," + space).join(members) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_write(item, data) for item in value) + "]"
    return json.dumps(value, ensure_ascii=data.draw(st.booleans()))


_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.lists(st.tuples(_KEYS, inner), min_size=1, max_size=4)
    ),
    max_leaves=12,
)


@given(st.lists(st.tuples(_KEYS, _VALUES), max_size=6), st.data())
def test_the_detector_agrees_with_the_standard_library(
    members: list[tuple[str, Any]], data: st.DataObject
) -> None:
    raw = (_write(members, data) if members else "{}").encode()
    assert isinstance(orjson.loads(raw), dict)  # what parse_object hands on
    assert repeated_key(raw) == reference(raw)


def test_a_body_nested_past_what_orjson_writes_is_the_clients_400() -> None:
    nested: list[Any] = []
    for _ in range(300):
        nested = [nested]
    with pytest.raises(BadRequest, match="nested too deeply"), deep_nesting_refused():
        orjson.dumps(nested)


def test_any_other_type_error_is_a_bug_and_stays_one() -> None:
    # orjson's error class is the builtin TypeError: a bug raising one must
    # not be answered as the client's too-deep body.
    with pytest.raises(TypeError, match="unexpected keyword"), deep_nesting_refused():
        raise TypeError("work() got an unexpected keyword argument 'owner'")


def test_a_chat_body_is_checked_in_the_same_pass_its_fields_are() -> None:
    with pytest.raises(BadRequest, match="'messages' is a required property"):
        parse_object(b'{"model": "m"}', chat=True)
    with pytest.raises(BadRequest, match="'model' must be a string"):
        parse_object(b'{"model": 4, "messages": []}', chat=True)
    with pytest.raises(BadRequest, match="Invalid messages"):
        parse_object(b'{"messages": [1]}', chat=True)
    assert parse_object(b'{"model": 4, "messages": [1]}') == {"model": 4, "messages": [1]}
    # A chat body's messages are not written here (the engine checks them);
    # every other field is, and one nested past what orjson writes is a 400.
    deep = b"[" * 300 + b"]" * 300
    assert parse_object(
        b'{"messages": [{"role": "user", "content": "hi", "x": ' + deep + b"}]}", chat=True
    )
    with pytest.raises(BadRequest, match="nested too deeply"):
        parse_object(b'{"messages": [], "meta": ' + deep + b"}", chat=True)
    with pytest.raises(BadRequest, match="nested too deeply"):
        parse_object(b'{"messages": ' + deep + b"}")


@pytest.mark.parametrize(
    ("version", "headers", "watched"),
    [
        ("1.1", [], False),  # no length, no chunks: HTTP/1 sends no body
        ("1.0", [], False),
        ("1.1", [(b"content-length", b"10")], False),  # within the limit: nothing to watch
        ("1.1", [(b"transfer-encoding", b"chunked")], True),
        ("1.1", [(b"content-length", b"99")], True),  # refused at its first read
        ("2", [], True),  # HTTP/2 frames a body without either header
    ],
)
def test_only_a_body_that_may_pass_its_limit_is_watched(
    version: str, headers: list[tuple[bytes, bytes]], watched: bool
) -> None:
    seen: list[object] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(receive)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        pass

    scope = {"type": "http", "http_version": version, "path": "/v1/x", "headers": headers}
    asyncio.run(BodyLimit(app, large=50, small=50)(scope, receive, send))
    assert (seen[0] is not receive) is watched


def _read(
    headers: list[tuple[bytes, bytes]], messages: list[dict[str, Any]], limit: int = 100
) -> tuple[bytes, int]:
    """``read_body`` over a request whose client sends ``messages``: the body,
    and how many messages it took."""
    taken: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        taken.append(messages[len(taken)])
        return taken[-1]

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    body = asyncio.run(read_body(Request(scope, receive), limit))
    return body, len(taken)


JSON_HEADER = (b"content-type", b"application/json")


def _part(body: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def test_a_body_is_read_from_receive_and_its_headers_in_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Neither Starlette's header mapping (one scan a header) nor its body
    stream (a generator step a piece) is used to read it."""

    def unused(self: Request) -> Any:
        raise AssertionError("read through Starlette's request")

    monkeypatch.setattr(Request, "stream", unused)
    monkeypatch.setattr(Request, "headers", property(unused))
    headers = [(b"host", b"x"), JSON_HEADER, (b"content-length", b"9")]
    parts = [_part(b'{"a":', more=True), {"type": "http.other"}, _part(b"", True), _part(b"1}")]
    assert _read(headers, parts) == (b'{"a":1}', 4)


def test_the_first_of_a_repeated_content_type_is_the_one_read() -> None:
    with pytest.raises(UnsupportedMediaType):
        _read([(b"content-type", b"text/plain"), JSON_HEADER], [_part(b"{}")])
    assert _read([JSON_HEADER, (b"content-type", b"text/plain")], [_part(b"{}")]) == (b"{}", 1)


@pytest.mark.parametrize(
    "headers",
    [[], [(b"content-type", b"text/plain")], [JSON_HEADER, (b"content-encoding", b"GZIP")]],
    ids=["none", "text", "compressed"],
)
def test_a_body_not_sent_as_plain_json_is_refused_unread(
    headers: list[tuple[bytes, bytes]],
) -> None:
    with pytest.raises(UnsupportedMediaType) as refused:
        _read(headers, [])
    if headers[1:]:
        assert "(gzip)" in refused.value.message


def test_a_body_over_the_limit_is_refused_declared_unread_or_as_it_passes_it() -> None:
    with pytest.raises(PayloadTooLarge):
        _read([JSON_HEADER, (b"content-length", b"101")], [])
    with pytest.raises(PayloadTooLarge):
        _read([JSON_HEADER], [_part(b"x" * 60, more=True), _part(b"x" * 60)])
    identity = [JSON_HEADER, (b"content-encoding", b"identity"), (b"content-length", b"100")]
    assert _read(identity, [_part(b"x" * 100)]) == (b"x" * 100, 1)


def test_a_client_that_leaves_while_its_body_comes_is_a_disconnect() -> None:
    with pytest.raises(ClientDisconnect):
        _read([JSON_HEADER], [_part(b"{", more=True), {"type": "http.disconnect"}])
