"""The text log line: what each record becomes, however it is produced.

The formatter escapes a line once, as a whole, and makes a second's time
text once a second (every request writes a line); these tests hold it to
what each part escaped on its own and the standard formatter's time give.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.state import logs
from proxy.state.logs import LogWriter, TextFormatter, escaped


class _Shown:
    """A field whose ``str`` and ``format`` differ (as a str-mixin enum's do)."""

    def __str__(self) -> str:
        return "as-str"

    def __format__(self, spec: str) -> str:
        return "as-format"


def _record(name: str, message: str, created: float, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.INFO, "f", 1, message, None, None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0
    record.fields = fields
    return record


def _each_part_escaped(record: logging.LogRecord) -> str:
    """The line as the parts escaped one by one and joined would read."""
    head = (
        f"{logging.Formatter().formatTime(record)} {escaped(record.levelname)} "
        f"{escaped(record.name)}: {escaped(record.getMessage())}"
    )
    fields = record.fields  # type: ignore[attr-defined]
    return head + " " + " ".join(f"{escaped(k)}={escaped(v)}" for k, v in fields.items())


@given(st.text(), st.text(), st.text(), st.text(min_size=1), st.integers() | st.floats())
def test_a_text_line_is_every_part_escaped_and_joined(
    name: str, message: str, value: str, key: str, number: float
) -> None:
    record = _record(name or "x", message, 1_764_600_000.25, model=value, **{key: number})
    assert TextFormatter().format(record) == _each_part_escaped(record)


def test_a_field_is_written_as_its_str_not_its_format() -> None:
    record = _record("compaction_proxy.requests", "chat", 1_764_600_000.0, stage=_Shown())
    assert TextFormatter().format(record).endswith(" stage=as-str")


def test_the_time_of_a_line_is_the_standard_formatters_across_seconds_and_back() -> None:
    formatter, standard = TextFormatter(), logging.Formatter()
    # Within a second, into the next, and back: threads' records need not come in order.
    for created in (1_764_600_000.001, 1_764_600_000.999, 1_764_600_001.5, 1_764_600_000.5):
        record = _record("x", "m", created)
        assert formatter.formatTime(record) == standard.formatTime(record)
        assert formatter.format(record).startswith(standard.formatTime(record) + " INFO x: m")


def test_a_time_format_asked_for_is_the_standard_formatters() -> None:
    record = _record("x", "m", 1_764_600_000.5)
    assert TextFormatter().formatTime(record, "%H:%M") == logging.Formatter().formatTime(
        record, "%H:%M"
    )


# --- the writer thread ----------------------------------------------------------


def _plain(message: str) -> logging.LogRecord:
    return logging.LogRecord("t", logging.INFO, "f", 1, message, None, None)


def test_records_past_what_can_wait_are_dropped_and_the_count_is_written() -> None:
    """A log output nobody reads: handing a record over never waits, what the
    queue cannot hold is dropped, and once the output is read again a line
    says how many, in order among the lines that were kept."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # full after some forty lines
    writer = LogWriter(logging.Formatter("%(message)s"), write_end, capacity=5)
    sent = 2_000

    def hand_over() -> None:
        for i in range(sent):
            writer.emit(_plain(f"line {i:04d} " + "x" * 90))

    handing = threading.Thread(target=hand_over)
    handing.start()
    handing.join(timeout=30)
    assert not handing.is_alive()  # all handed over while the output was full
    output = bytearray()
    reading = threading.Thread(target=lambda: output.extend(_read_all(read_end)))
    reading.start()
    writer.close()
    os.close(write_end)
    reading.join(timeout=30)
    # Each count comes where its gap is: before the next line that was kept.
    expected, dropped = 0, 0
    for line in output.decode().splitlines():
        if line.startswith("line "):
            assert int(line.split()[1]) == expected
            expected += 1
        else:
            assert line.endswith("log record(s) dropped: the log output was not being read")
            count = int(line.split()[0])
            expected += count
            dropped += count
    assert expected == sent
    assert dropped > 0


def test_a_record_is_written_as_it_was_when_logged() -> None:
    read_end, write_end = os.pipe()
    writer = LogWriter(TextFormatter(), write_end)
    logger = logging.getLogger("tests.logs.handoff")
    logger.propagate = False
    logger.addHandler(writer)
    try:
        fields = {"stage": "none"}
        logger.warning("seen %s", "then", extra={"fields": fields})
        fields["stage"] = "changed later"
        writer.close()
    finally:
        logger.removeHandler(writer)
    os.close(write_end)
    [line] = _read_all(read_end).decode().splitlines()
    assert line.endswith("tests.logs.handoff: seen then stage=none")


def test_lines_that_keep_coming_are_written_in_one_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """While lines keep coming the thread writes them together, not one write
    (and one wake-up, taking the interpreter from the loop) per line: here the
    thread's next look is far off, and the drain brings it on."""
    monkeypatch.setattr(logs, "BATCH_SECONDS", 3600.0)
    writes: list[bytes] = []

    class Counted(LogWriter):
        def _write(self, data: bytes) -> None:
            if data:
                writes.append(data)

    writer = Counted(logging.Formatter("%(message)s"), -1)
    try:
        for i in range(50):
            writer.emit(_plain(f"line {i}"))
        assert writer.drain()
    finally:
        writer.close()
    assert len(writes) == 1
    assert writes[0].decode().splitlines() == [f"line {i}" for i in range(50)]


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as pipe:
        return pipe.read()


def test_the_configured_log_takes_pythons_warnings_too() -> None:
    """A warning goes through the writer thread as a log line, not to stderr by
    itself (where it could wait on an unread output)."""
    script = (
        "import warnings\n"
        "from proxy.state import logs\n"
        "logs.configure('info', 'json')\n"
        "warnings.warn('a deprecated thing', DeprecationWarning, stacklevel=1)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", script], capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.decode().splitlines()
    entry = json.loads(line)
    assert entry["logger"] == "py.warnings"
    assert "DeprecationWarning: a deprecated thing" in entry["message"]
