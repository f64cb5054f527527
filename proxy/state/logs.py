"""Logging set-up: plain text or one JSON object per line.

Request lines carry their figures in ``extra={"fields": {...}}``; both
formats render them. Nothing here logs message content or headers: a handler
that wants to (``--log-content``) must put it in the fields itself.

Fields carry what clients sent (a model name, a path), so the text format
escapes every control character in every part of a line — C0, DEL, C1 and
the Unicode line separators, as ``\n``, ``\x1b``, ``\u2028`` — and indents a
traceback's lines: one record is one line that no client can forge a
second of. The JSON format needs none of it: a JSON string escapes them.

Lines are formatted and written by a thread of their own (:class:`LogWriter`):
a log output nobody reads — a pipe whose reader stalled, a paused terminal —
fills up, and a write to it waits. Written from the event loop, that wait
stopped every request (after ~380 small requests, once a 64 KiB pipe was
full). Now the loop only hands a record over; past :data:`QUEUED_RECORDS`
waiting, records are dropped, and a line says how many once the output moves
again.

While lines keep coming, the thread writes them in batches, every
:data:`BATCH_SECONDS`, not as each comes: woken for every request's line, it
took the interpreter's lock from the loop once a request — a context switch
and the formatting in the middle of the next request on a busy core (7 % of
the proxy's time on a stream of small requests, sampled). A quiet log
(nothing for :data:`QUIET_SECONDS`) is waited on instead, so an idle proxy
does not wake to look; its next line is written at once.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from queue import Empty, SimpleQueue
from typing import Any

import orjson

#: Logger of the one-line-per-request log.
REQUESTS = "compaction_proxy.requests"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def _escapes() -> dict[int, str]:
    named = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
    controls = [*range(0x20), 0x7F, *range(0x80, 0xA0)]
    table = {code: named.get(code, f"\\x{code:02x}") for code in controls}
    table.update({code: f"\\u{code:04x}" for code in (0x2028, 0x2029)})
    return table


_ESCAPES = _escapes()


def escaped(value: object) -> str:
    """``value`` as text with no control character left in it (see above)."""
    text = str(value)
    # Every character escaped is one Python calls unprintable, and asking
    # costs a fraction of the translation most fields would not need.
    return text if text.isprintable() else text.translate(_ESCAPES)


class TextFormatter(logging.Formatter):
    """``<time> <level> <logger>: <message> key=value …``, escaped as the module says."""

    def __init__(self) -> None:
        super().__init__()
        #: The last second formatted and its text: every request writes a
        #: line, and most lines share their second with the one before.
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """:meth:`logging.Formatter.formatTime`'s text, the second's part made once a second."""
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second[0]:
            self._second = (second, time.strftime(self.default_time_format, self.converter(second)))
        msec_format = self.default_msec_format
        if msec_format is None:  # as the standard formatter: the second alone
            return self._second[1]
        return msec_format % (self._second[1], record.msecs)

    def format(self, record: logging.LogRecord) -> str:
        time_, level, name = self.formatTime(record), record.levelname, record.name
        line = f"{time_} {level!s} {name!s}: {record.getMessage()}"
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line += " " + " ".join(f"{k!s}={v!s}" for k, v in fields.items())
        # Escaped once, as a whole: the separators are printable, and the table
        # maps one character at a time, so this is each part escaped, joined.
        line = escaped(line)
        if record.exc_info:
            line += _indented(self.formatException(record.exc_info))
        if record.stack_info:
            line += _indented(self.formatStack(record.stack_info))
        return line


def _indented(text: str) -> str:
    """A traceback's lines, each escaped and indented under its record."""
    return "".join(f"\n    {escaped(part)}" for part in text.splitlines())


#: Records waiting for the writer thread, at most (about; another thread may
#: add one as it counts); a record past it is dropped and counted.
QUEUED_RECORDS = 10_000
#: Seconds the records still waiting get at exit to be written.
DRAIN_SECONDS = 2.0
#: How often the writer writes what came, while lines keep coming: a line
#: shows at most this late.
BATCH_SECONDS = 0.05
#: After this long with no line, the writer waits for the next one instead of
#: looking every :data:`BATCH_SECONDS`.
QUIET_SECONDS = 1.0


#: What waits for the writer: a record; a count of records dropped there; an
#: event to set once what came before it is written; ``None``, the end.
_Item = logging.LogRecord | int | threading.Event | None


