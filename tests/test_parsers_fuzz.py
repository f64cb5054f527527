"""Every parser of client- or model-supplied data is total: whatever it is fed,
within the bounds the proxy sets, it answers or refuses, and no exception
escapes — through the app, no 500.

Drawn, bounded in depth and size:

* request bodies of the three APIs (Chat Completions, Anthropic Messages,
  Responses), shaped like theirs with every field liable to hold anything,
  sent through the in-process app with a small window so that the engine
  reads, decides and compacts them; and raw bytes that are not JSON at all,
  or JSON nested deeper than Python's recursion allows;
* which API a body read from a file is for (``proxy/dialects/shapes.py``);
* recall arguments as a model writes them (``compaction.recall.parse_request``);
* upstream event streams, split at any byte (``proxy/dialects/sse.py``), and
  as the answer to a streamed request of each API;
* settings files (TOML text, valid or not) read by ``config.load_settings``.

Each property runs a few dozen examples (derandomized in CI): seconds in all.
"""

from __future__ import annotations

import contextlib
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from compaction.chat.recall import RecallRequest, parse_request
from config import ConfigError, load_settings
from proxy.dialects.shapes import dialect_of
from proxy.dialects.sse import EventSplitter, fields
from tests.proxy.inprocess import (
    InProcessProxy,
    RecordingTransport,
    Reply,
    json_reply,
    running,
    settings_for,
)

EXAMPLES = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

ROUTES = {
    "chat": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "responses": "/v1/responses",
}

# --- drawn JSON ------------------------------------------------------------------

_KEYS = (
    "role content type text tool_calls tool_call_id id function name arguments "
    "tool_use tool_result tool_use_id input output call_id image_url source "
    "cache_control thinking signature summary encrypted_content"
).split()
_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
#: Any JSON value, a few levels deep at most.
json_values = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=16,
)
_roles = st.sampled_from(["user", "assistant", "system", "tool", "developer", "function"])
_long_text = st.text(max_size=30).map(lambda t: (t + " lorem ipsum ") * 120)
_part_types = st.sampled_from(
    [
        "text",
        "input_text",
        "output_text",
        "image_url",
        "image",
        "tool_use",
        "tool_result",
        "thinking",
        "function_call",
        "function_call_output",
        "compaction",
        "mystery",
    ]
)


@st.composite
def _part(draw: Any) -> Any:
    part: dict[str, Any] = {"type": draw(_part_types)}
    for key in draw(st.lists(st.sampled_from(_KEYS), max_size=4)):
        part[key] = draw(json_values | _long_text)
    return draw(st.just(part) | json_values)


@st.composite
def _message(draw: Any) -> Any:
    message: dict[str, Any] = {"role": draw(_roles | json_values)}
    content = draw(st.text(max_size=40) | _long_text | st.lists(_part(), max_size=4) | json_values)
    if draw(st.booleans()):
        message["content"] = content
    if draw(st.booleans()):
        message["tool_calls"] = draw(
            st.lists(
                st.fixed_dictionaries(
                    {"id": st.text(max_size=8) | json_values, "type": st.just("function")},
                    optional={
                        "function": st.fixed_dictionaries(
                            {},
                            optional={
                                "name": st.text(max_size=12) | json_values,
                                "arguments": st.text(max_size=60) | json_values,
                            },
                        )
                    },
                ),
                max_size=3,
            )
            | json_values
        )
    for key in draw(st.lists(st.sampled_from(_KEYS), max_size=3)):
        message[key] = draw(json_values)
    return draw(st.just(message) | json_values)


@st.composite
def bodies(draw: Any, api: str) -> Any:
    """A body of ``api``'s shape, any field of it liable to hold anything."""
    listing = "input" if api == "responses" else "messages"
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(["gpt-4o", "claude-sonnet-4", "m"]) | json_values),
        listing: draw(st.lists(_message(), max_size=8) | json_values | st.text(max_size=20)),
    }
    optional = {
        "stream": st.booleans() | json_values,
        "max_tokens": st.integers(-5, 10**9) | json_values,
        "tools": st.lists(json_values, max_size=3) | json_values,
        "system": st.text(max_size=40) | st.lists(_part(), max_size=2) | json_values,
        "instructions": st.text(max_size=40) | json_values,
        "previous_response_id": st.text(max_size=10) | json_values,
        "store": st.booleans() | json_values,
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)):
        body[key] = draw(optional[key])
    return draw(st.just(body) | json_values)


