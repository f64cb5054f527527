"""The provider's own compaction is the provider's: a Responses input is read from
its latest ``compaction`` item (the API ignores every item before it), and the
requests and fields that drive server-side compaction reach it unchanged."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from proxy.dialects.responses import RESPONSES
from proxy.dialects.responses.replies import response_object
from tests.proxy.dialects.responses.shapes import codex_request
from tests.proxy.inprocess import RecordingTransport, json_reply, running, settings_for

MODEL = "gpt-test"
WINDOW = 16_384
COMPACTION = {
    "type": "compaction",
    "id": "cmp_0123",
    "encrypted_content": base64.b64encode(bytes(range(256)) * 8).decode(),
}
ANSWER = response_object(MODEL, "ok")


def _compacted_session() -> dict[str, Any]:
    """A Codex session of ~26k tokens, then the item server-side compaction left,
    then two newer turns."""
    older = codex_request(turns=36)
    newer = codex_request(turns=2, seed=1)["input"][3:]
    body = {**older, "model": MODEL, "stream": False}
    body["input"] = [*older["input"], COMPACTION, *newer]
    body["context_management"] = [{"type": "compaction", "compact_threshold": 12_000}]
    return body


def _settings() -> Any:
    return settings_for(
        compaction={"summarizer": "extractive"},
        models={MODEL: {"context_window": WINDOW, "precompute_share": 0}},
    )


def test_the_engine_reads_the_input_from_the_latest_compaction_item() -> None:
    body = _compacted_session()
    at = body["input"].index(COMPACTION)
    mapped = RESPONSES.to_engine(body)
    # The instructions, then the compaction item opening the head, then what follows.
    assert len(mapped.messages) < 12
    assert mapped.messages[1]["content"][0]["item"] is body["input"][at]
    assert RESPONSES.from_engine(body, mapped, mapped.messages) is body


def test_a_request_after_a_large_history_and_a_compaction_item_is_forwarded_unchanged() -> None:
    body = _compacted_session()
    raw = orjson.dumps(body)
    at = body["input"].index(COMPACTION)
    without = {**body, "input": body["input"][:at] + body["input"][at + 1 :]}
    transport = RecordingTransport()
    with running(_settings(), transport) as proxy:
        transport.script(json_reply(ANSWER), json_reply(ANSWER))
        reply = proxy.http.post(
            "/v1/responses", content=raw, headers={"content-type": "application/json"}
        )
        # Without the item, the same items are over the window's trigger, and condensed.
        again = proxy.http.post("/v1/responses", json=without)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-compaction-stage"] == "none"
    # Counted from the compaction item: the instructions, the item and two turns.
    assert int(reply.headers["x-compaction-tokens-before"]) < 6_000
    assert again.headers["x-compaction-stage"] == "condensed"
    assert int(again.headers["x-compaction-tokens-before"]) > 20_000
    assert transport.asked("/responses")[0].body == raw
    condensed = transport.asked("/responses")[1].json()
    assert condensed["context_management"] == body["context_management"]


def test_the_compact_endpoint_and_a_compaction_trigger_are_forwarded_byte_for_byte() -> None:
    body = _compacted_session()
    trigger = {**body, "input": [*body["input"], {"type": "compaction_trigger"}]}
    transport = RecordingTransport()
    with running(_settings(), transport) as proxy:
        transport.script(json_reply(ANSWER), json_reply({"id": "cmp", "output": [COMPACTION]}))
        for path, sent in (("/v1/responses", trigger), ("/v1/responses/compact", body)):
            raw = orjson.dumps(sent)
            reply = proxy.http.post(path, content=raw, headers={"content-type": "application/json"})
            assert reply.status_code == 200, reply.text
            assert transport.asked()[-1].path == path
            assert transport.asked()[-1].body == raw
