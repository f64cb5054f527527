"""A growing session's next request, read as its previous one plus what is new:
the same answers, headers and forwarded bytes as a full read, errors included."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fastapi import FastAPI

from compaction.conversation.incremental import MIN_READING_BYTES, CacheFigures, ReadingCache
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.synthetic import agent_session

MODELS = {"small": {"context_window": 16_000}, "huge": {"context_window": 1_000_000}}
TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]


def _post(proxy: InProcessProxy, raw: bytes, key: str = "sk-alice") -> Any:
    return proxy.http.post(
        "/v1/chat/completions",
        content=raw,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )


def _bodies(model: str, turns: int) -> list[bytes]:
    """One session's requests, each resending the previous one's messages;
    ``tools`` after the array and spaced JSON, as SDKs write it."""
    messages = agent_session(seed=7, steps=40 + turns * 4, output_chars=2_000)
    out = []
    for turn in range(turns):
        upto = 60 + turn * 8
        body = {"model": model, "messages": messages[:upto], "tools": TOOLS, "stream": False}
        out.append(orjson.dumps(body).replace(b'","', b'", "'))
    return out


def _session(proxy: InProcessProxy, bodies: list[bytes]) -> list[tuple[int, dict[str, str]]]:
    seen = []
    for raw in bodies:
        reply = _post(proxy, raw)
        headers = {k: v for k, v in reply.headers.items() if k.startswith("x-compaction-")}
        headers.pop("x-compaction-id", None)  # drawn at random
        seen.append((reply.status_code, headers))
    return seen


def _figures(proxy: InProcessProxy) -> CacheFigures:
    """The reading cache's figures, from the state the FastAPI app inside the
    middleware holds."""
    app = proxy.app
    while not isinstance(app, FastAPI):
        app = app.app
    figures: CacheFigures = app.state.services.conversations.readings.figures()
    return figures


def test_a_growing_session_is_forwarded_and_compacted_as_with_every_request_read_in_full(
    start_app: AppFactory,
) -> None:
    for model in ("huge", "small"):
        bodies = _bodies(model, 6)
        settings = {"models": MODELS, "compaction": {"summarizer": "extractive"}}
        incremental = start_app(**settings)
        full = start_app(server={"incremental_cache_mb": 0}, **settings)
        assert _session(incremental, bodies) == _session(full, bodies)
        sent = [a.body for a in incremental.transport.asked()]
        assert sent == [a.body for a in full.transport.asked()]


def test_the_next_request_of_a_session_reuses_the_previous_reading(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS)
    bodies = _bodies("huge", 4)
    _session(proxy, bodies)
    figures = _figures(proxy)
    assert (figures.hits, figures.misses) == (3, 1)
    assert figures.readings == 1
    assert 0 < figures.bytes <= figures.limit


def test_a_body_too_small_for_the_reading_cache_is_not_looked_up_in_it(
    start_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most requests are under the cache's size: read_call asks that once and
    goes straight on, neither searching the cache nor offering it the body."""
    looked_up: list[int] = []
    find = ReadingCache.find

    def recording(self: ReadingCache, owner: str, raw: bytes, max_tail: int | None = None) -> Any:
        looked_up.append(len(raw))
        return find(self, owner, raw, max_tail)

    monkeypatch.setattr(ReadingCache, "find", recording)
    proxy = start_app(models=MODELS)
    small = orjson.dumps({"model": "huge", "messages": [{"role": "user", "content": "Hi"}]})
    big = _bodies("huge", 1)[0]
    assert len(small) < MIN_READING_BYTES <= len(big)
    assert _post(proxy, small).status_code == 200
    assert looked_up == []
    assert _post(proxy, big).status_code == 200
    assert looked_up == [len(big)]
    assert _figures(proxy).readings == 1  # the large one, remembered


def test_another_callers_identical_request_is_read_in_full(start_app: AppFactory) -> None:
    proxy = start_app(models=MODELS)
    first, second = _bodies("huge", 2)
    assert _post(proxy, first, key="sk-alice").status_code == 200
    assert _post(proxy, second, key="sk-bob").status_code == 200
    figures = _figures(proxy)
    assert (figures.hits, figures.misses) == (0, 2)


def test_a_bad_message_in_what_is_new_gets_the_error_a_full_read_gives(
    start_app: AppFactory,
) -> None:
    first = _bodies("huge", 1)[0]
    body = orjson.loads(first)
    count = len(body["messages"])
    bad = orjson.dumps({**body, "messages": [*body["messages"], {"content": "no role"}]})
    repeated = first[:-1] + b', "stream": true}'
    answers = []
    for cache in (256, 0):
        proxy = start_app(models=MODELS, server={"incremental_cache_mb": cache})
        assert _post(proxy, first).status_code == 200
        answers.append(
            [(r.status_code, r.json()) for r in (_post(proxy, bad), _post(proxy, repeated))]
        )
    assert answers[0] == answers[1]
    (status, error), (again, twice) = answers[0]
    assert status == 400 and error["error"]["param"] == f"messages[{count}].role"
    assert again == 400 and twice["error"]["param"] == "stream"


def _with_exchange(raw: bytes, text: str = "/compact") -> bytes:
    """``raw`` grown by a /compact command and the proxy's reply to it."""
    body = orjson.loads(raw)
    exchange = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": "Context compacted: 1 message."},
    ]
    return orjson.dumps({**body, "messages": [*body["messages"], *exchange]})


def _grown_by(raw: bytes, text: str) -> bytes:
    body = orjson.loads(raw)
    messages = [*body["messages"], {"role": "user", "content": text}]
    return orjson.dumps({**body, "messages": messages})


def test_a_compact_exchange_new_or_in_the_history_is_removed_as_in_a_full_read(
    start_app: AppFactory,
) -> None:
    first = _bodies("huge", 1)[0]
    exchanged = _with_exchange(first)  # the exchange is what is new
    later = _grown_by(exchanged, "and now?")  # the exchange is in the history
    session = [first, exchanged, later, _grown_by(later, "more")]
    sent = []
    for cache in (256, 0):
        proxy = start_app(models=MODELS, server={"incremental_cache_mb": cache})
        assert [_post(proxy, raw).status_code for raw in session] == [200] * 4
        sent.append([a.json()["messages"] for a in proxy.transport.asked()])
    assert sent[0] == sent[1]
    assert all(m["content"] != "/compact" for messages in sent[0] for m in messages)
