"""The dialect contract: what each API answers for itself, and that the rest of proxy/ never asks.

Every dialect is driven here the same way, through its API's real SDK
(``openai`` for Chat Completions and Responses, ``anthropic`` for Messages)
against a mock transport holding the proxy's bytes: the ``/compact`` reply,
whole and streamed, and the error event that ends a broken or empty stream.
The last part reads the source of every ``proxy/`` module outside
``proxy/dialects/`` and fails on a branch that asks which API a request speaks.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import orjson
import pytest

import proxy.dialects
from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.dialects.responses import RESPONSES
from proxy.edge.errors import BadRequest

ROOT = Path(__file__).resolve().parents[3]
PROXY = ROOT / "proxy"
TEXT = "Context compacted: 9 → 3 tokens."

#: An upstream answer: the bytes the proxy sends, as the SDK's transport returns them.
Answer = tuple[bytes, str]


# --- each API's real client ------------------------------------------------------------


def _openai(answer: Answer) -> openai.OpenAI:
    body, media = answer
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, content=body, headers={"content-type": media})
    )
    return openai.OpenAI(
        api_key="k",
        base_url="http://upstream/v1",
        max_retries=0,
        http_client=httpx.Client(transport=transport),
    )


def _anthropic(answer: Answer) -> anthropic.Anthropic:
    body, media = answer
    transport = httpx2.MockTransport(
        lambda request: httpx2.Response(200, content=body, headers={"content-type": media})
    )
    return anthropic.Anthropic(
        api_key="k",
        base_url="http://upstream",
        max_retries=0,
        http_client=httpx2.Client(transport=transport),
    )


_ASK = [{"role": "user", "content": "/compact"}]


def _chat_text(answer: Answer, stream: bool) -> str:
    client = _openai(answer).chat.completions
    if not stream:
        return client.create(model="m", messages=_ASK).choices[0].message.content or ""  # type: ignore[arg-type]
    chunks = client.create(model="m", messages=_ASK, stream=True)  # type: ignore[arg-type]
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _chat_error(answer: Answer) -> tuple[str, str | None]:
    with pytest.raises(openai.APIError) as caught:
        for _ in _openai(answer).chat.completions.create(model="m", messages=_ASK, stream=True):  # type: ignore[arg-type]
            pass
    body = caught.value.body
    return caught.value.message, body.get("code") if isinstance(body, dict) else None


def _anthropic_text(answer: Answer, stream: bool) -> str:
    client = _anthropic(answer).messages
    if not stream:
        block = client.create(model="m", max_tokens=10, messages=_ASK).content[0]  # type: ignore[arg-type]
    else:
        with client.stream(model="m", max_tokens=10, messages=_ASK) as events:  # type: ignore[arg-type]
            block = events.get_final_message().content[0]
    assert block.type == "text"
    return block.text


def _anthropic_error(answer: Answer) -> tuple[str, str | None]:
    with pytest.raises(anthropic.APIStatusError) as caught:
        for _ in _anthropic(answer).messages.create(
            model="m",
            max_tokens=10,
            messages=_ASK,  # type: ignore[arg-type]
            stream=True,
        ):
            pass
    body: Any = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    return body["error"]["message"], None  # the API's error event carries no code


def _responses_text(answer: Answer, stream: bool) -> str:
    client = _openai(answer).responses
    if not stream:
        return client.create(model="m", input="/compact").output_text
    with client.stream(model="m", input="/compact") as events:
        return events.get_final_response().output_text


def _responses_error(answer: Answer) -> tuple[str, str | None]:
    events = list(_openai(answer).responses.create(model="m", input="/compact", stream=True))
    errors = [e for e in events if e.type == "error"]
    # The error, then the event that ends a failed Response, saying the same.
    assert len(errors) == 1 and events[-2] is errors[0]
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error is not None
    assert (failed.response.error.message, failed.response.error.code) == (
        errors[0].message,
        errors[0].code,
    )
    return errors[0].message, errors[0].code


@dataclass(frozen=True)
class Api:
    """One dialect and how its SDK reads what the proxy writes in it."""

    dialect: Dialect
    #: The text a client reads from an answer, whole (False) or streamed (True).
    text: Callable[[Answer, bool], str]
    #: The message and code a client is told by a stream that ends in an error event.
    error: Callable[[Answer], tuple[str, str | None]]
    #: The exact error event, byte for byte, for message "m" and code "c".
    error_bytes: bytes


APIS = [
    Api(
        CHAT,
        _chat_text,
        _chat_error,
        b'data: {"error":{"message":"m","type":"upstream_error","code":"c"}}\n\n',
    ),
    Api(
        ANTHROPIC,
        _anthropic_text,
        _anthropic_error,
        b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"m"}}\n\n',
    ),
    Api(
        RESPONSES,
        _responses_text,
        _responses_error,
        b'event: error\ndata: {"type":"error","code":"c","message":"m","param":null}\n\n'
        b'event: response.failed\ndata: {"type":"response.failed","response":{"id":'
        b'"resp_proxy_error","object":"response","created_at":0,"status":"failed","error":'
        b'{"code":"c","message":"m"},"incomplete_details":null,"output":[]}}\n\n',
    ),
]
EACH_API = pytest.mark.parametrize("api", APIS, ids=[api.dialect.name for api in APIS])


def _stream(events: Iterator[bytes] | list[bytes]) -> Answer:
    return b"".join(events), "text/event-stream"


# --- the answers the proxy writes --------------------------------------------------------


@EACH_API
def test_the_manual_reply_is_a_whole_answer_its_sdk_reads(api: Api) -> None:
    reply = api.dialect.manual_reply("m", TEXT)
    assert orjson.loads(orjson.dumps(reply)) == reply  # plain JSON, nothing else
    assert api.text((orjson.dumps(reply), "application/json"), False) == TEXT


@EACH_API
@pytest.mark.parametrize("text", [TEXT, "two\nlines, and a \r return", ""])
def test_the_manual_events_are_a_stream_its_sdk_reads(api: Api, text: str) -> None:
    events = list(api.dialect.manual_events("m", text, {"stream": True}))
    assert all(e.endswith(b"\n\n") and e.count(b"\n\n") == 1 for e in events)  # one frame each
    assert api.text(_stream(events), True) == text


@pytest.mark.parametrize("asked", [True, False, "yes", None])
def test_chat_reports_usage_in_a_last_chunk_only_when_the_client_asked(asked: Any) -> None:
    request = {"stream": True, "stream_options": {"include_usage": asked}}
    chunks = list(
        _openai(_stream(CHAT.manual_events("m", TEXT, request))).chat.completions.create(
            model="m",
            messages=_ASK,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == TEXT
    if asked is True:
        assert [c.usage is None for c in chunks] == [True, True, True, False]
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.total_tokens == 0
    else:
        assert len(chunks) == 3 and all(c.usage is None for c in chunks)


@EACH_API
def test_the_error_event_is_pinned_byte_for_byte(api: Api) -> None:
    assert api.dialect.error_event("m", "c") == api.error_bytes


@EACH_API
def test_a_stream_of_only_the_error_event_tells_the_client_why(api: Api) -> None:
    message = "The upstream ended the stream before sending anything."
    told, code = api.error(_stream([api.dialect.error_event(message, "upstream_empty")]))
    assert told == message
    assert code in (None, "upstream_empty")


@EACH_API
def test_a_stream_broken_after_its_first_event_ends_in_the_error(api: Api) -> None:
    first = next(iter(api.dialect.manual_events("m", TEXT, {"stream": True})))
    message = "The upstream connection was lost mid-stream."
    told, code = api.error(_stream([first, api.dialect.error_event(message, "upstream_dropped")]))
    assert told == message
    assert code in (None, "upstream_dropped")


# --- reading a body and asking for a summary -------------------------------------------


@EACH_API
@pytest.mark.parametrize("raw", [b"[]", b"not json", b'"text"'])
def test_a_body_that_is_not_an_object_is_a_bad_request(api: Api, raw: bytes) -> None:
    with pytest.raises(BadRequest):
        api.dialect.read(raw)


def test_chat_is_read_as_the_engines_own_messages_with_no_mapping() -> None:
    reading = CHAT.read(b'{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    assert reading.mapped is None and reading.original is None and reading.untouchable is None
    assert reading.messages is reading.body["messages"]
    assert reading.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("dialect", "raw"),
    [
        (ANTHROPIC, b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'),
        (RESPONSES, b'{"model":"m","input":[{"role":"user","content":"hi"}]}'),
    ],
)
def test_another_api_is_read_as_its_request_and_its_mapping(dialect: Dialect, raw: bytes) -> None:
    reading = dialect.read(raw)
    assert reading.original == orjson.loads(raw)
    assert reading.mapped is not None and reading.messages is reading.mapped.messages
    assert [(m["role"], m["content"]) for m in reading.messages] == [("user", "hi")]
    assert reading.body is reading.mapped.request and reading.untouchable is None


def test_a_request_built_on_server_state_is_read_untouched_and_unmapped() -> None:
    reading = RESPONSES.read(b'{"model":"m","input":"hi","previous_response_id":"resp_1"}')
    assert reading.untouchable is not None and "previous_response_id" in reading.untouchable
    assert reading.mapped is None and reading.messages == []
    assert reading.body is reading.original


_REFUSAL = orjson.dumps(
    {"error": {"message": "Unsupported parameter: 'max_tokens'. Use 'max_completion_tokens'."}}
)


def test_chat_asks_a_reasoning_model_again_with_its_own_parameter_names() -> None:
    request = CHAT.summary_request("o3", [{"role": "user", "content": "x"}], 600)
    retry = CHAT.summary_retry(request, 400, _REFUSAL)
    assert retry == {
        "model": "o3",
        "messages": [{"role": "user", "content": "x"}],
        "stream": False,
        "max_completion_tokens": 600,
    }
    assert "max_tokens" in request and "temperature" in request  # the first request is kept
    assert CHAT.summary_retry(retry, 400, _REFUSAL) is None  # asked their way: no third try
    assert CHAT.summary_retry(request, 400, b'{"error":{"message":"bad model"}}') is None
    assert CHAT.summary_retry(request, 500, _REFUSAL) is None


@pytest.mark.parametrize("dialect", [ANTHROPIC, RESPONSES], ids=["anthropic", "responses"])
def test_the_other_apis_have_no_second_summary_request(dialect: Dialect) -> None:
    request = dialect.summary_request("m", [{"role": "user", "content": "x"}], 600)
    assert dialect.summary_retry(request, 400, _REFUSAL) is None


# --- no branch on the API outside proxy/dialects/ ----------------------------------------


@dataclass(frozen=True)
class Dialects:
    """What names an API in source: its singleton, its class, its ``name``."""

    singletons: frozenset[str]
    classes: frozenset[str]
    names: frozenset[str]


def _dialects() -> Dialects:
    """Every dialect singleton in proxy/dialects/ and its API folders, found by its
    shape (a fourth API counts too, whatever its folder's ``__init__`` exports)."""
    singletons, classes, names = set(), set(), set()
    for info in pkgutil.walk_packages(proxy.dialects.__path__, "proxy.dialects."):
        module = importlib.import_module(info.name)
        for variable, value in vars(module).items():
            if isinstance(value, type) or not all(
                hasattr(value, member) for member in ("name", "path", "to_engine", "error_event")
            ):
                continue
            singletons.add(variable)
            classes.add(type(value).__name__)
            names.add(value.name)
    return Dialects(frozenset(singletons), frozenset(classes), frozenset(names))


DIALECTS = _dialects()


def _is_dialect_name(node: ast.AST) -> bool:
    """``x.dialect.name`` / ``dialect.name``: the name read off a dialect."""
    if not isinstance(node, ast.Attribute) or node.attr != "name":
        return False
    owner = node.value
    last = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    return "dialect" in last.lower()


def _names_an_api(node: ast.AST, dialects: Dialects) -> bool:
    """Whether ``node`` is a dialect singleton, a dialect's name, or one of the API names."""
    if isinstance(node, ast.Name):
        return node.id in dialects.singletons
    if isinstance(node, ast.Attribute):
        return node.attr in dialects.singletons or _is_dialect_name(node)
    if isinstance(node, ast.Constant):
        return node.value in dialects.names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_an_api(element, dialects) for element in node.elts)
    return False


