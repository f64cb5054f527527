"""Checkpoints, events and originals as JSON bytes (orjson), for the durable backends.

Round trips are exact: floats keep every digit, replacement messages stay the
plain dicts they were (unknown keys included), tuples come back as tuples.
Unknown top-level keys are ignored and missing ones take their defaults, so a
replica running an older or newer version can still read what another wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Final, TypeVar

import orjson

from compaction import Checkpoint, Message
from proxy.state.stores.base import Event
from proxy.state.stores.figures import RequestRecord, SessionSettings, SessionSummary

_T = TypeVar("_T", Checkpoint, Event, RequestRecord, SessionSummary, SessionSettings)
_KINDS: Final = (Checkpoint, Event, RequestRecord, SessionSummary, SessionSettings)


def _tuple_fields(cls: type[Any]) -> frozenset[str]:
    # Annotations are strings (postponed evaluation); "tuple[...]" is enough to know.
    return frozenset(
        field.name for field in dataclasses.fields(cls) if str(field.type).startswith("tuple")
    )


_NAMES: Final = {cls: frozenset(field.name for field in dataclasses.fields(cls)) for cls in _KINDS}
_TUPLES: Final = {cls: _tuple_fields(cls) for cls in _KINDS}


def to_dict(
    value: Checkpoint | Event | RequestRecord | SessionSummary | SessionSettings,
) -> dict[str, Any]:
    """The fields of a checkpoint or event as JSON-ready values (no deep copy)."""
    return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}


def _from_dict(cls: type[_T], data: dict[str, Any]) -> _T:
    names, tuples = _NAMES[cls], _TUPLES[cls]
    values: dict[str, Any] = {
        key: tuple(value) if key in tuples and isinstance(value, list) else value
        for key, value in data.items()
        if key in names
    }
    return cls(**values)


def dump_checkpoint(checkpoint: Checkpoint) -> bytes:
    return orjson.dumps(to_dict(checkpoint))


def load_checkpoint(raw: bytes | str) -> Checkpoint:
    return _from_dict(Checkpoint, orjson.loads(raw))


def dump_event(event: Event) -> bytes:
    return orjson.dumps(to_dict(event))


def load_event(raw: bytes | str) -> Event:
    return _from_dict(Event, orjson.loads(raw))


def dump(value: RequestRecord | SessionSummary | SessionSettings) -> bytes:
    # orjson writes a dataclass's fields itself, in order: to_dict's bytes,
    # without building its dict (every request's figures are written so).
    return orjson.dumps(value)


def load(cls: type[_T], raw: bytes | str) -> _T:
    return _from_dict(cls, orjson.loads(raw))


def dump_messages(messages: Sequence[Message]) -> bytes:
    return orjson.dumps(list(messages))


def load_messages(raw: bytes | str) -> list[Message]:
    messages: list[Message] = orjson.loads(raw)
    return messages
