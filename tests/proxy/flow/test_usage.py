"""proxy.flow.usage: the upstream's own prompt count, read off an answer as it passes."""

from __future__ import annotations

import orjson

from proxy.flow.usage import UsageTap


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
