"""proxy.flow.usage: the upstream's usage of an answer, read off its bytes as they pass."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.flow.usage import MAX_USAGE_BYTES, UsageTap
from proxy.upstream.usage import Usage


def _tap() -> tuple[UsageTap, list[int]]:
    seen: list[int] = []
    return UsageTap(seen.append), seen


def test_a_json_answer_reports_its_prompt_tokens() -> None:
    tap, seen = _tap()
    body = {"choices": [], "usage": {"prompt_tokens": 12_546, "completion_tokens": 9}}
    tap.feed(orjson.dumps(body))
    assert seen == []  # nothing before the answer is whole
    tap.close()
    assert seen == [12_546]


def test_a_stream_reports_the_count_of_its_usage_event_split_across_chunks() -> None:
    tap, seen = _tap()
    events = (
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":13600,"completion_tokens":5}}\n\n'
        b"data: [DONE]\n\n"
    )
    for size in (1, 7, 64):  # wherever the chunks happen to be cut
        tap, seen = _tap()
        for start in range(0, len(events), size):
            tap.feed(events[start : start + size])
        tap.close()
        assert seen == [13_600], size


def test_text_the_model_wrote_cannot_pose_as_usage() -> None:
    tap, seen = _tap()
    content = 'the JSON was {"prompt_tokens": 5}'
    tap.feed(orjson.dumps({"choices": [{"message": {"content": content}}]}))
    tap.close()
    assert seen == []


def test_anthropic_input_tokens_count_too() -> None:
    tap, seen = _tap()
    tap.feed(b'{"usage":{"input_tokens":2048,"output_tokens":3}}')
    tap.close()
    assert seen == [2_048]


def _llama_cpp_stream(*, usage: bool, cache_n: int | None = 6_100) -> bytes:
    """A llama.cpp server stream: its last event carries ``timings`` (and
    ``usage`` only where the server sends it)."""
    timings: dict[str, object] = {"prompt_n": 1_250, "prompt_ms": 310.5, "predicted_n": 9}
    if cache_n is not None:
        timings["cache_n"] = cache_n
    last: dict[str, object] = {
        "choices": [{"finish_reason": "stop", "index": 0, "delta": {}}],
        "timings": timings,
    }
    if usage:
        last["usage"] = {"prompt_tokens": 7_350, "completion_tokens": 9}
    return (
        b'data: {"choices":[{"delta":{"content":"ok"}}]}\n\n'
        + b"data: "
        + orjson.dumps(last)
        + b"\n\ndata: [DONE]\n\n"
    )


def test_a_llama_cpp_stream_without_usage_counts_its_prompt_from_timings() -> None:
    """``prompt_n`` is only what the server evaluated; with what it reused from
    its cache (``cache_n``) it is the whole prompt."""
    events = _llama_cpp_stream(usage=False)
    for size in (1, 5, 64):
        tap, seen = _tap()
        for start in range(0, len(events), size):
            tap.feed(events[start : start + size])
        tap.close()
        assert seen == [1_250 + 6_100], size


def test_usage_is_preferred_to_timings() -> None:
    tap, seen = _tap()
    tap.feed(_llama_cpp_stream(usage=True))
    tap.close()
    assert seen == [7_350]


def test_timings_without_the_reused_part_count_nothing() -> None:
    """``prompt_n`` alone is the new turn of a conversation the server has
    cached, not its prompt: no count rather than a far too small one."""
    tap, seen = _tap()
    tap.feed(_llama_cpp_stream(usage=False, cache_n=None))
    tap.close()
    assert seen == []


def test_text_the_model_wrote_cannot_pose_as_timings() -> None:
    tap, seen = _tap()
    content = '{"prompt_n": 5, "cache_n": 6}'
    tap.feed(orjson.dumps({"choices": [{"message": {"content": content}}]}))
    tap.close()
    assert seen == []


# --- the whole usage: cache read and written, output --------------------------------


def _read(
    answer: bytes, *, sizes: tuple[int, ...] = (1, 3, 7, 64, 1 << 20), cached: bool = False
) -> Usage | None:
    """What a tap reads of ``answer`` cut into chunks of each size (the same
    whatever the cut); the prompt it reported is the answer's own step's."""
    found: set[Usage | None] = set()
    for size in sizes:
        tap = UsageTap(cached=cached)
        for start in range(0, len(answer), size):
            tap.feed(answer[start : start + size])
        tap.close()
        found.add(tap.usage)
    assert len(found) == 1, found
    return found.pop()


def _events(*events: object) -> bytes:
    return b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events)


CHAT_USAGE = {
    "prompt_tokens": 12_000,
    "completion_tokens": 310,
    "total_tokens": 12_310,
    "prompt_tokens_details": {"cached_tokens": 11_264, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 128},
}
#: OpenAI reports no writes: the part not read is taken for written.
CHAT_READ = Usage(prompt=12_000, cache_read=11_264, cache_write=736, output=310)


def test_a_chat_answer_reports_its_cached_part_and_output() -> None:
    answer = {"choices": [{"message": {"content": '{"usage": 1}'}}], "usage": CHAT_USAGE}
    assert _read(orjson.dumps(answer)) == CHAT_READ


def test_a_chat_stream_reports_the_usage_of_its_last_event() -> None:
    stream = (
        _events(
            {"choices": [{"delta": {"content": "hi"}}], "usage": None},
            {"choices": [], "usage": CHAT_USAGE},
        )
        + b"data: [DONE]\n\n"
    )
    assert _read(stream) == CHAT_READ


RESPONSES_USAGE = {
    "input_tokens": 5_000,
    "input_tokens_details": {"cached_tokens": 4_096},
    "output_tokens": 700,
    "output_tokens_details": {"reasoning_tokens": 600},
    "total_tokens": 5_700,
}
RESPONSES_READ = Usage(prompt=5_000, cache_read=4_096, cache_write=904, output=700)


def test_a_responses_answer_whole_and_streamed_reports_its_usage() -> None:
    response = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
    assert _read(orjson.dumps({**response, "usage": RESPONSES_USAGE})) == RESPONSES_READ
    stream = _events(
        {"type": "response.created", "response": {**response, "usage": None}},
        {"type": "response.output_text.delta", "delta": 'a } { " brace'},
        {"type": "response.completed", "response": {**response, "usage": RESPONSES_USAGE}},
    )
    assert _read(stream) == RESPONSES_READ


def _anthropic_event(name: str, data: dict[str, object]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"


ANTHROPIC_START = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 2_048,
    "cache_read_input_tokens": 30_000,
    "cache_creation": {"ephemeral_5m_input_tokens": 2_048, "ephemeral_1h_input_tokens": 0},
    "output_tokens": 1,
    "service_tier": "standard",
}
#: Its ``input_tokens`` leaves the cache out: the prompt is the sum.
ANTHROPIC_READ = Usage(prompt=32_060, cache_read=30_000, cache_write=2_048, output=412)


def test_an_anthropic_answer_reports_its_cache_reads_and_writes() -> None:
    answer = {"type": "message", "content": [], "usage": {**ANTHROPIC_START, "output_tokens": 412}}
    prompts: list[int] = []
    tap = UsageTap(prompts.append, cached=True)
    tap.feed(orjson.dumps(answer))
    tap.close()
    assert (tap.usage, prompts) == (ANTHROPIC_READ, [32_060])


def test_an_anthropic_stream_takes_the_prompt_from_its_start_and_the_output_from_its_end() -> None:
    stream = (
        _anthropic_event("message_start", {"message": {"content": [], "usage": ANTHROPIC_START}})
        + _anthropic_event(
            "content_block_delta",
            {"index": 0, "delta": {"type": "text_delta", "text": 'say "usage": {"x": 1} \\'}},
        )
        + _anthropic_event("message_delta", {"delta": {}, "usage": {"output_tokens": 412}})
        + _anthropic_event("message_stop", {})
    )
    assert _read(stream, cached=True) == ANTHROPIC_READ


def test_anthropics_server_side_compaction_steps_are_all_counted() -> None:
    """The top level counts the answer's own step only; every step is billed."""
    usage = {
        "input_tokens": 23_000,
        "output_tokens": 1_000,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "iterations": [
            {"type": "compaction", "input_tokens": 180_000, "output_tokens": 3_500},
            {"type": "message", "input_tokens": 23_000, "output_tokens": 1_000},
        ],
    }
    prompts: list[int] = []
    tap = UsageTap(prompts.append, cached=True)
    tap.feed(orjson.dumps({"type": "message", "usage": usage}))
    tap.close()
    assert tap.usage == Usage(
        prompt=203_000, cache_write=0, output=4_500, server_compaction=183_500
    )
    assert prompts == [23_000]  # calibration: what the model read of the request


