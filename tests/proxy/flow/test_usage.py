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
