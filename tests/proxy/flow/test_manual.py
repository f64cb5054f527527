"""``/compact`` found by a byte search first: a body that cannot hold the
command or an exchange it left is never read for them message by message."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.flow.manual import (
    REPLY_PREFIXES,
    SEARCHED_BYTES,
    find_command,
    may_hold_command,
    strip_commands,
)


def _escaped(text: str, escape: list[bool]) -> str:
    """``text`` with the letters of "compact" that ``escape`` picks written as
    JSON ``\\u00XX`` wherever the word stands."""
    word = "".join(
        f"\\u{ord(c):04x}" if flag else c
        for c, flag in zip("compact", [*escape, *[False] * 7], strict=False)
    )
    return text.replace("compact", word)


@given(
    before=st.text(max_size=20),
    focus=st.text(max_size=20),
    escape=st.lists(st.booleans(), min_size=7, max_size=7),
    reply=st.sampled_from(REPLY_PREFIXES),
)
def test_a_body_holding_a_command_or_its_exchange_is_always_read_for_it(
    before: str, focus: str, escape: list[bool], reply: str
) -> None:
    command = {"role": "user", "content": f"/compact {focus}"}
    exchange = [command, {"role": "assistant", "content": f"{reply} {before}"}]
    for messages in ([{"role": "user", "content": before}, command], [*exchange, command]):
        assert find_command(messages) is not None or strip_commands(messages) is not messages
        raw = orjson.dumps({"messages": messages}).decode()
        # However a client writes it: escaped letters, escaped non-ASCII, escaped slashes.
        for written in (raw, json.dumps({"messages": messages}), raw.replace("/", "\\/")):
            spelled = _escaped(written, escape)
            assert orjson.loads(spelled) == {"messages": messages}
            assert may_hold_command(spelled.encode())


def test_a_body_without_the_word_is_not_read_for_a_command() -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "Compose a reply é"}]}
    assert not may_hold_command(orjson.dumps(body))
    assert not may_hold_command(json.dumps(body).encode())  # \u00e9: no letter of the word


def test_a_large_body_is_read_for_a_command_without_a_search_of_its_bytes() -> None:
    body = {"messages": [{"role": "user", "content": "x" * SEARCHED_BYTES}]}
    assert may_hold_command(orjson.dumps(body))