def test_a_llama_cpp_stream_without_usage_reads_its_cache_and_output_from_timings() -> None:
    assert _read(_llama_cpp_stream(usage=False)) == Usage(
        prompt=7_350, cache_read=6_100, cache_write=1_250, output=9
    )


def test_text_the_model_wrote_cannot_pose_as_a_usage_object() -> None:
    content = '{"usage": {"prompt_tokens": 5, "completion_tokens": 6}}'
    answer = orjson.dumps({"choices": [{"message": {"content": content}}]})
    assert _read(answer) is None


@pytest.mark.parametrize("size", [MAX_USAGE_BYTES, 2 * MAX_USAGE_BYTES])
def test_a_usage_object_beyond_the_bound_is_not_read_nor_held(size: int) -> None:
    huge = {"prompt_tokens": 9, "padding": "x" * size}
    tap = UsageTap()
    data = orjson.dumps({"usage": huge})
    held = []
    for start in range(0, len(data), 4096):
        tap.feed(data[start : start + 4096])
        held.append(len(tap._object or b""))
    assert max(held) <= MAX_USAGE_BYTES + 4096  # at most one chunk past the bound
    tap.close()
    assert tap.usage is None


def test_braces_and_escaped_quotes_inside_a_usage_strings_do_not_end_it() -> None:
    """Wherever the chunks are cut, even between a backslash and what it escapes."""
    usage = {"note": 'a \\" } { "usage": {', "prompt_tokens": 40, "completion_tokens": 2}
    assert _read(orjson.dumps({"usage": usage})) == Usage(prompt=40, cache_write=40, output=2)