@st.composite
def conversations(draw: Any, api: str) -> dict[str, Any]:
    """A body the API accepts, long enough to be compacted, whose texts, tool
    arguments and outputs and unknown fields are drawn: what reaches the engine."""
    extra = st.dictionaries(st.text(max_size=6), json_values, max_size=2)
    text = _long_text | st.text(max_size=40)
    items: list[dict[str, Any]] = []
    for turn in range(draw(st.integers(2, 8))):
        call_id = f"call_{turn}"
        arguments = draw(st.text(max_size=60) | json_values.map(lambda v: orjson.dumps(v).decode()))
        output = draw(text | json_values.map(lambda v: orjson.dumps(v).decode()))
        if api == "chat":
            items += [
                {"role": "user", "content": draw(text), **draw(extra)},
                {
                    "role": "assistant",
                    "content": draw(st.none() | text),
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": draw(st.text(max_size=10)),
                                "arguments": arguments,
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": output, **draw(extra)},
            ]
        elif api == "anthropic":
            items += [
                {"role": "user", "content": draw(text)},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": draw(text)},
                        {
                            "type": "tool_use",
                            "id": call_id,
                            "name": "bash",
                            "input": draw(json_values),
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": call_id,
                            "content": output,
                            **draw(extra),
                        }
                    ],
                },
            ]
        else:
            items += [
                {"role": "user", "content": draw(text), **draw(extra)},
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "bash",
                    "arguments": arguments,
                },
                {
                    "type": "function_call_output",
                    "call_id": call_id,
                    "output": output,
                    **draw(extra),
                },
            ]
    items.append({"role": "user", "content": draw(text)})
    body: dict[str, Any] = {"model": "fuzz-model", "stream": draw(st.booleans())}
    body["input" if api == "responses" else "messages"] = items
    if api == "anthropic":
        body["max_tokens"] = 100
    return body


# --- the app -------------------------------------------------------------------


def _upstream_refuses(*_: Any) -> Reply:
    return json_reply({"error": {"message": "no", "type": "invalid_request_error"}}, 400)


@pytest.fixture(scope="module")
def proxy() -> Iterator[InProcessProxy]:
    """One app for the module: a small window, so drawn bodies are compacted,
    and an upstream that refuses whatever reaches it (its answer is not what
    is tested here: what the proxy does before it is)."""
    transport = RecordingTransport(app=_RefusingUpstream())
    config = settings_for(compaction={"context_window": 2_048, "summarizer": "extractive"})
    with running(config, transport) as running_proxy:
        yield running_proxy


class _RefusingUpstream:
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        body = orjson.dumps({"error": {"message": "refused", "type": "invalid_request_error"}})
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 400, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _post(proxy: InProcessProxy, api: str, content: bytes) -> Any:
    headers = {"content-type": "application/json", "x-api-key": "k", "authorization": "Bearer k"}
    if api == "anthropic":
        headers["anthropic-version"] = "2023-06-01"
    return proxy.http.post(ROUTES[api], content=content, headers=headers)


def _no_500(response: Any, sent: bytes) -> None:
    assert response.status_code != 500, (response.text[:500], sent[:500])
    assert response.status_code < 500 or response.status_code in (502, 503, 504)


@pytest.mark.parametrize("api", sorted(ROUTES))
@EXAMPLES
@given(data=st.data())
def test_no_request_body_ends_in_a_500(proxy: InProcessProxy, api: str, data: Any) -> None:
    body = data.draw(bodies(api))
    sent = orjson.dumps(body)
    _no_500(_post(proxy, api, sent), sent)


@pytest.mark.parametrize("api", sorted(ROUTES))
@EXAMPLES
@given(data=st.data())
def test_no_conversation_the_api_accepts_ends_in_a_500(
    proxy: InProcessProxy, api: str, data: Any
) -> None:
    body = data.draw(conversations(api))
    sent = orjson.dumps(body)
    response = _post(proxy, api, sent)
    _no_500(response, sent)
    with contextlib.suppress(Exception):  # what was relayed is not the question
        response.read()


@pytest.mark.parametrize("api", sorted(ROUTES))
@EXAMPLES
@given(
    raw=st.binary(max_size=200)
    | st.integers(1, 3_000).map(lambda n: b"[" * n + b"]" * n)
    | st.integers(2**64, 2**200).map(lambda n: b'{"model": "m", "max_tokens": %d}' % n)
)
def test_no_body_that_is_not_json_ends_in_a_500(
    proxy: InProcessProxy, api: str, raw: bytes
) -> None:
    _no_500(_post(proxy, api, raw), raw)


