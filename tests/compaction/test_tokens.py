from __future__ import annotations

import gzip
import hashlib
import logging
from pathlib import Path

import pytest

from compaction import encodings
from compaction.tokens import REPLY_PRIMING, TokenCounter, encoding_for_model
from tests.conftest import tool_group, user


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("openai/gpt-4.1", "o200k_base"),
        ("gpt-5-mini", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("llama3.1:8b", "cl100k_base"),
        (None, "cl100k_base"),
    ],
)
def test_encoding_by_family(model: str | None, encoding: str) -> None:
    assert encoding_for_model(model) == encoding


def test_real_tiktoken_counts_loaded_offline() -> None:
    counter = TokenCounter("gpt-4o")
    assert counter.encoding_name == "o200k_base"
    # Known o200k figure: "hello world" is two tokens.
    assert counter.count_text("hello world") == 2
    cl = TokenCounter("gpt-4")
    assert cl.encoding_name == "cl100k_base"
    assert cl.count_text("hello world") == 2


def test_message_overhead_follows_openai_recipe() -> None:
    counter = TokenCounter("gpt-4o")
    plain = counter.count_message({"role": "user", "content": "hello world"})
    assert plain == 3 + 2
    named = counter.count_message({"role": "user", "content": "hello world", "name": "bob"})
    assert named == plain + 1 + counter.count_text("bob")


def test_images_cost_the_configured_fixed_amount() -> None:
    counter = TokenCounter("gpt-4o", image_tokens=1000)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 50_000}}
    message = {"role": "user", "content": [{"type": "text", "text": "hi"}, image, image]}
    assert counter.count_message(message) == 3 + 1 + 2000


def test_tool_calls_and_schemas_are_counted() -> None:
    counter = TokenCounter("gpt-4o")
    call = tool_group("read_file", {"path": "src/app.py"}, "contents")[0]
    assert counter.count_message(call) > 3 + counter.count_text("src/app.py")
    bare = {"messages": [user("hi")]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with_tools = {"messages": [user("hi")], "tools": tools}
    assert counter.count_request(bare) == counter.count_message(user("hi")) + REPLY_PRIMING
    assert counter.count_request(with_tools) > counter.count_request(bare)
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert counter.count_request({**bare, "response_format": schema}) > counter.count_request(bare)


def test_cache_hits_on_resent_history_and_stays_bounded() -> None:
    counter = TokenCounter("gpt-4o", cache_size=3)
    history = [user(f"message {i}") for i in range(3)]
    counter.count_messages(history)
    assert (counter.hits, counter.misses) == (0, 3)
    counter.count_messages([*history])  # equal dicts, new objects: keyed by content
    assert counter.hits == 3
    counter.count_messages([user("new one")])
    assert not counter.is_cached(history[0])  # evicted: least recently used
    assert counter.is_cached(history[2])


def test_encoding_files_are_verified_and_placed_under_tiktokens_cache_name(
    tmp_path: Path,
) -> None:
    assert encodings.install_encoding_file("cl100k_base", tmp_path)
    spec = encodings.ENCODING_FILES["cl100k_base"]
    placed = tmp_path / hashlib.sha1(spec.url.encode()).hexdigest()
    assert hashlib.sha256(placed.read_bytes()).hexdigest() == spec.sha256


def test_a_corrupt_cached_file_is_replaced(tmp_path: Path) -> None:
    spec = encodings.ENCODING_FILES["cl100k_base"]
    (tmp_path / spec.cache_name).write_bytes(b"garbage")
    assert encodings.install_encoding_file("cl100k_base", tmp_path)
    assert hashlib.sha256((tmp_path / spec.cache_name).read_bytes()).hexdigest() == spec.sha256


def test_a_bundle_with_the_wrong_hash_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        encodings, "_bundled_bytes", lambda name: gzip.decompress(gzip.compress(b"tampered"))
    )
    assert not encodings.install_encoding_file("o200k_base", tmp_path)
    assert not (tmp_path / encodings.ENCODING_FILES["o200k_base"].cache_name).exists()


def test_falls_back_to_characters_over_four_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(encodings, "install_encoding_file", lambda name, cache_dir: False)
    encodings.load_encoding.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="compaction.encodings"):
            counter = TokenCounter("gpt-4o")
        assert counter.encoding_name == "chars/4"
        assert counter.count_text("x" * 40) == 10
        assert "characters / 4" in caplog.text
    finally:
        encodings.load_encoding.cache_clear()
