"""proxy.flow.relay.response: the Relay over a real transport's answer from a loopback server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.flow.relay import Relay
from proxy.upstream.traffic import Traffic
from proxy.upstream.transport import Transport, UpstreamResponse
from tests.proxy.raw_servers import read_request, response, serve_script

WHOLE = response(b'{"id":"1"}', "content-type: application/json")
STREAM = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
)


def _relayed(answer: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[Any], int]:
    """How many times the upstream's answer was aborted, what the client was
    sent, and the user requests still counted in flight, once a Relay served it."""
    aborts = 0
    abort = UpstreamResponse.abort

    def counted(self: UpstreamResponse) -> None:
        nonlocal aborts
        aborts += 1
        abort(self)

    monkeypatch.setattr(UpstreamResponse, "abort", counted)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await read_request(reader) is not None:
            writer.write(answer)
            await writer.drain()

    async def relay(url: str) -> tuple[list[Any], int]:
        transport = Transport(
            connect_timeout=1.0,
            read_timeout=1.0,
            max_connections=2,
            keepalive_expiry=30.0,
            trust_env=False,
        )
        traffic = Traffic()
        sent: list[Any] = []

        async def receive() -> Any:
            await asyncio.Event().wait()  # the client stays

        async def send(message: Any) -> None:
            sent.append(message)

        try:
            sending = await traffic.begin("key", stated=None)
            upstream = sending.answered(await transport.request("POST", url, {}, b"{}"))
            scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
            await Relay(upstream, {})(scope, receive, send)
            return sent, traffic.in_flight("key")
        finally:
            await transport.aclose()

    with serve_script(script) as url:
        sent, in_flight = asyncio.run(relay(url + "/v1/chat/completions"))
    return aborts, sent, in_flight


@pytest.mark.parametrize(
    ("answer", "body"),
    [(WHOLE, b'{"id":"1"}'), (STREAM, b"data: [DONE]\n\n")],
    ids=["whole", "stream"],
)
def test_an_answer_relayed_to_its_end_is_not_aborted_after(
    answer: bytes, body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read to its end, the answer gave its connection back and ended its count:
    closing it again would do nothing but tell its end once more."""
    aborts, sent, in_flight = _relayed(answer, monkeypatch)
    assert b"".join(message.get("body", b"") for message in sent) == body
    assert in_flight == 0
    assert aborts == 0