@pytest.mark.parametrize(
    ("api", "body", "status"),
    [
        # What the draws found: a value used as a set member or a dict key.
        ("anthropic", {"model": [None], "messages": []}, 400),
        ("responses", {"model": 1, "input": []}, 400),
        ("chat", {"model": {"a": 1}, "messages": [{"role": "user", "content": "hi"}]}, 400),
        ("anthropic", {"model": "m", "max_tokens": 9, "messages": [{"role": []}]}, 400),
        ("responses", {"model": "m", "input": [{"role": []}]}, None),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_not_a_500(
    proxy: InProcessProxy, api: str, body: dict[str, Any], status: int | None
) -> None:
    sent = orjson.dumps(body)
    response = _post(proxy, api, sent)
    _no_500(response, sent)
    if status is not None:
        assert response.status_code == status, response.text


@pytest.mark.parametrize("api", sorted(ROUTES))
@pytest.mark.parametrize("depth", [900, 5_000])
def test_a_body_nested_past_the_recursion_limit_is_refused(
    proxy: InProcessProxy, api: str, depth: int
) -> None:
    nested = '{"a":' * depth + "1" + "}" * depth
    key = "input" if api == "responses" else "messages"
    body = f'{{"model": "gpt-4o", "{key}": [{{"role": "user", "content": "hi", "x": {nested}}}]}}'
    response = _post(proxy, api, body.encode())
    _no_500(response, body.encode())


# --- parsers without a route ----------------------------------------------------


@EXAMPLES
@given(body=bodies("chat") | bodies("anthropic") | bodies("responses"))
@example(body={"model": "gpt-4o", "messages": True})  # iterated as a list, a TypeError
def test_which_api_a_body_is_for_is_always_answered(body: Any) -> None:
    if isinstance(body, dict):
        dialect_of(body)


_argument_texts = (
    st.text(max_size=200)
    | json_values.map(lambda v: orjson.dumps(v).decode())
    | st.integers(1, 3_000).map(lambda n: "[" * n)
    | st.integers(1, 3_000).map(lambda n: '{"ref":' * n)
)


@EXAMPLES
@given(arguments=_argument_texts)
def test_recall_arguments_are_parsed_or_refused_with_a_reason(arguments: str) -> None:
    parsed = parse_request(arguments)
    assert isinstance(parsed, RecallRequest | str)


_stream_bytes = st.lists(
    st.sampled_from(
        [b"data: ", b"event: x\n", b"\n", b"\r\n", b"\r", b": c\n", b"{", b"}", b'"a"', b"[DONE]"]
    )
    | st.binary(max_size=30),
    max_size=40,
).map(b"".join)


@EXAMPLES
@given(stream=_stream_bytes, cuts=st.lists(st.integers(0, 400), max_size=8))
def test_an_upstream_stream_splits_into_events_that_hold_every_byte(
    stream: bytes, cuts: list[int]
) -> None:
    splitter = EventSplitter(max_event_bytes=64)
    events = []
    at = 0
    for cut in [*sorted(min(c, len(stream)) for c in cuts), len(stream)]:
        events += splitter.feed(stream[at:cut])
        at = cut
    rest = splitter.rest()
    events += [rest] if rest is not None else []
    assert b"".join(event.raw for event in events) == stream
    for event in events:
        fields(event.raw).json_object()


@pytest.mark.parametrize("api", sorted(ROUTES))
@EXAMPLES
@given(stream=_stream_bytes)
def test_no_upstream_stream_ends_in_a_500(proxy: InProcessProxy, api: str, stream: bytes) -> None:
    proxy.transport.script(
        Reply(200, (("content-type", "text/event-stream"),), (stream,), declared=False)
    )
    key = "input" if api == "responses" else "messages"
    body = {"model": "gpt-4o", key: [{"role": "user", "content": "hi"}], "stream": True}
    if api == "anthropic":
        body["max_tokens"] = 10
    sent = orjson.dumps(body)
    response = _post(proxy, api, sent)
    _no_500(response, stream)
    with contextlib.suppress(Exception):  # what was relayed is not the question
        response.read()


# --- settings files ----------------------------------------------------------------

_SECTIONS = ("compaction", "upstream", "server", "store", "models", "logging", "nonsense")
_toml_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.booleans().map(lambda b: str(b).lower()),
    st.text(string.printable, max_size=20).map(lambda t: orjson.dumps(t).decode()),
    st.just("[1, 2, 3]"),
    st.just("{ a = 1 }"),
)
_toml_keys = st.sampled_from(
    [
        "context_window",
        "summarizer",
        "base_url",
        "url",
        "port",
        "host",
        "reserve_tokens",
        "keep_recent_tokens",
        "level",
        "timeout",
        "x",
        '"quoted key"',
    ]
)
_toml_lines = st.one_of(
    st.sampled_from(_SECTIONS).map(lambda s: f"[{s}]"),
    st.tuples(_toml_keys, _toml_values).map(lambda kv: f"{kv[0]} = {kv[1]}"),
    st.text(max_size=30),
)


@EXAMPLES
@given(text=st.lists(_toml_lines, max_size=12).map("\n".join))
def test_a_settings_file_is_read_or_refused_with_its_problems(tmp_path: Path, text: str) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with contextlib.suppress(ConfigError):
        load_settings(path)