def branches_on_the_api(source: str, dialects: Dialects = DIALECTS) -> list[str]:
    """The places in ``source`` that ask which API a request speaks: a comparison
    with a dialect singleton or an API's name, an ``isinstance`` on a dialect
    class, a ``match`` on one, or a table looked up by a dialect's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        culprit = None
        if isinstance(node, ast.Compare):
            if any(_names_an_api(side, dialects) for side in (node.left, *node.comparators)):
                culprit = node
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
            kinds = node.args[1:]
            named = {n.id for k in kinds for n in ast.walk(k) if isinstance(n, ast.Name)}
            if named & dialects.classes:
                culprit = node
        elif isinstance(node, ast.match_case):
            patterns = [n for n in ast.walk(node.pattern) if isinstance(n, ast.MatchValue)]
            classes = [n for n in ast.walk(node.pattern) if isinstance(n, ast.MatchClass)]
            if any(_names_an_api(p.value, dialects) for p in patterns) or any(
                getattr(c.cls, "id", "") in dialects.classes for c in classes
            ):
                culprit = node.pattern
        elif isinstance(node, ast.Subscript) and _is_dialect_name(node.slice):
            culprit = node
        if culprit is not None:
            found.append(f"line {getattr(culprit, 'lineno', '?')}: {ast.unparse(culprit)}")
    return found


def test_the_dialects_are_found_by_their_shape() -> None:
    assert DIALECTS.singletons == {"CHAT", "ANTHROPIC", "RESPONSES"}
    assert DIALECTS.classes == {"ChatDialect", "AnthropicDialect", "ResponsesDialect"}
    assert DIALECTS.names == {"chat", "anthropic", "responses"}


@pytest.mark.parametrize(
    "source",
    [
        "if dialect is CHAT:\n    pass",
        "ok = status == 400 and self._dialect is CHAT",
        "if call.dialect is not CHAT:\n    pass",
        "if api == 'anthropic':\n    pass",
        "streamed = call.dialect.name in ('responses', 'anthropic')",
        "if call.dialect.name == label:\n    pass",
        "if dialect == dialects.RESPONSES:\n    pass",
        "if isinstance(dialect, (ChatDialect, AnthropicDialect)):\n    pass",
        "match dialect.name:\n    case 'chat':\n        pass",
        "match dialect:\n    case ResponsesDialect():\n        pass",
        "event = EVENTS[call.dialect.name]",
    ],
)
def test_a_branch_on_the_api_is_found(source: str) -> None:
    assert branches_on_the_api(source), source


@pytest.mark.parametrize(
    "source",
    [
        "def handle(dialect: Dialect = CHAT) -> None: ...",
        "ROUTES = {'/v1/messages': ANTHROPIC, '/v1/chat/completions': CHAT}",
        "base, key = ANTHROPIC.route(config) if anthropic else openai",
        "scope = scope_of(config, credential, dialect.name)",
        "fields = {'api': call.dialect.name, **fields}",
        "if config.name == 'chat-model':\n    pass",
        "anthropic = path == 'messages' or path.startswith('messages/')",
    ],
)
def test_using_a_dialect_without_asking_which_it_is_is_allowed(source: str) -> None:
    assert branches_on_the_api(source) == []


def test_no_module_outside_proxy_dialects_branches_on_the_api() -> None:
    """A fourth API is one new folder in proxy/dialects/: the request path
    (flow, session, upstream, edge, state, api, ui, cli) asks its dialect,
    never which dialect it has."""
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(PROXY.rglob("*.py"))
        if "dialects" not in path.relative_to(PROXY).parts
        and (hits := branches_on_the_api(path.read_text(), DIALECTS))
    }
    assert found == {}
