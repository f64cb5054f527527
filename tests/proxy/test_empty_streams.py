"""An upstream that answers an over-long streamed prompt with an empty 200
(llama-cpp-python) teaches the proxy a working limit, so a streamed session
meets it once at most, never again and again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from config import load_settings
from proxy.app import create_app
from proxy.session.service import Conversations
from proxy.state.models import calibration_key
from tests.proxy.inprocess import services_of_app
from tests.proxy.llama_upstream import MODEL, LlamaCppPython, serve_llama_cpp_python
from tests.proxy.servers import serve_in_thread
from tests.synthetic import agent_session

#: Turns of the streamed session, and the size of each tool output: the
#: session grows past 16,384 tokens, half of the 32,768 the table believes.
TURNS = 50
OUTPUT_CHARS = 1_700


class Proxied:
    def __init__(self, server: LlamaCppPython, url: str, state: Conversations) -> None:
        self.server = server
        self.url = url
        self.state = state
        self.http = httpx.Client(timeout=60)

    def stream(self, messages: list[dict[str, Any]], key: str = "caller-a") -> tuple[int, str]:
        """A streamed chat request; its status and everything the client read."""
        body = {"model": MODEL, "messages": messages, "stream": True}
        headers = {"authorization": f"Bearer {key}"}
        with self.http.stream(
            "POST", f"{self.url}/chat/completions", json=body, headers=headers
        ) as answer:
            return answer.status_code, answer.read().decode()

    def whole(self, messages: list[dict[str, Any]]) -> httpx.Response:
        body = {"model": MODEL, "messages": messages}
        return self.http.post(f"{self.url}/chat/completions", json=body)

    def preview(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": MODEL, "messages": messages}
        answer = self.http.post(f"{self.url}/compaction/preview", json=body)
        report: dict[str, Any] = answer.json()["report"]
        return report

    def working_limit(self, model: str = MODEL) -> int | None:
        return self.state.models.working_limit(self.state.model_config(model))


Start = Callable[..., Proxied]


@pytest.fixture
def start() -> Iterator[Start]:
    """The proxy (extractive summaries, memory store) before a fake llama-cpp-python
    whose real window is 8,192 tokens, both on loopback; ``store`` settings apart."""
    with ExitStack() as stack:

        def started(**store: Any) -> Proxied:
            server, upstream = stack.enter_context(serve_llama_cpp_python(n_ctx=8_192))
            settings = load_settings(
                None,
                upstream={"base_url": upstream, "trust_env": False},
                store={"url": "memory://", **store},
                compaction={"summarizer": "extractive"},
            )
            app: Any = create_app(settings)
            url = stack.enter_context(serve_in_thread(app))
            proxied = Proxied(server, url + "/v1", _state_of(app))
            stack.callback(proxied.http.close)
            return proxied

        yield started


def _state_of(app: Any) -> Conversations:
    """The conversations service of the running app."""
    return services_of_app(app).conversations


def _turns(seed: int) -> list[list[dict[str, Any]]]:
    """What an agent sends, turn by turn: the conversation up to each tool result."""
    session = agent_session(seed=seed, steps=TURNS, output_chars=OUTPUT_CHARS)
    ends = [i + 1 for i, message in enumerate(session) if message["role"] == "tool"]
    return [session[:end] for end in ends]


def _client_error(status: int, text: str) -> bool:
    return status != 200 or "upstream_empty" in text or '"error"' in text


def test_a_fifty_turn_streamed_session_meets_the_small_window_once_at_most(start: Start) -> None:
    proxied = start()
    turns = _turns(seed=22)
    assert len(turns) == TURNS
    errors = []
    for number, messages in enumerate(turns, 1):
        status, text = proxied.stream(messages)
        if _client_error(status, text):
            errors.append(number)
        else:
            assert "next step" in text, text
    asked = proxied.server.asked
    refused = [i for i, one in enumerate(asked) if one.refused]
    print(
        f"\n{TURNS} streamed turns: {len(asked)} upstream requests, {len(refused)} empty "
        f"streams, client errors at turns {errors or 'none'}; the session grew to "
        f"{proxied.server.prompt_tokens({'model': MODEL, 'messages': turns[-1]}):,} tokens, "
        f"the largest prompt sent had {max(one.prompt_tokens for one in asked):,}"
    )
    assert refused, "precondition: the session outgrew the real window"
    assert len(errors) <= 1, f"the client met an error at turns {errors}"
    # After the lesson, every request is compacted under the real window.
    after = asked[refused[0] + 1 :]
    assert after and all(one.prompt_tokens < proxied.server.n_ctx for one in after)
    assert all(one.streamed for one in asked)


def test_an_empty_stream_above_every_answered_size_narrows_the_window_for_every_conversation(
    start: Start,
) -> None:
    proxied = start()
    status, text = proxied.stream(_turns(seed=22)[30])  # ~10,000 tokens: over the window
    assert status == 200 and "next step" in text and "upstream_empty" not in text
    first, retry = proxied.server.asked
    assert first.refused and not retry.refused  # retried once, compacted
    limit = proxied.working_limit()
    assert limit is not None and limit < 8_192
    # Another conversation on the model is compacted under it on its first try.
    other = _turns(seed=23)[30]
    report = proxied.preview(other)
    assert (report["window_source"], report["context_window"]) == ("empty-stream", limit)
    status, text = proxied.stream(other, key="caller-b")
    assert status == 200 and "next step" in text
    assert len(proxied.server.asked) == 3 and not proxied.server.asked[-1].refused


def test_an_empty_stream_at_a_size_already_answered_is_an_error_and_teaches_nothing(
    start: Start,
) -> None:
    proxied = start()
    turns = _turns(seed=24)
    assert proxied.stream(turns[16])[0] == 200  # ~5,500 tokens answered
    proxied.server.broken_streams = 1
    status, text = proxied.stream(turns[15])  # smaller: not a matter of size
    assert status == 200 and "upstream_empty" in text
    assert len(proxied.server.asked) == 2  # not retried
    assert proxied.working_limit() is None
    assert proxied.preview(turns[40])["window_source"] == "table"


def test_a_retry_that_is_also_empty_reaches_the_client_as_one_error_event(
    start: Start,
) -> None:
    proxied = start()
    proxied.server.broken_streams = 2  # the retry too, whatever its size
    status, text = proxied.stream(_turns(seed=22)[20])  # ~7,000 tokens, nothing answered yet
    assert status == 200 and text.count("upstream_empty") >= 1
    assert len(proxied.server.asked) == 2  # one retry, never a second
    # The next request of the model is held to what the two taught, and answered.
    status, text = proxied.stream(_turns(seed=23)[20])
    assert status == 200 and "next step" in text
    assert len(proxied.server.asked) == 3


def test_no_callers_empty_stream_narrows_the_window_below_what_was_answered(
    start: Start,
) -> None:
    proxied = start()
    turns = _turns(seed=24)
    assert proxied.stream(turns[20], key="caller-a")[0] == 200  # ~6,000 tokens answered
    answered = proxied.state.models.answered(proxied.state.model_config(MODEL))
    proxied.server.broken_streams = 1
    status, text = proxied.stream(_turns(seed=22)[21], key="caller-b")  # a little more
    assert status == 200 and "next step" in text  # retried compacted
    assert proxied.working_limit() == answered  # not the 3/4 of what failed: answered


def test_an_answer_above_the_working_limit_raises_it(start: Start) -> None:
    proxied = start()
    state = proxied.state
    config = state.model_config(MODEL)
    assert state.models.empty_stream(config, 10_000).overflow
    assert state.models.working_limit(config) == 7_500
    state.models.prove(config, 7_900)  # an answer's usage: the window is at least that
    assert state.models.working_limit(config) == 7_900
    state.models.stream_answered(config, 8_000)  # a stream that began, by our estimate
    assert state.models.working_limit(config) == 8_000
    state.models.stream_answered(config, 6_000)  # a smaller one lowers nothing
    assert state.models.working_limit(config) == 8_000


def test_working_limits_are_capped_at_the_model_rows_like_learned_windows(start: Start) -> None:
    proxied = start(max_model_rows=2)
    state = proxied.state
    for model in ("qwen2.5-a", "qwen2.5-b", "qwen2.5-c"):
        config = state.model_config(model)
        state.models.stream_answered(config, 3_000)
        assert state.models.empty_stream(config, 10_000).overflow
    keys = [calibration_key(state.model_config(m)) for m in ("qwen2.5-b", "qwen2.5-c")]
    assert list(state.models) == keys  # the least recently narrowed went, all it knew


def test_a_whole_answer_over_the_window_states_it_and_teaches_it(start: Start) -> None:
    proxied = start()
    answer = proxied.whole(_turns(seed=22)[30])
    assert answer.status_code == 200, answer.text
    first, retry = proxied.server.asked
    assert first.refused and not retry.refused
    assert proxied.preview(_turns(seed=23)[30])["window_source"] == "learned"
