"""The text log line: what each record becomes, however it is produced.

The formatter escapes a line once, as a whole, and makes a second's time
text once a second (every request writes a line); these tests hold it to
what each part escaped on its own and the standard formatter's time give.
"""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from proxy.state.logs import TextFormatter, escaped


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
