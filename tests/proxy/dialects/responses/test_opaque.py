"""Items and parts no summary can stand for (an ``item_reference``, an item or a
part of a type that does not exist yet) reach the upstream through every
stage: condensed by riding along after the summary, pruned beside the brief."""

from __future__ import annotations

import asyncio
from typing import Any

from compaction import Profile, TokenCounter, compact
from proxy.dialects.responses import RESPONSES
from tests.proxy.dialects.responses.shapes import codex_request

COUNTER = TokenCounter("gpt-4o")


def _compacted(body: dict[str, Any], window: int) -> tuple[dict[str, Any], Any]:
    mapped = RESPONSES.to_engine(body)
    profile = Profile(context_window=window, summarizer="extractive")
    result = asyncio.run(compact(mapped.request, profile, counter=COUNTER))
    return RESPONSES.from_engine(body, mapped, result.messages), result


def _summary_at(items: list[Any]) -> int:
    return next(
        i
        for i, item in enumerate(items)
        if item.get("role") == "user" and "CONDENSED" in item["content"][0].get("text", "")
    )


def test_an_unknown_item_rides_along_after_the_summary_of_its_span() -> None:
    body = codex_request(turns=40)
    reference = {"type": "item_reference", "id": "msg_0123"}
    invented = {"type": "hologram_20990101", "frames": [{"at": 1}], "status": "completed"}
    body["input"][6:6] = [reference]  # after the first turn's output
    body["input"][10:10] = [invented]  # after the second's
    out, result = _compacted(body, 16_384)
    assert result.stage == "condensed", result.notes
    items = out["input"]
    at = _summary_at(items)
    assert items[at + 1] is reference and items[at + 2] is invented
    assert len(items) < len(body["input"])


def test_a_part_of_an_unknown_type_keeps_its_output_beside_the_summary_and_the_brief() -> None:
    body = codex_request(turns=40)
    call = {"type": "function_call", "name": "load", "arguments": "{}", "call_id": "call_ld"}
    invented = {"type": "tool_reference_20990101", "tool_name": "fetch"}
    listing = {"type": "input_text", "text": "a tool schema line\n" * 600}
    output = {"type": "function_call_output", "call_id": "call_ld", "output": [listing, invented]}
    body["input"][6:6] = [call, output]
    out, result = _compacted(body, 16_384)
    assert result.stage == "condensed", result.notes
    items = out["input"]
    at = _summary_at(items)
    assert items[at + 1] is call
    sent = items[at + 2]
    assert sent["call_id"] == "call_ld" and sent["output"][1:] == [invented]
    brief = sent["output"][0]
    assert brief["type"] == "input_text" and brief["text"].startswith("[load]")
