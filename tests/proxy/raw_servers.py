"""Scripted servers on loopback that speak raw bytes, for the hostile-upstream tests.

:func:`serve_script` runs an asyncio server in a thread; every accepted
connection runs the test's ``script(reader, writer, index)`` coroutine, which
reads and writes exactly the bytes the test wants — a body cut short, a second
response nobody asked for, a flood of headers — over plain TCP or TLS.
:func:`serve_connect_proxy` is an HTTP proxy that only tunnels (``CONNECT``),
the kind a corporate network puts in ``HTTPS_PROXY``; it resolves names
itself, so a test can name an upstream that only the proxy can reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[str, bytes] | None:
    """The next request's first line and body (by Content-Length); None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    line, *fields = head.decode("latin-1").split("\r\n")
    length = 0
    for item in fields:
        name, _, value = item.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return line, await reader.readexactly(length)


def response(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    """A whole HTTP/1.1 response with a Content-Length."""
    lines = "".join(f"{h}\r\n" for h in (*headers, f"content-length: {len(body)}"))
    return f"HTTP/1.1 {status}\r\n{lines}\r\n".encode() + body


@dataclass
class _Loop:
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Awaitable[object]) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)  # type: ignore[arg-type]

    def stop(self, server: asyncio.Server) -> None:
        async def close() -> None:
            server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            # Each connection's handler closes its writer as it ends; the loop
            # must run on until the transports have let their sockets go, or
            # they are collected later, during another test, as unclosed.
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0.01)

        self.run(close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@contextlib.contextmanager
def serve_script(script: Script, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """Serve ``script`` on every connection; yields the base URL (no path)."""
    runner = _Loop()
    accepted = 0

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        try:
            await script(reader, writer, accepted)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def start() -> asyncio.Server:
        return await asyncio.start_server(accept, "127.0.0.1", 0, ssl=tls)

    server = runner.run(start())
    assert isinstance(server, asyncio.Server)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        runner.stop(server)


@dataclass
class ConnectProxy:
    url: str
    #: The ``host:port`` of every tunnel asked for, in order.
    tunnels: list[str]
    #: The ``Proxy-Authorization`` each tunnel was asked with ("" for none).
    authorizations: list[str]


@contextlib.contextmanager
def serve_connect_proxy(names: dict[str, int]) -> Iterator[ConnectProxy]:
    """A tunnelling proxy; ``names`` maps host names it resolves to loopback ports."""
    runner = _Loop()
    tunnels: list[str] = []
    authorizations: list[str] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, authority, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
        tunnels.append(authority)
        credentials = ""
        for line in head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "proxy-authorization":
                credentials = value.strip()
        authorizations.append(credentials)
        host = authority.rpartition(":")[0]
        if method != "CONNECT" or host not in names:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", names[host])
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def start() -> asyncio.Server:
        return await asyncio.start_server(accept, "127.0.0.1", 0)

    server = runner.run(start())
    assert isinstance(server, asyncio.Server)
    port = server.sockets[0].getsockname()[1]
    try:
        yield ConnectProxy(f"http://127.0.0.1:{port}", tunnels, authorizations)
    finally:
        runner.stop(server)
