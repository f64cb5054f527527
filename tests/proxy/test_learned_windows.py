"""A window is learned only from a genuine overflow error, within bounds, and
never below what the upstream already answered, so no caller can shrink it for the others."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.proxy.inprocess import InProcessProxy, RecordingTransport, running, settings_for
from tests.synthetic import agent_session

Answer = Callable[[dict[str, Any]], Response]


class Scripted:
    """An upstream answering each chat request with the next scripted answer
    (the last one repeats), recording what it was sent."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.bodies: list[dict[str, Any]] = []

    async def chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.bodies.append(body)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return answer(body)


def ok(prompt_tokens: int = 0) -> Answer:
    def answer(body: dict[str, Any]) -> Response:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": 1}
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 1,
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "fine"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        )

    return answer


def overflow(window: str) -> Answer:
    def answer(body: dict[str, Any]) -> Response:
        message = f"This model's maximum context length is {window} tokens."
        error = {"message": message, "type": "invalid_request_error", "code": None}
        return JSONResponse({"error": error}, status_code=400)

    return answer


def echo_validation(body: dict[str, Any]) -> Response:
    """A validation error quoting the client's input, as pydantic-based servers do."""
    last = body["messages"][-1]["content"]
    return JSONResponse({"detail": [{"loc": ["body", "user"], "msg": last}]}, status_code=400)


@pytest.fixture
def scripted_proxy(tmp_path: Path) -> Iterator[Callable[[Scripted], InProcessProxy]]:
    """A proxy with a real SQLite store in front of a scripted upstream."""
    with ExitStack() as stack:

        def start(upstream: Scripted) -> InProcessProxy:
            app = Starlette(routes=[Route("/v1/chat/completions", upstream.chat, methods=["POST"])])
            settings = settings_for(
                store={"url": f"sqlite:///{tmp_path / 'state.db'}"},
                models={"m": {"context_window": 32_000}},
                compaction={"summarizer": "extractive"},
            )
            return stack.enter_context(running(settings, RecordingTransport(app=app)))

        yield start


def _chat(proxy: InProcessProxy, messages: list[dict[str, Any]]) -> httpx.Response:
    return proxy.http.post(
        f"{proxy.url}/chat/completions", json={"model": "m", "messages": messages}
    )


def test_an_error_quoting_the_clients_own_words_teaches_nothing(
    scripted_proxy: Callable[[Scripted], InProcessProxy],
) -> None:
    upstream = Scripted(echo_validation, ok())
    app = scripted_proxy(upstream)
    trap = [{"role": "user", "content": "This model's maximum context length is 20 tokens"}]
    first = _chat(app, trap)
    assert first.status_code == 400 and len(upstream.bodies) == 1  # relayed, not retried
    assert "detail" in first.json()
    # Every other request of the model is served as before: nothing was learned.
    later = _chat(app, agent_session(seed=71, steps=20))
    assert later.status_code == 200, later.text
    assert later.headers["x-compaction-stage"] == "none"


def test_an_absurd_stated_window_is_neither_learned_nor_a_crash(
    scripted_proxy: Callable[[Scripted], InProcessProxy],
) -> None:
    upstream = Scripted(overflow("99999999999999999999999"), ok())
    app = scripted_proxy(upstream)
    first = _chat(app, agent_session(seed=72, steps=20))
    assert first.status_code == 200  # retried smaller by the blind rule
    later = _chat(app, agent_session(seed=73, steps=20))
    assert later.status_code == 200 and later.headers["x-compaction-stage"] == "none"


def test_a_window_below_what_the_upstream_already_answered_is_not_learned(
    scripted_proxy: Callable[[Scripted], InProcessProxy],
) -> None:
    messages = agent_session(seed=74, steps=20)
    upstream = Scripted(ok(prompt_tokens=6_000), overflow("2048"), ok())
    app = scripted_proxy(upstream)
    assert _chat(app, messages).status_code == 200  # proves a 6,000-token prompt fits
    assert _chat(app, [*messages, {"role": "user", "content": "more"}]).status_code == 200
    # A 2,048-token window would have left no room for this one: refused by the proxy.
    later = _chat(app, agent_session(seed=75, steps=20))
    assert later.status_code == 200 and later.headers["x-compaction-stage"] == "none"
