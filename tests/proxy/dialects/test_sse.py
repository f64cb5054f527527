"""proxy.dialects.sse: the frames the proxy writes, and what the SDKs' readers make of them.

The readers are the ``openai`` and ``anthropic`` SDKs' own SSE decoders (a
private module of each): what a client of the proxy runs on every frame.
"""

from __future__ import annotations

import itertools
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


# ---- reading: the splitter ------------------------------------------------------------------

#: Events ended by each of the blank lines the format allows, a comment, a
#: blank line on its own, and a line end inside the data.
MIXED = [
    b"event: a\ndata: 1\n\n",
    b"data: 2\r\n\r\n",
    b"\n",
    b"data: 3\r\r",
    b"event: b\r\ndata: 4\n\r\n",
    b": a comment\r\n\r",
    b"data: 5\rdata: 6\n\r",
    b"\r\n",
    b"data: [DONE]\n\n",
]
MIXED_STREAM = b"".join(MIXED)


def _split(chunks: Iterator[bytes], **bound: int) -> list[sse.Event]:
    splitter = sse.EventSplitter(**bound)
    events = [event for chunk in chunks for event in splitter.feed(chunk)]
    rest = splitter.rest()
    return [*events, *([rest] if rest is not None else [])]


def test_a_stream_splits_into_its_events_as_the_upstream_wrote_them() -> None:
    assert _split(iter([MIXED_STREAM])) == [sse.Event(raw) for raw in MIXED]


def test_every_cut_of_a_stream_mixing_line_ends_gives_the_same_events() -> None:
    expected = [sse.Event(raw) for raw in MIXED]
    for cut in range(len(MIXED_STREAM) + 1):
        assert _split(iter([MIXED_STREAM[:cut], MIXED_STREAM[cut:]])) == expected, cut
    byte_by_byte = (MIXED_STREAM[i : i + 1] for i in range(len(MIXED_STREAM)))
    assert _split(byte_by_byte) == expected


@given(cuts=st.lists(st.integers(0, len(MIXED_STREAM)), max_size=12))
def test_any_cuts_of_a_stream_give_the_same_events(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(MIXED_STREAM)]
    chunks = (MIXED_STREAM[a:b] for a, b in itertools.pairwise(points))
    assert _split(chunks) == [sse.Event(raw) for raw in MIXED]


def test_an_event_ended_by_a_lone_carriage_return_waits_for_the_next_byte() -> None:
    splitter = sse.EventSplitter()
    # "\r\r" ends the event, unless a "\n" comes next: then that is the event's too.
    assert splitter.feed(b"data: x\r\r") == []
    assert splitter.feed(b"\n") == [sse.Event(b"data: x\r\r\n")]
    assert splitter.feed(b"data: y\r\r") == []
    assert splitter.feed(b"data: z\r\r") == [sse.Event(b"data: y\r\r")]
    # Once the stream has ended, no "\n" can come: the held event is whole.
    assert splitter.rest() == sse.Event(b"data: z\r\r")
    assert splitter.rest() is None


def test_what_is_held_when_the_stream_ends_is_the_rest() -> None:
    splitter = sse.EventSplitter()
    assert splitter.feed(b"data: 1\n\ndata: unfinish") == [sse.Event(b"data: 1\n\n")]
    assert splitter.feed(b"ed") == []
    assert splitter.rest() == sse.Event(b"data: unfinished")


def test_an_event_past_the_bound_is_handed_out_in_pieces_as_it_comes() -> None:
    long_event = b"data: " + b"x" * 40 + b"\r\n\r\n"
    stream = b"data: 1\n\n" + long_event + b"data: 2\n\n"
    splitter = sse.EventSplitter(max_event_bytes=16)

    out = [splitter.feed(stream[i : i + 10]) for i in range(0, len(stream), 10)]

    events = [event for chunk in out for event in chunk]
    assert events[0] == sse.Event(b"data: 1\n\n") and events[-1] == sse.Event(b"data: 2\n\n")
    pieces = events[1:-1]
    assert [p.piece for p in pieces] == list(range(1, len(pieces) + 1))
    assert not any(p.whole for p in pieces)
    assert b"".join(p.raw for p in pieces) == long_event
    # Nothing more than the bound (and a chunk) is ever held: once torn, every
    # chunk goes out as it comes, but for what may begin the event's blank line.
    assert all(len(p.raw) <= 16 + 10 for p in pieces)
    assert pieces[-1].raw.endswith(b"\r\n\r\n") and len(pieces) >= 4