def test_a_bare_count_is_read_whole_when_the_answer_is_the_count() -> None:
    """Anthropic's ``count_tokens`` answers ``{"input_tokens": N}``, no ``usage`` around it."""
    for size in (1, 5, 64):
        prompts: list[int] = []
        tap = UsageTap(prompts.append, bare=True)
        answer = b' {"input_tokens": 2048}'
        for start in range(0, len(answer), size):
            tap.feed(answer[start : start + size])
        tap.close()
        assert prompts == [2_048], size


def test_a_usage_object_whole_in_its_chunk_is_parsed_not_followed_byte_by_byte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A JSON answer read whole, its usage with the details objects OpenAI sends:
    one parse, and the scan that follows an object across chunks never runs."""
    scans: list[int] = []
    scan = UsageTap._scan

    def counted(tap: UsageTap, data: bytes, start: int) -> int | None:
        scans.append(start)
        return scan(tap, data, start)

    monkeypatch.setattr(UsageTap, "_scan", counted)
    usage = {
        "prompt_tokens": 1_200,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 1_024, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    assert _read(orjson.dumps({"id": "x", "usage": usage}), sizes=(1 << 20,)) == Usage(
        prompt=1_200, cache_read=1_024, cache_write=176, output=7
    )
    assert scans == []


_TEXT = st.text(alphabet='{}"\\ ax:,\n', max_size=8)
_VALUES = st.recursive(
    st.integers(0, 10**6) | _TEXT,
    lambda inner: st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)


@given(
    extra=st.dictionaries(_TEXT, _VALUES, max_size=4),
    before=_TEXT,
    after=_TEXT,
    prompt=st.integers(0, 10**6),
)
def test_a_usage_object_reads_the_same_whole_or_cut_anywhere(
    extra: dict[str, Any], before: str, after: str, prompt: int
) -> None:
    """Braces, quotes and backslashes in its strings, objects inside it, text
    around it: read in one chunk (parsed whole) or cut in pieces (followed
    byte by byte), it says what the object says."""
    usage = {**extra, "prompt_tokens": prompt}
    answer = orjson.dumps({"before": before, "usage": usage, "after": after})
    assert _read(answer, sizes=(1, 5, 1 << 20)) == Usage(prompt=prompt, cache_write=prompt)
