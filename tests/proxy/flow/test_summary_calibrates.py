"""The summaries the proxy asks calibrate the model that wrote them: a server
that sends no ``usage`` on streams (llama-cpp-python) still states it on the
summary's JSON answer."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.session.service import Conversations
from tests.proxy.inprocess import (
    UPSTREAM_URL,
    RecordingTransport,
    running,
    services_of_app,
    settings_for,
)
from tests.proxy.servers import SUMMARY_TEXT
from tests.synthetic import agent_session

MODEL = "qwen2.5-coder-1.5b-instruct"
#: How much more the upstream counts than our estimate.
FACTOR = 1.2


def _state_of(app: Any) -> Conversations:
    """The conversations service of the running app."""
    return services_of_app(app).conversations


def _upstream(state: Conversations, config: Any, summaries: list[int]) -> Starlette:
    """llama-cpp-python's way: streams without ``usage``, JSON answers with it
    (counting :data:`FACTOR` times our estimate of what it was sent)."""
    counter = state.counter(config)

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if body.get("stream"):
            event = {"choices": [{"index": 0, "delta": {"content": "ok"}}]}
            data = b"data: " + orjson.dumps(event) + b"\n\ndata: [DONE]\n\n"
            return Response(data, media_type="text/event-stream")
        prompt = round(counter.count_request({"messages": body["messages"]}) * FACTOR)
        summaries.append(prompt)
        message = {"role": "assistant", "content": SUMMARY_TEXT}
        return JSONResponse(
            {
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 200},
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.mark.parametrize("summary_model", [None, "another-model"])
def test_a_summary_answer_calibrates_the_model_when_streams_carry_no_usage(
    summary_model: str | None,
) -> None:
    models: dict[str, Any] = {MODEL: {"context_window": 8_192}}
    if summary_model:
        models[MODEL]["summary_model"] = summary_model
    settings = settings_for(models=models, compaction={"summarizer": "llm"})
    summaries: list[int] = []
    transport = RecordingTransport()
    with running(settings, transport) as proxy:
        state = _state_of(proxy.app)
        config = state.model_config(MODEL)
        transport.routes[UPSTREAM_URL] = _upstream(state, config, summaries)
        body = {"model": MODEL, "stream": True, "messages": agent_session(seed=3, steps=40)}
        with proxy.http.stream("POST", f"{proxy.url}/chat/completions", json=body) as reply:
            assert reply.status_code == 200
            reply.read()
        learned = state.models.of(config).ratio
    assert summaries, "no summary was asked"
    if summary_model:
        assert learned is None  # another model's count says nothing of this one's
    else:
        assert learned == pytest.approx(FACTOR, abs=0.02)
