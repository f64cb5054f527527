"""A loopback upstream for the summarizer's bounds: chat requests are answered
at once, summary requests by the test's own coroutine (held, trickled, cut off).

It speaks raw HTTP/1.1 (:func:`tests.proxy.raw_servers.serve_script`), so the
proxy's real transport and pools meet it as they would a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import orjson

from compaction.summary.prompts import SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT
from tests.proxy.raw_servers import response, serve_script

#: Answers one summary request: ``(writer, authorization)``; writes the whole response.
SummaryAnswer = Callable[[asyncio.StreamWriter, str], Awaitable[None]]

_SUMMARY_PROMPTS = tuple(
    p.split("\n", 1)[0] for p in (SUMMARY_SYSTEM_PROMPT, TURN_PREFIX_SYSTEM_PROMPT)
)
_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "I saw it."},
                "finish_reason": "stop",
            }
        ],
    }
)


def is_summary_request(body: bytes) -> bool:
    try:
        first = orjson.loads(body)["messages"][0]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return False
    return isinstance(first, str) and first.startswith(_SUMMARY_PROMPTS)


def chat_reply(content: str, finish_reason: str = "stop") -> bytes:
    """A whole chat completion carrying ``content``, as an HTTP response."""
    payload = {
        "id": "chatcmpl-s",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
    }
    return response(orjson.dumps(payload), "content-type: application/json")


@dataclass
class SummaryUpstream:
    """What it was asked: chat answers given, summary requests seen."""

    answer: SummaryAnswer
    chats: int = 0
    summaries: int = 0
    #: Summary requests being answered right now, in all and by credential.
    open: int = 0
    open_by_key: dict[str, int] = field(default_factory=dict)
    #: The most of them at once, in all and for any one credential.
    most_open: int = 0
    most_open_by_key: int = 0

    async def serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int
    ) -> None:
        while (request := await _read(reader)) is not None:
            head, body = request
            if not is_summary_request(body):
                self.chats += 1
                writer.write(response(_ANSWER, "content-type: application/json"))
                await writer.drain()
                continue
            key = head.get("authorization", "")
            self.summaries += 1
            self.open += 1
            self.open_by_key[key] = self.open_by_key.get(key, 0) + 1
            self.most_open = max(self.most_open, self.open)
            self.most_open_by_key = max(self.most_open_by_key, self.open_by_key[key])
            try:
                await self.answer(writer, key)
            finally:
                self.open -= 1
                self.open_by_key[key] -= 1


async def _read(reader: asyncio.StreamReader) -> tuple[dict[str, str], bytes] | None:
    """The next request's headers (names lower-cased) and body; None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return headers, await reader.readexactly(int(headers.get("content-length", "0")))


@contextlib.contextmanager
def serve_summaries(answer: SummaryAnswer) -> Iterator[tuple[SummaryUpstream, str]]:
    """Serve on loopback; yields the record and the base URL (with ``/v1``)."""
    upstream = SummaryUpstream(answer)
    with serve_script(upstream.serve) as url:
        yield upstream, url + "/v1"
