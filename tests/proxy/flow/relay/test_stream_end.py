"""proxy.flow.relay.stream_end: whether a stream said something, and ended as its API ends one."""

from __future__ import annotations

import pytest

from proxy.dialects import sse
from proxy.flow.relay.stream_end import ENDINGS, StreamEnd

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TEXT = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\n'
DONE = b"data: [DONE]\n\n"


def _watched(api: str, *chunks: bytes) -> StreamEnd:
    watch = StreamEnd.of(api)
    assert watch is not None
    for chunk in chunks:
        watch.feed(chunk)
    return watch


def test_a_role_chunk_says_nothing_and_ends_nothing() -> None:
    watch = _watched("chat", ROLE, b": keep-alive\n\n")
    assert not watch.said and not watch.ended


@pytest.mark.parametrize("said", [TEXT, USAGE], ids=["text", "usage"])
def test_a_chat_stream_says_something_with_text_or_usage_and_ends_with_done(said: bytes) -> None:
    watch = _watched("chat", ROLE, said)
    assert watch.said and not watch.ended
    watch.feed(DONE)
    assert watch.ended


def test_a_chat_streams_done_is_told_without_parsing_it_as_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``[DONE]`` is no JSON: parsed, it would raise and be caught once per stream."""
    parsed: list[bytes | None] = []
    json_object = sse.Fields.json_object

    def counted(found: sse.Fields) -> object:
        parsed.append(found.data)
        return json_object(found)

    monkeypatch.setattr(sse.Fields, "json_object", counted)
    watch = _watched("chat", ROLE, TEXT, DONE)
    assert watch.said and watch.ended
    assert parsed == [ROLE[6:-2], TEXT[6:-2]]


def test_events_split_anywhere_are_read_whole() -> None:
    stream = ROLE + TEXT + DONE
    watch = _watched("chat", *(stream[i : i + 7] for i in range(0, len(stream), 7)))
    assert watch.said and watch.ended


def test_an_error_event_ends_a_stream_in_each_api() -> None:
    assert _watched("chat", b'data: {"error":{"message":"x"}}\n\n').ended
    assert _watched("anthropic", b'event: error\ndata: {"type":"error"}\n\n').ended
    assert _watched("responses", b'event: error\ndata: {"type":"error"}\n\n').ended


@pytest.mark.parametrize(
    ("api", "opening", "closing"),
    [
        ("anthropic", b'event: message_start\ndata: {"type":"message_start"}\n\n', b"message_stop"),
        ("responses", b'data: {"type":"response.created"}\n\n', b"response.incomplete"),
    ],
)
def test_the_typed_apis_open_and_close_by_event_type(
    api: str, opening: bytes, closing: bytes
) -> None:
    watch = _watched(api, opening)
    assert not watch.said and not watch.ended
    # A delta that mentions the last event's name in its text ends nothing.
    watch.feed(b'data: {"type":"delta","text":"message_stop response.completed"}\n\n')
    assert watch.said and not watch.ended
    watch.feed(b'data: {"type":"' + closing + b'"}\n\n')
    assert watch.ended


def test_an_api_it_does_not_know_is_not_watched() -> None:
    assert StreamEnd.of("completions") is None
    assert set(ENDINGS) == {"chat", "anthropic", "responses"}