def test_the_end_of_an_event_past_the_bound_is_found_across_chunks() -> None:
    splitter = sse.EventSplitter(max_event_bytes=8)
    first = splitter.feed(b"data: " + b"y" * 10 + b"\r\n\r")
    # The "\r\n\r" that may end it is held back, not handed out with the piece.
    assert first == [sse.Event(b"data: " + b"y" * 10, 1)]
    assert splitter.feed(b"\ndata: 2\n\n") == [
        sse.Event(b"\r\n\r\n", 2),
        sse.Event(b"data: 2\n\n"),
    ]


def test_a_stream_ending_inside_an_event_past_the_bound_ends_with_its_last_piece() -> None:
    splitter = sse.EventSplitter(max_event_bytes=8)
    assert splitter.feed(b"data: " + b"z" * 10 + b"\n") == [sse.Event(b"data: " + b"z" * 10, 1)]
    assert splitter.rest() == sse.Event(b"\n", 2)


class _CountingSearch:
    """The splitter's event-end pattern, counting the bytes each search may read."""

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern = pattern
        self.read = 0

    def search(self, buffer: bytearray, start: int = 0) -> re.Match[bytes] | None:
        self.read += len(buffer) - start
        return self.pattern.search(buffer, start)


def test_a_long_event_fed_a_byte_at_a_time_is_not_searched_again_from_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counting = _CountingSearch(sse._EVENT_END)
    monkeypatch.setattr(sse, "_EVENT_END", counting)
    event = b"data: " + b"x" * 20_000 + b"\n\n"
    splitter = sse.EventSplitter()

    out = [e for i in range(len(event)) for e in splitter.feed(event[i : i + 1])]

    assert out == [sse.Event(event)]
    # Each search resumes a few bytes before where the last one stopped: the
    # bytes read grow with the event, not with its square (~200 million).
    assert counting.read <= 5 * len(event)


# ---- reading: an event's fields ---------------------------------------------------------------


def test_an_events_fields_are_its_last_name_and_its_data_lines_joined() -> None:
    read = sse.fields(b'event: x\r\n: a comment\rdata: {"a":\ndata:1}\nevent: y\r\n\r\n')
    assert read == sse.Fields("y", b'{"a":\n1}')
    assert read.json_object() == {"a": 1}


def test_a_field_without_a_colon_has_no_value_and_an_empty_name_is_none() -> None:
    assert sse.fields(b"event:\ndata\ndata\n\n") == sse.Fields(None, b"\n")
    assert sse.fields(b": only a comment\n\n") == sse.Fields(None, None)


@pytest.mark.parametrize("data", [b"[DONE]", b"[1, 2]", b"{not json", b'"text"'])
def test_data_that_is_not_a_json_object_reads_as_none(data: bytes) -> None:
    assert sse.fields(sse.frame(data)).json_object() is None


@given(
    name=st.none() | st.text(_NAME_CHARACTERS, min_size=1, max_size=12),
    data=st.text(st.characters(codec="utf-8"), max_size=40),
)
def test_every_frame_splits_back_into_itself_and_reads_as_its_name_and_data(
    name: str | None, data: str
) -> None:
    framed = sse.frame(data, name)
    assert _split(iter([framed, framed])) == [sse.Event(framed), sse.Event(framed)]
    read = sse.fields(framed)
    assert read.name == name
    assert read.data == re.sub(r"\r\n|\r", "\n", data).encode()
