"""The fault matrix: what the proxy does when the upstream, the client or the
process itself misbehaves. Every test here asserts behaviour; none is a
benchmark.

Covered elsewhere (test_server.py, test_chat.py): 500/429 relayed on a plain
request, a silent upstream → bounded 504, a stream dropped mid-way → an error
event, an unreachable upstream → 502, the classic bad bodies → 400.
"""

from __future__ import annotations

import copy
import json
import random
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from compaction import SUMMARY_MARKER, TokenCounter
from config import load_settings
from proxy.app import create_app
from proxy.cli.server import GRACEFUL_SHUTDOWN_SECONDS
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import RecordingTransport, Reply, json_reply, running, settings_for
from tests.proxy.servers import FakeUpstream, ProxyProcess, poller, serve_hangup, serve_in_thread
from tests.synthetic import agent_session, conversations

HI = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


@contextmanager
def proxy_process(tmp_path: Path, upstream: str, toml: str = "") -> Iterator[ProxyProcess]:
    """``compaction-proxy serve`` in its own process, configured by ``toml``."""
    (tmp_path / "compaction-proxy.toml").write_text('[store]\nurl = "memory://"\n' + toml)
    proxy = ProxyProcess(upstream, {}, str(tmp_path))
    try:
        yield proxy
    finally:
        proxy.stop(kill=True)


# --- SIGTERM -------------------------------------------------------------------


