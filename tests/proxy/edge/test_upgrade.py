"""A WebSocket upgrade (Codex's Responses transport, tried first) is answered with
the status that sends the client on over HTTP at once, through a real server."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from tests.proxy.conftest import ProxyFactory

ATTEMPTS = 5


async def _handshakes(url: str) -> list[tuple[int, str]]:
    """What each of ``ATTEMPTS`` WebSocket handshakes was answered: status and body."""
    answers = []
    async with aiohttp.ClientSession() as session:
        for _ in range(ATTEMPTS):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(url, headers={"authorization": "Bearer sk-test"})
            answers.append((refused.value.status, refused.value.message))
    return answers


def test_a_websocket_upgrade_on_responses_is_answered_426_and_logs_no_error(
    start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    base = start_proxy()
    url = base.replace("http://", "ws://") + "/responses"
    answers = asyncio.run(_handshakes(url))
    assert [status for status, _ in answers] == [426] * ATTEMPTS
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_an_upgrade_elsewhere_is_answered_426_too(start_proxy: ProxyFactory) -> None:
    base = start_proxy()
    url = base.replace("http://", "ws://") + "/chat/completions"
    assert {status for status, _ in asyncio.run(_handshakes(url))} == {426}
