"""Checkpoints and events survive JSON exactly, and tolerate other versions' fields."""

from __future__ import annotations

import orjson

from proxy.state.stores import codec
from proxy.state.stores.figures import RequestRecord, SessionSettings, fold
from tests.proxy.state.stores.test_contract import checkpoint, event


def test_checkpoint_round_trip_is_exact() -> None:
    made = checkpoint(created_at=1_712_345_678.987654321)
    back = codec.load_checkpoint(codec.dump_checkpoint(made))
    assert back == made
    assert back.created_at == made.created_at
    assert back.replacement[0]["x-extra"] == [1, 2]
    assert type(back.replacement) is tuple


def test_event_round_trip_is_exact() -> None:
    made = event("c", "compaction.failed", replaced_hashes=("a", "b"), error="e", tokens_before=3)
    back = codec.load_event(codec.dump_event(made))
    assert back == made
    assert type(back.replaced_hashes) is tuple


def test_unknown_top_level_keys_are_ignored_and_missing_ones_default() -> None:
    data = orjson.loads(codec.dump_checkpoint(checkpoint()))
    data["from_a_newer_version"] = 1
    del data["model"]
    back = codec.load_checkpoint(orjson.dumps(data))
    assert back.model == ""
    assert back.end_hash == "h1"


def test_messages_round_trip_and_to_dict_is_json_ready() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "é"}], "zz": None}]
    assert codec.load_messages(codec.dump_messages(messages)) == messages
    assert orjson.loads(orjson.dumps(codec.to_dict(event("c"))))["type"] == "compaction.queued"


def test_figures_and_settings_round_trip_as_their_fields() -> None:
    record = RequestRecord(
        "s", "m", "condensed", "threshold", 900, 300, 800, 600, 200, 1.5, cost_dollars=0.25
    )
    summary = fold(None, [record])
    settings = SessionSettings(enabled=False, instructions="keep the paths", updated_at=1.5)
    for value in (record, summary, settings):
        raw = codec.dump(value)
        assert raw == orjson.dumps(codec.to_dict(value))
        assert codec.load(type(value), raw) == value
    assert orjson.loads(codec.dump(summary))["stages"] == {"condensed": 1}