def test_sigterm_lets_open_streams_finish_then_the_process_exits_by_itself(
    fake: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    upstream, upstream_url = fake
    upstream.chunks, upstream.chunk_delay = 40, 0.025  # streams of a second
    streams = 3
    lines: list[list[str]] = [[] for _ in range(streams)]
    errors: list[str] = []
    opened = [threading.Event() for _ in range(streams)]

    with proxy_process(tmp_path, upstream_url) as proxy:

        def consume(i: int) -> None:
            body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": i}]}
            try:
                with httpx.stream(
                    "POST", f"{proxy.url}/chat/completions", json=body, timeout=60
                ) as response:
                    for line in response.iter_lines():
                        if line:
                            lines[i].append(line)
                            opened[i].set()
            except httpx.HTTPError as exc:
                errors.append(f"stream {i}: {exc!r}")
            finally:
                opened[i].set()

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(streams)]
        for thread in threads:
            thread.start()
        assert all(event.wait(15) for event in opened), "the streams never started"
        proxy.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # How far each stream had got: none had reached its end.
        at_signal = [len(got) for got in lines]

        # While the open streams drain, no new connection is accepted.
        refused = False
        with poller(timeout=0.5) as poll:
            while not refused and time.monotonic() - signalled < 1.5:
                try:
                    poll.get(proxy.url.removesuffix("/v1") + "/healthz")
                    time.sleep(0.05)
                except httpx.TransportError:
                    refused = True

        for thread in threads:
            thread.join(GRACEFUL_SHUTDOWN_SECONDS + 10)
        # Bounded waits, not measurements: a process still there after the
        # grace period and more fails the test here.
        returncode = proxy.process.wait(timeout=GRACEFUL_SHUTDOWN_SECONDS + 10)

    assert errors == []
    words = "".join(f"w{i} " for i in range(40))
    for got in lines:
        assert got[-1] == "data: [DONE]"
        payloads = [json.loads(line.removeprefix("data: ")) for line in got[:-1]]
        assert len(payloads) == 1 + 40 + 1  # role, every word, finish_reason
        text = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads)
        assert text == words
        assert payloads[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(count < 1 + 40 + 1 + 1 for count in at_signal), (
        "a stream had ended before SIGTERM arrived"
    )
    assert refused, "the proxy kept accepting new connections after SIGTERM"
    # uvicorn exits by re-raising the signal once it is done: by itself, not
    # killed (the streams above ended whole, so it waited for them first).
    assert returncode in (0, -signal.SIGTERM)


# --- a huge body and the event loop --------------------------------------------

_WORDS = "alpha beta gamma delta error file path token chunk window summary ok { } ; ==".split()


def _log_text(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    size = 0
    while size < chars:
        line = f"{len(lines):06d} " + " ".join(rng.choices(_WORDS, k=12)) + "\n"
        lines.append(line)
        size += len(line)
    return "".join(lines)[:chars]


def _huge_conversations(seed: int) -> dict[str, list[dict[str, Any]]]:
    """Three ~2 MB conversations, each hiding its bulk in another shape."""
    text = _log_text(2_000_000, seed)

    def with_group(call_arguments: str, result: Any) -> list[dict[str, Any]]:
        function = {"name": "bash", "arguments": call_arguments}
        call = {"id": "c1", "type": "function", "function": function}
        return [
            *agent_session(seed=seed, steps=8),
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": result},
            {"role": "user", "content": "Go on."},
        ]

    command = json.dumps({"command": "cat build.log"})
    parts = [{"type": "text", "text": text[i : i + 20_000]} for i in range(0, len(text), 20_000)]
    return {
        "string tool output": with_group(command, text),
        "list tool output": with_group(command, parts),
        "tool call arguments": with_group(json.dumps({"command": text[:-1_000]}), "ok"),
    }


class OnWhichThread:
    """Records the thread every tokenization and JSON parse of a large input ran on.

    A 2 MB body parsed, keyed or counted on the event loop stalls every
    request in flight (/healthz included) for as long; the proxy does that
    work in worker threads. Which thread it ran on is the structure a test
    can hold; how long it took is for ``make bench``.
    """

    LARGE = 100_000  # characters of text, or bytes of JSON

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counted: list[int] = []
        self.parsed: list[int] = []
        count_text = TokenCounter.count_text
        loads = orjson.loads

        def counting(counter: TokenCounter, text: str) -> int:
            if len(text) > self.LARGE:
                self.counted.append(threading.get_ident())
            return count_text(counter, text)

        def parsing(raw: Any) -> Any:
            if len(raw) > self.LARGE:
                self.parsed.append(threading.get_ident())
            return loads(raw)

        monkeypatch.setattr(TokenCounter, "count_text", counting)
        monkeypatch.setattr(orjson, "loads", parsing)


def _completion() -> Reply:
    return json_reply(
        {
            "id": "c",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


@pytest.mark.parametrize(
    ("window", "stage"),
    [(8192, "compacted"), (2_000_000, "none")],
    ids=["over-the-trigger", "under-the-trigger"],
)
def test_a_2mb_body_is_parsed_and_counted_off_the_event_loop(
    start_app: AppFactory, monkeypatch: pytest.MonkeyPatch, window: int, stage: str
) -> None:
    # Scripted answers: the fake upstream would parse the 2 MB on the loop itself.
    transport = RecordingTransport()
    transport.script(*[_completion() for _ in range(4)])
    proxy = start_app(
        transport=transport,
        compaction={"summarizer": "extractive"},
        models={"gpt-4o": {"context_window": window}},
    )
    loop = proxy.http.portal.call(threading.get_ident)
    assert proxy.http.post(f"{proxy.url}/chat/completions", json=HI).status_code == 200
    threads = OnWhichThread(monkeypatch)
    for shape, messages in _huge_conversations(seed=window % 97).items():
        raw = json.dumps({"model": "gpt-4o", "messages": messages}).encode()
        assert len(raw) > 2_000_000
        response = proxy.http.post(
            f"{proxy.url}/chat/completions",
            content=raw,
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 200, response.text
        got = response.headers["x-compaction-stage"]
        assert (got != "none") if stage == "compacted" else (got == "none"), (shape, got)
    assert threads.parsed and threads.counted  # the work was seen at all
    assert loop not in threads.parsed, "a 2 MB body was parsed on the event loop"
    assert loop not in threads.counted, "2 MB of text was tokenized on the event loop"


def test_the_tokenizers_are_loaded_off_the_event_loop_before_the_first_request(
    start_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading a tokenizer takes most of a second and holds the GIL: the
    lifespan does it in a worker thread, before any request is taken."""
    import proxy.session.service

    loads: list[tuple[str, int]] = []
    load = proxy.session.service.load_encoding

    def recorded(name: str) -> Any:
        loads.append((name, threading.get_ident()))
        return load(name)

    monkeypatch.setattr(proxy.session.service, "load_encoding", recorded)
    app = start_app(models={"gpt-4o": {"context_window": 8192}})
    loop = app.http.portal.call(threading.get_ident)
    assert {name for name, _ in loads} >= {"o200k_base", "cl100k_base"}
    assert all(thread != loop for _, thread in loads)
    assert app.http.post(f"{app.url}/chat/completions", json=HI).status_code == 200


# --- bad bodies, fuzzed ------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
#: Any JSON value: what a field holds when the client got its type wrong.
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)


def _mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` three times in four, any JSON value otherwise."""
    return st.one_of(good, good, good, _values)


_ids = st.sampled_from(["a", "b", "c"])  # few ids, so calls and results often pair up
# Long enough, often enough, that the 700-token models compact.
_text = st.text(max_size=200) | st.integers(0, 400).map(lambda n: "lorem ipsum dolor " * n)
_parts = st.fixed_dictionaries(
    {"type": _mostly(st.sampled_from(["text", "image_url", "input_image", "input_audio"]))},
    optional={"text": _mostly(_text), "image_url": _values},
)
_call = st.fixed_dictionaries(
    {"id": _mostly(_ids)},
    optional={
        "type": _mostly(st.just("function")),
        "function": _mostly(
            st.fixed_dictionaries(
                {"name": _mostly(st.sampled_from(["bash", "read_file"]))},
                optional={"arguments": _mostly(_text | st.just('{"path": "a.py"}'))},
            )
        ),
    },
)


def _messages(wrong: bool) -> st.SearchStrategy[Any]:
    """Message lists: ``wrong`` ones hold values of the wrong type here and there."""
    maybe = _mostly if wrong else (lambda good: good)
    message = st.fixed_dictionaries(
        {"role": maybe(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))},
        optional={
            "content": st.one_of(_text, _text, st.none(), st.lists(_mostly(_parts), max_size=4))
            | _values,
            "tool_calls": _mostly(st.lists(_mostly(_call), max_size=3)),
            "tool_call_id": _mostly(_ids),
            "name": _mostly(st.text(max_size=8)),
            "function_call": _values,
        },
    )
    return maybe(st.lists(maybe(message), max_size=12))


def _chat_bodies(wrong: bool) -> st.SearchStrategy[dict[str, Any]]:
    maybe = _mostly if wrong else (lambda good: good)
    return st.fixed_dictionaries(
        {
            "model": maybe(st.sampled_from(["tiny", "tiny-llm", "gpt-4o", "no-such-model"])),
            "messages": _messages(wrong),
        },
        optional={
            "max_tokens": st.integers(min_value=-(2**70), max_value=2**70) | _values,
            "max_completion_tokens": _values,
            "stream": _mostly(st.booleans()),
            "stream_options": _mostly(st.fixed_dictionaries({"include_usage": _values})),
            "tools": _values,
            "functions": _values,
            "response_format": _values,
            "temperature": _values,
        },
    )


@st.composite
def _damaged_conversations(draw: st.DrawFn) -> dict[str, Any]:
    """A realistic conversation, big enough to compact, with a few fields of
    messages and tool calls replaced by values of any type."""
    messages = copy.deepcopy(draw(conversations(max_items=10)))
    for _ in range(draw(st.integers(1, 4))):
        message = draw(st.sampled_from(messages))
        listed = message.get("tool_calls")
        calls = [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []
        use_call: bool = bool(calls) and draw(st.booleans())
        target = draw(st.sampled_from(calls)) if use_call else message
        fields = ["content", "tool_calls", "tool_call_id", "name", "function_call", "id"]
        key = draw(st.sampled_from(sorted(set(target) - {"role"}) + fields))
        target[key] = draw(_values)
    return {"model": draw(st.sampled_from(["tiny", "tiny-llm"])), "messages": messages}


#: Well-formed requests with odd contents, damaged real conversations (both
#: reach compaction), requests with wrong types in places, any JSON value.
_bodies = st.one_of(
    _chat_bodies(wrong=False), _damaged_conversations(), _chat_bodies(wrong=True), _values
)
_nested = st.integers(min_value=100, max_value=3000).map(
    lambda depth: (
        b'{"model": "tiny", "messages": [{"role": "user", "content": '
        + b"[" * depth
        + b"]" * depth
        + b"}]}"
    )
)
_INVALID_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80", b"\xf5\x80\x80\x80"]


@st.composite
def _raw_bodies(draw: st.DrawFn) -> bytes:
    """Request bodies as bytes: valid JSON of odd shapes, truncated, corrupted, nested."""
    kind = draw(st.sampled_from(["json"] * 6 + ["truncated", "utf-8", "nested"]))
    if kind == "nested":
        return draw(_nested)
    raw = json.dumps(draw(_bodies)).encode()
    if kind == "truncated":
        return raw[: draw(st.integers(0, max(len(raw) - 1, 0)))]
    if kind == "utf-8":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.sampled_from(_INVALID_UTF8)) + raw[at:]
    return raw


#: Inputs that once crashed compaction/ with a 500 (pairing fields of the
#: wrong type); check_messages now refuses them with a 400.
_KNOWN_CRASHES = {
    "unhashable tool_call_id": (
        "compaction/messages.py group_messages: `tool_call_id in ids` (a set)",
        {
            "model": "gpt-4o",
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "a", "function": {"name": "bash", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": ["a"], "content": "x"},
            ],
        },
    ),
    "function_call not an object": (
        "compaction/messages.py repair_tool_pairing → call_name_and_arguments(list)",
        {
            "model": "gpt-4o",
            "messages": [
                {"role": "assistant", "content": None, "function_call": [None], "tool_calls": [{}]}
            ],
        },
    ),
    "unhashable tool call id, condensed": (
        "compaction/files.py collect_files: `results.get(call.get('id'))`",
        {
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "task"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": ["a"],
                            "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "a", "content": "lorem ipsum " * 400},
                {"role": "user", "content": "lorem ipsum " * 400},
                {"role": "assistant", "content": "ok"},
            ],
        },
    ),
}


def _is_openai_error(response: httpx.Response) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
    )


def test_bad_bodies_never_get_a_5xx(fake: tuple[FakeUpstream, str]) -> None:
    _, upstream_url = fake
    proxy_settings = load_settings(
        None,
        upstream={"base_url": upstream_url},
        store={"url": "memory://"},
        compaction={"summarizer": "extractive"},
        models={
            # Small windows, so that fuzzed bodies also go through compaction.
            "tiny": {"context_window": 700},
            "tiny-llm": {"context_window": 700, "summarizer": "llm"},
        },
    )
    # No keep-alive: uvicorn drops the connection after a crash, which would fail
    # the next example too.
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    with (
        serve_in_thread(create_app(proxy_settings)) as base,
        httpx.Client(timeout=30, limits=no_reuse) as client,
    ):

        @settings(
            max_examples=150,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(raw=_raw_bodies())
        @example(raw=b'{"messages": [{"role": "user", "content": "\\ud800"}]}')
        @example(
            raw=b'{"messages": [{"role": "user", "content": ' + b"[" * 300 + b"]" * 300 + b"}]}"
        )
        # Just inside the parser's nesting limit: the preview, which writes the
        # messages a level deeper, answered a 500 (found by this test).
        @example(
            raw=b'{"messages": [{"role": "user", "content": ' + b"[" * 252 + b"]" * 252 + b"}]}"
        )
        @example(raw=b'{"messages": [{"role": "tool", "tool_call_id": 1, "content": "x"}]}')
        @example(raw=b'{"model": "tiny", "max_tokens": 100000000000000000000, "messages": []}')
        def post(raw: bytes) -> None:
            for path in ("/v1/chat/completions", "/v1/compaction/preview"):
                response = client.post(
                    base + path, content=raw, headers={"content-type": "application/json"}
                )
                assert response.status_code < 500, (path, raw[:300], response.text[:300])
                if response.status_code >= 400:
                    assert _is_openai_error(response), (path, raw[:300], response.text[:300])

        post()


@pytest.mark.parametrize(
    "body",
    [pytest.param(body, id=name) for name, (where, body) in _KNOWN_CRASHES.items()],
)
def test_known_compaction_crashes_get_a_4xx(body: dict[str, Any]) -> None:
    statuses = []
    proxy_settings = settings_for(
        compaction={"summarizer": "extractive"}, models={"tiny": {"context_window": 700}}
    )
    with running(proxy_settings, RecordingTransport(app=FakeUpstream().app())) as proxy:
        for path in ("/chat/completions", "/compaction/preview"):
            statuses.append(proxy.http.post(proxy.url + path, json=body).status_code)
    # Asserted once the app's thread has stopped: pytest renders a failure
    # with ast.parse, which CPython before 3.11.8 can break (INTERNALERROR)
    # while other threads run (gh-106905).
    assert statuses == [400, 400], statuses


# --- a summarizer that does not summarize ------------------------------------------


@pytest.mark.parametrize("reply", ["garbage", "no-choices", "empty", "tool-calls", "error"])
def test_a_broken_summarizer_falls_back_to_the_extractive_summary(
    fake_upstream: FakeUpstream, start_app: AppFactory, reply: str
) -> None:
    upstream = fake_upstream
    upstream.summary_reply = reply
    proxy = start_app(models={"gpt-4o": {"context_window": 8192}})  # summarizer "llm"
    body = {"model": "gpt-4o", "messages": agent_session(seed=21, steps=120)}
    auth = {"authorization": "Bearer sk-client"}

    preview = proxy.http.post(f"{proxy.url}/compaction/preview", json=body, headers=auth)
    assert preview.status_code == 200
    report = preview.json()["report"]
    assert report["summarizer"] == "extractive"
    assert any("used extractive" in note for note in report["notes"]), report["notes"]
    asked = len(upstream.summary_requests)
    assert asked >= 1  # the llm was tried first

    response = proxy.http.post(f"{proxy.url}/chat/completions", json=body, headers=auth)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"].startswith("I saw")
    assert response.headers["x-compaction-stage"] == "condensed"
    assert response.headers["x-compaction-reason"] == "threshold"
    assert len(upstream.summary_requests) > asked
    sent = upstream.chat_requests[-1].json()["messages"]
    # The summary of the middle, and of the current turn's first steps (the tail
    # starts inside a turn): both are extractive digests, nothing of the fake's text.
    summaries = [
        str(m["content"]) for m in sent if str(m.get("content")).startswith(SUMMARY_MARKER)
    ]
    assert summaries and "## Goal" in summaries[0]
    assert not any("parse_window_header" in summary for summary in summaries)

    events = proxy.http.get(f"{proxy.url}/compaction/events", headers=auth).json()["data"]
    kinds = [event["type"] for event in events]
    assert kinds == ["context.compacted", "compaction.started", "compaction.queued"]
    assert events[0]["stage"] == "condensed"
    assert events[0]["checkpoint_id"] == response.headers["x-compaction-id"]


# --- upstream errors on a stream, and an upstream that hangs up ----------------------


def test_upstream_errors_on_a_stream_are_relayed_with_body_and_retry_after(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    upstream = fake_upstream
    proxy = start_app()
    upstream.behaviours = ["429", "500", "429"]
    body = {**HI, "stream": True}
    limited = proxy.http.post(f"{proxy.url}/chat/completions", json=body)
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "7"
    assert limited.headers["content-type"].startswith("application/json")
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    broken = proxy.http.post(f"{proxy.url}/chat/completions", json=body)
    assert broken.status_code == 500 and broken.json()["error"]["message"] == "boom"

    sdk = proxy.openai(api_key="sk-client", max_retries=0)
    with pytest.raises(openai.RateLimitError) as info:
        sdk.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert info.value.response.headers["retry-after"] == "7"
    assert len(upstream.chat_requests) == 3  # none was retried by the proxy


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_upstream_hanging_up_before_headers_gives_502(stream: bool) -> None:
    with serve_hangup() as dead:
        port = dead.rsplit(":", 1)[1]
        proxy_settings = load_settings(
            None, upstream={"base_url": f"{dead}/v1"}, store={"url": "memory://"}
        )
        with serve_in_thread(create_app(proxy_settings)) as base:
            response = httpx.post(
                f"{base}/v1/chat/completions", json={**HI, "stream": stream}, timeout=10
            )
            models = httpx.get(f"{base}/v1/models", timeout=10)
    for answer in (response, models):
        assert answer.status_code == 502
        error = answer.json()["error"]
        assert error["code"] == "upstream_unreachable" and error["type"] == "upstream_error"
        assert port not in answer.text
