"""proxy.dialects.sse: the frames the proxy writes, and what the SDKs' readers make of them.

The readers are the ``openai`` and ``anthropic`` SDKs' own SSE decoders (a
private module of each): what a client of the proxy runs on every frame.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import anthropic._streaming
import openai._streaming
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.dialects import sse

#: What each SDK reads a stream into: ``(event name, data)`` per event.
Reader = Callable[[Iterator[bytes]], list[tuple[str | None, str]]]


def _openai(chunks: Iterator[bytes]) -> list[tuple[str | None, str]]:
    return [(e.event, e.data) for e in openai._streaming.SSEDecoder().iter_bytes(chunks)]


def _anthropic(chunks: Iterator[bytes]) -> list[tuple[str | None, str]]:
    return [(e.event, e.data) for e in anthropic._streaming.SSEDecoder().iter_bytes(chunks)]


#: What an event name may hold (any text the proxy writes is UTF-8).
_NAME_CHARACTERS = st.characters(codec="utf-8", exclude_characters="\r\n")

READERS = pytest.mark.parametrize("read", [_openai, _anthropic], ids=["openai", "anthropic"])


def test_an_unnamed_event_is_one_data_line_ended_by_a_blank_line() -> None:
    assert sse.frame(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert sse.frame('{"a":1}') == b'data: {"a":1}\n\n'


def test_a_named_event_gives_its_name_before_the_data() -> None:
    assert sse.frame(b"{}", "message_start") == b"event: message_start\ndata: {}\n\n"


def test_a_json_event_is_the_payload_written_on_one_line() -> None:
    payload = {"type": "error", "message": "two\nlines", "text": "é"}
    framed = sse.json_frame(payload, "error")
    assert framed == b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"
    assert framed.count(b"\n") == 3  # the line break in the text is escaped, not written


def test_chat_completions_ends_its_stream_with_done() -> None:
    assert sse.DONE == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("data", "lines"),
    [
        ("a\nb", [b"a", b"b"]),
        ("a\r\nb", [b"a", b"b"]),
        ("a\rb", [b"a", b"b"]),
        ("a\n", [b"a", b""]),
        ("\n\n", [b"", b"", b""]),
        ("a\r\n\r\nb", [b"a", b"", b"b"]),
    ],
)
def test_data_over_several_lines_is_one_data_field_per_line(data: str, lines: list[bytes]) -> None:
    framed = sse.frame(data, "x")
    assert framed == b"event: x\n" + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
    body = framed[: -len(b"\n\n")]
    assert b"\n\n" not in body and b"\r" not in body  # no line of data can end the event early


@pytest.mark.parametrize("name", ["a\nb", "a\rb", "done\r\n", ""])
def test_an_event_name_that_is_not_one_non_empty_line_is_refused(name: str) -> None:
    # A reader would take the rest for another field, or an empty name for none.
    with pytest.raises(ValueError, match="non-empty line"):
        sse.frame(b"{}", name)


@READERS
@given(
    events=st.lists(
        st.tuples(
            st.none() | st.text(_NAME_CHARACTERS, min_size=1, max_size=12),
            st.text(st.characters(codec="utf-8"), max_size=40),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_every_frame_reads_back_as_its_name_and_data(
    read: Reader, events: list[tuple[str | None, str]]
) -> None:
    stream = b"".join(sse.frame(data, name) for name, data in events)
    # A reader sees any of the three line breaks as one, and gives ``\n`` back.
    expected = [(name, re.sub(r"\r\n|\r", "\n", data)) for name, data in events]
    assert read(iter([stream])) == expected
    assert read(iter(stream[i : i + 1] for i in range(len(stream)))) == expected  # byte by byte


@READERS
def test_json_spread_over_lines_is_read_back_whole(read: Reader) -> None:
    payload: dict[str, Any] = {"type": "message_delta", "delta": {"text": "x"}, "n": [1, 2]}
    pretty = orjson.dumps(payload, option=orjson.OPT_INDENT_2)
    assert pretty.count(b"\n") > 3
    [(name, data)] = read(iter([sse.frame(pretty, "message_delta")]))
    assert name == "message_delta" and orjson.loads(data) == payload
