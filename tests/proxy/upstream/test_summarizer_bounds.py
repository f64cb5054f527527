"""The summarizer's answer is bounded in the proxy: a whole call has a deadline,
and a reply cut off at its output limit is not used. Either way the compaction
goes on with the extractive summary, and its event says why.

The proxy runs in-process with its real transport, in front of a loopback
upstream that answers chat requests at once and summary requests as each test
scripts them (:mod:`tests.proxy.summary_upstream`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from proxy.app import create_app
from tests.proxy.inprocess import settings_for
from tests.proxy.servers import SUMMARY_TEXT
from tests.proxy.summary_upstream import SummaryAnswer, chat_reply, serve_summaries
from tests.synthetic import agent_session

KEY = {"authorization": "Bearer sk-client"}


async def _trickle(writer: asyncio.StreamWriter, key: str) -> None:
    """A head, then the body a byte at a time, each well within the read timeout."""
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
    )
    while True:
        writer.write(b" ")
        await writer.drain()
        await asyncio.sleep(0.05)


async def _cut_off(writer: asyncio.StreamWriter, key: str) -> None:
    # A whole summary by its look: only the finish reason says it stopped short.
    writer.write(chat_reply(SUMMARY_TEXT, finish_reason="length"))
    await writer.drain()


@pytest.fixture
def compacted() -> Iterator[Any]:
    def run(answer: SummaryAnswer, **upstream: Any) -> tuple[Any, list[dict[str, Any]]]:
        with serve_summaries(answer) as (_, url):
            settings = settings_for(
                upstream={"base_url": url, **upstream},
                models={"gpt-4o": {"context_window": 8192}},  # summarizer "llm"
            )
            with TestClient(create_app(settings), base_url="http://127.0.0.1") as http:
                body = {"model": "gpt-4o", "messages": agent_session(seed=21, steps=120)}
                response = http.post("/v1/chat/completions", json=body, headers=KEY)
                events = http.get("/v1/compaction/events", headers=KEY).json()["data"]
        return response, events

    yield run


def _notes(events: list[dict[str, Any]]) -> list[str]:
    done = [e for e in events if e["type"] == "context.compacted" and not e.get("background")]
    assert len(done) == 1, events
    notes: list[str] = done[0]["notes"]
    return notes


def test_a_summary_trickled_past_its_deadline_falls_back_to_the_extractive_summary(
    compacted: Any,
) -> None:
    response, events = compacted(_trickle, read_timeout=5.0, summarizer_timeout_seconds=0.5)
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-stage"] == "condensed"
    notes = _notes(events)
    assert any("timed out" in note and "used extractive" in note for note in notes), notes


def test_a_summary_cut_off_at_the_output_limit_falls_back_to_the_extractive_summary(
    compacted: Any,
) -> None:
    response, events = compacted(_cut_off)
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-stage"] == "condensed"
    notes = _notes(events)
    assert any("summary cut off at the output limit" in note for note in notes), notes
