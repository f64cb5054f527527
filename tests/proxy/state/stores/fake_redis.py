"""A Redis that answers, but answers wrong: a loopback TCP server speaking RESP.

    async with FakeRedis(reply=NIL) as fake:      # in a test's event loop
        store = RedisStore.from_url(fake.url, timeout=1.0)

    with FakeRedis.in_thread(reply=NUMBER) as fake:  # for a proxy in a subprocess
        ...fake.commands...

It reads each command (a RESP array of bulk strings, or an inline command).
The connection's handshake is answered as a Redis would (``HELLO`` with the
server's map, ``CLIENT SETINFO`` with OK), so the client connects; then every
command gets the same ``reply``, whatever it asked: nil to all (a Redis whose
data vanished under it, or a proxy in between that lost its mind), or a reply
of the wrong type (an integer or a status where a value, a hash or a
transaction's result is expected). Nil is written in the protocol the client
asked for: ``_`` after ``HELLO 3``, ``$-1`` in RESP2. ``commands`` counts what it was
sent, the names in ``names``: a client that loops on the answers shows as a
count that keeps growing.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Final

#: Nil, in the protocol the connection speaks (see :func:`_answer`).
NIL: Final = b"$-1\r\n"
_NIL3: Final = b"_\r\n"
NUMBER: Final = b":1\r\n"
STATUS: Final = b"+OK\r\n"
#: A bulk string that is no UTF-8, no JSON and no number.
UNDECODABLE: Final = b"$4\r\n\xff\xfe\x00\x80\r\n"


class FakeRedis:
    """The server; counts the commands it was sent (thread-safe to read)."""

    def __init__(self, *, reply: bytes = NIL, replies: dict[str, bytes] | None = None) -> None:
        self.reply = reply
        #: Answers of their own for some commands, by name (``{"PTTL": b":-2\r\n"}``).
        self.replies = dict(replies or {})
        self.names: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server: asyncio.Server | None = None
        self._serving: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def commands(self) -> int:
        with self._lock:
            return sum(self.names.values())

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        # The connections still open are ours to drop (a closed server keeps them).
        for task in list(self._serving):
            task.cancel()
        if self._serving:
            await asyncio.wait(self._serving)

    async def __aenter__(self) -> FakeRedis:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @classmethod
    @contextmanager
    def in_thread(cls, *, reply: bytes = NIL) -> Iterator[FakeRedis]:
        """The server on an event loop of its own thread, for as long as the block runs."""
        fake = cls(reply=reply)
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(fake.start())
            started.set()
            loop.run_forever()

        thread = threading.Thread(target=run, name="fake-redis", daemon=True)
        thread.start()
        if not started.wait(10):
            raise RuntimeError("the fake Redis did not start")
        try:
            yield fake
        finally:
            asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        resp3 = False
        try:
            while True:
                command = await _read_command(reader)
                if command is None:
                    return
                with self._lock:
                    self.names[command[0]] += 1
                if command[0] == "HELLO":
                    resp3 = command[1:2] == ["3"]
                reply = self.replies.get(command[0], self.reply)
                writer.write(_answer(command, reply, resp3=resp3))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, asyncio.CancelledError):
            return
        finally:
            self._serving.discard(task)
            writer.close()


def _answer(command: list[str], reply: bytes, *, resp3: bool) -> bytes:
    name = command[0]
    if name == "HELLO":  # the server's map; RESP2 has none, and the client asks for 3
        return b"%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n"
    if name == "CLIENT" and command[1:2] == ["SETINFO"]:
        return STATUS
    return _NIL3 if resp3 and reply == NIL else reply


async def _read_command(reader: asyncio.StreamReader) -> list[str] | None:
    """The next command: its name (upper case), then its arguments (the
    first few, as text); ``None`` at the end of the stream."""
    line = await reader.readline()
    if not line:
        return None
    if not line.startswith(b"*"):  # an inline command: words on one line
        words = [word.decode(errors="replace") for word in line.split()] or [""]
        return [words[0].upper(), *words[1:]]
    words = []
    for _ in range(int(line[1:])):
        header = await reader.readline()
        if not header.startswith(b"$"):
            raise ValueError("not a bulk string")
        value = await reader.readexactly(int(header[1:]) + 2)
        if len(words) < 3:
            words.append(value[:-2].decode(errors="replace"))
    return [words[0].upper(), *words[1:]] if words else [""]