class LogWriter(logging.Handler):
    """The root logger's handler: formats records and writes them to a file
    descriptor, in a thread of its own.

    :meth:`emit` never waits, whatever the output does; :meth:`close` writes
    what waits, for at most a bounded time. Writes go to the descriptor itself
    (``os.write``), under no lock of Python's: a write left waiting on an
    unread output holds nothing that the exit's flush of ``sys.stderr`` or
    :func:`logging.shutdown` would wait for.

    Not the standard library's ``QueueHandler`` and ``QueueListener``: the
    listener writes through a handler, whose lock a blocked write holds (and
    :func:`logging.shutdown` takes at exit), it stops with a join that waits
    for ever, and a full bounded queue makes ``QueueHandler`` report each
    record as an error, on the very stderr that is not being read.
    """

    def __init__(
        self, formatter: logging.Formatter, fd: int, capacity: int = QUEUED_RECORDS
    ) -> None:
        super().__init__()
        self._formatter = formatter
        self._fd = fd
        self._capacity = capacity
        self._records: SimpleQueue[_Item] = SimpleQueue()
        self._lock = threading.Lock()
        #: Set by drain and close: the thread writes what waits now, not at its next look.
        self._urgent = threading.Event()
        self._dropped = 0
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        """Hand ``record`` over to the thread. What may change after the call
        is read here, as it is now: the message merged with its arguments, and
        a copy of the ``fields``; the rest of the formatting (the time, a
        traceback) is the thread's."""
        try:
            record.msg, record.args = record.getMessage(), None
        except Exception:  # arguments that do not fit the message: logging's own report
            self.handleError(record)
            return
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            record.fields = dict(fields)
        if self._records.qsize() >= self._capacity:
            with self._lock:
                self._dropped += 1
            return
        if self._dropped:  # the count goes where the records went missing
            self._records.put(self._take_dropped())
        self._records.put(record)

    def _take_dropped(self) -> int:
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        return dropped

    def drain(self, seconds: float = DRAIN_SECONDS) -> bool:
        """Wait until the records handed over so far are written, for at most
        ``seconds``; whether they were."""
        written = threading.Event()
        self._records.put(written)
        self._urgent.set()
        return written.wait(seconds)

    def close(self, seconds: float = DRAIN_SECONDS) -> None:
        """Write what waits, for at most ``seconds``; then stop (logging's
        shutdown closes it again at exit, when nothing is left)."""
        self._records.put(self._take_dropped())
        self._records.put(None)
        self._urgent.set()
        self._thread.join(seconds)
        super().close()

    def _run(self) -> None:
        quiet_rounds = max(1, round(QUIET_SECONDS / BATCH_SECONDS))
        quiet = 0
        while True:
            batch: list[_Item] = []
            if quiet >= quiet_rounds:
                batch.append(self._records.get())  # quiet: woken by the next line
            else:
                self._urgent.wait(BATCH_SECONDS)  # a drain or the end does not wait
                self._urgent.clear()
            while True:
                try:
                    batch.append(self._records.get_nowait())
                except Empty:
                    break
            quiet = 0 if batch else quiet + 1
            if not self._handle(batch):
                return

    def _handle(self, batch: list[_Item]) -> bool:
        """Write ``batch``'s lines in one go, an event set once the lines before
        it are out; ``False`` at the end."""
        lines: list[bytes] = []
        for item in batch:
            if isinstance(item, logging.LogRecord):
                lines.append(self._line(item))
            elif isinstance(item, int):
                if item:
                    lines.append(self._line(_dropped_record(item)))
            else:
                self._write(b"".join(lines))
                lines = []
                if item is None:
                    return False
                item.set()
        self._write(b"".join(lines))
        return True

    def _line(self, record: logging.LogRecord) -> bytes:
        try:
            line = self._formatter.format(record) + "\n"
        except Exception:  # a record that cannot be formatted is one lost line, not the thread
            line = f"(a log record could not be formatted: {record.msg!r})\n"
        return line.encode("utf-8", "backslashreplace")

    def _write(self, data: bytes) -> None:
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError:  # the output is gone (closed, a broken pipe): nothing to write to
            pass


def _dropped_record(count: int) -> logging.LogRecord:
    return logging.makeLogRecord(
        {
            "name": "compaction_proxy",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": f"{count} log record(s) dropped: the log output was not being read",
        }
    )


#: The writer :func:`configure` started, if it did (see :func:`flush`).
_writer: LogWriter | None = None


def flush(seconds: float = DRAIN_SECONDS) -> None:
    """The lines logged so far written, waited for at most ``seconds``: before
    the process ends in a way that runs no exit handler (a signal raised again)."""
    if _writer is not None:
        _writer.drain(seconds)


def configure(level: str = "info", fmt: str = "text") -> None:
    global _writer
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # no descriptor: written as it comes
        fd = None
    handler: logging.Handler
    if fd is None:
        handler = logging.StreamHandler()
        handler.setFormatter(formatter)
    else:
        if _writer is not None:
            _writer.close()
        _writer = LogWriter(formatter, fd)
        # Before logging's own exit handler (atexit runs the last one first).
        atexit.register(_writer.close)
        handler = _writer
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Python's warnings too: written to sys.stderr by themselves, one could
    # wait on an unread output as a log line did.
    logging.captureWarnings(True)
    # Neither format prints the caller's file, thread or process: collecting
    # them costs a stack walk and three lookups per record (the logging
    # HOWTO's "Optimization" section names these switches).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
