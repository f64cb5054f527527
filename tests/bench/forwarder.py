"""A bare forwarder: the least a Python proxy of the same stack can add.

A raw ASGI app under uvicorn (the server the proxy runs on) that reads the
client's body whole, sends the same bytes to the upstream with aiohttp (the
proxy's upstream client) and streams the answer back: no parsing, no
counting, no state. What it adds over the direct connection is the hop
itself, and the measure of what the proxy's own work adds on top. Run as its
own process::

    python -m tests.bench.forwarder --port 9001 --upstream http://127.0.0.1:9000/v1
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn

Scope = dict[str, Any]
Receive = Any
Send = Any

#: Request headers passed on; the rest (host, length) aiohttp writes itself.
PASSED = (b"authorization", b"content-type", b"x-api-key", b"anthropic-version")


class Forwarder:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/").removesuffix("/v1")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k in PASSED}
        assert self.session is not None
        async with self.session.request(
            scope["method"], self.upstream + scope["path"], data=b"".join(chunks), headers=headers
        ) as answer:
            kept = [
                (k.lower().encode(), v.encode())
                for k, v in answer.headers.items()
                if k.lower() in ("content-type", "content-length")
            ]
            await send({"type": "http.response.start", "status": answer.status, "headers": kept})
            async for chunk in answer.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=100),
                    auto_decompress=False,
                    cookie_jar=aiohttp.DummyCookieJar(),
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvicorn.run(
        Forwarder(args.upstream),
        host="127.0.0.1",
        port=args.port,
        loop="auto",
        http="auto",
        log_level="warning",
        access_log=False,
        server_header=False,
    )


if __name__ == "__main__":
    main()
