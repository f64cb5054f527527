"""Logging set-up: plain text or one JSON object per line.

Request lines carry their figures in ``extra={"fields": {...}}``; both
formats render them. Nothing here logs message content or headers: a handler
that wants to (``--log-content``) must put it in the fields itself.

Fields carry what clients sent (a model name, a path), so the text format
escapes every control character in every part of a line — C0, DEL, C1 and
the Unicode line separators, as ``\n``, ``\x1b``, ``\u2028`` — and indents a
traceback's lines: one record is one line that no client can forge a
second of. The JSON format needs none of it: a JSON string escapes them.
"""

from __future__ import annotations

import logging
import time
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


def configure(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Neither format prints the caller's file, thread or process: collecting
    # them costs a stack walk and three lookups per record (the logging
    # HOWTO's "Optimization" section names these switches).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
