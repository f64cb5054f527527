"""proxy.summarizer against a mock transport (a unit test of one module)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from compaction import SummarizationError
from proxy.summarizer import UpstreamSummarizer


def _reply(content: Any = "## Goal\nx", **message: Any) -> httpx.Response:
    return httpx.Response(
        200, json={"choices": [{"message": {"role": "assistant", "content": content, **message}}]}
    )


def _summarize(handler: Any) -> tuple[str, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        response: httpx.Response = handler(request, len(seen))
        return response

    async def run() -> str:
        async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as client:
            summarizer = UpstreamSummarizer(client, "http://up/v1", "m", {"authorization": "k"})
            return await summarizer([{"role": "user", "content": "x"}], 600)

    return asyncio.run(run()), seen


def test_request_shape_and_reply() -> None:
    text, seen = _summarize(lambda request, n: _reply())
    assert text == "## Goal\nx"
    assert seen == [
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "temperature": 0,
            "max_tokens": 600,
            "stream": False,
        }
    ]


def test_reasoning_models_are_asked_again_with_max_completion_tokens() -> None:
    refusal = httpx.Response(
        400,
        json={
            "error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                "type": "invalid_request_error",
            }
        },
    )
    text, seen = _summarize(lambda request, n: refusal if n == 1 else _reply())
    assert text == "## Goal\nx"
    assert "max_tokens" not in seen[1] and "temperature" not in seen[1]
    assert seen[1]["max_completion_tokens"] == 600


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(500, text="boom"),
        httpx.Response(200, text="not json"),
        httpx.Response(200, json={"choices": []}),
        _reply(content=""),
        _reply(content=None, tool_calls=[{"id": "c", "type": "function"}]),
    ],
)
def test_unusable_answers_are_summarization_errors(response: httpx.Response) -> None:
    with pytest.raises(SummarizationError):
        _summarize(lambda request, n: response)
