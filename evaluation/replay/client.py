"""The replay client: plays one session through the proxy, turn by turn.

At its ``i``-th cut point ``k`` the client sends the session's ``messages[:k]``
(and its tools), not streamed, with the replay marker (the cut point, the step
``i`` and the virtual time ``i × gap``) and the session's own bearer key; the
loopback upstream answers with ``messages[k]``, so the next request is the
client's whole history again, as an agent sends it. The proxy runs in real
time; only the upstream's clock is virtual.

What the client keeps of each answer is what the proxy told it: the status
and the ``x-compaction-stage`` header. An answer other than 200 is counted and
the session goes on (the next request resends the same history plus a turn,
as a client that retries would). Each request is bounded by
:data:`REQUEST_SECONDS`. ``settle`` runs after every answer: with the llm
summarizer it waits for the proxy's background preparations, which a real
session's 30 s between turns would leave time for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import aiohttp
import orjson

from evaluation.replay.sessions import Session
from evaluation.replay.upstream import REPLAY_FIELD, replay_marker

#: Seconds one request through the proxy may take in all.
REQUEST_SECONDS: Final = 120.0


@dataclass
class Replayed:
    """What the proxy answered for one session."""

    stages: dict[int, str] = field(default_factory=dict)  #: by cut point
    failures: list[str] = field(default_factory=list)  #: "k: status body…" of non-200 answers


def session_key(index: int) -> str:
    """The bearer key of the ``index``-th session of a run: the upstream tells the
    session of a call by it, the proxy keys its conversations by it."""
    return f"replay-session-{index}"


async def replay_session(
    client: aiohttp.ClientSession,
    base_url: str,
    session: Session,
    key: str,
    gap: float,
    settle: Callable[[], Awaitable[None]] | None = None,
    sending: Callable[[], None] | None = None,
) -> Replayed:
    """Send every cut point of ``session`` in order; what the proxy answered.
    ``sending`` is called before each request (the upstream then tells a
    summary asked on its path from one prepared ahead)."""
    replayed = Replayed()
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=REQUEST_SECONDS)
    for step, k in enumerate(session.cuts):
        body = {
            **session.body(k),
            "stream": False,
            REPLAY_FIELD: replay_marker(k, step, step * gap),
        }
        if sending is not None:
            sending()
        async with client.post(
            f"{base_url}/chat/completions",
            data=orjson.dumps(body),
            headers=headers,
            timeout=timeout,
        ) as response:
            text = await response.read()
            replayed.stages[k] = response.headers.get("x-compaction-stage", "")
            if response.status != 200:
                replayed.failures.append(f"{k}: {response.status} {text[:300]!r}")
        if settle is not None:
            await settle()
    return replayed
