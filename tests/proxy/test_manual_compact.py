"""``/compact [instructions]`` and "compact now" after an automatic compaction,
in all three APIs, against real upstreams on loopback.

A chat client (``llm -c``) keeps talking after the proxy compacted its
conversation on its own; then the user types ``/compact focus on …``. The
proxy must ask the summarizer again — the focus in its prompt, the earlier
summary folded in — and its reply must state this compaction's figures, the
same ones its headers, its log line and its event give.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from compaction import session_key
from config import load_settings
from proxy.flow import manual
from proxy.state.logs import REQUESTS
from tests.client_bodies import (
    AIDER_REMINDER,
    CLAUDE_CODE_CONTEXT,
    CLAUDE_CODE_TODO,
    QWEN_REQUEST,
    aider_recorded,
    qwen_code_body,
    text_block,
)
from tests.proxy.dialects.anthropic.upstream import AnthropicUpstream
from tests.proxy.dialects.responses.upstream import ResponsesUpstream
from tests.proxy.inprocess import UPSTREAM_URL, InProcessProxy, RecordingTransport, running
from tests.proxy.servers import FakeUpstream

MODEL = "manual-model"
#: A small window, so that a few long answers cross the trigger; answers
#: longer than the verbatim tail, so that the automatic compaction keeps only
#: the newest question — where ``/compact`` used to find nothing to do.
PROFILE = {
    "context_window": 8_192,
    "summarizer": "llm",
    "summary_must_pay": False,  # a model asked for every summary
    "keep_recent_tokens": 1_000,
    # Compacted by the request that crosses the trigger, not prepared ahead.
    "precompute_share": 0,
    # Long answers are condensed, not briefed.
    "assistant_text_chars": 1_000_000,
}
FOCUS = "focus on the err= numbers"
KEY = "sk-manual-0123456789"
_WORDS = "the window header parser returns a string where the caller wants a number".split()
_FIGURES = re.compile(r"Context compacted: ([\d,]+) → ([\d,]+) tokens \((\d+) messages condensed\)")


def _answer(turn: int) -> str:
    """A long assistant answer that mentions its own error number."""
    words = " ".join(_WORDS[(turn + i) % len(_WORDS)] for i in range(2_400))
    return f"Turn {turn}: the run failed with err={1000 + turn}. {words}"


def _turns(count: int) -> list[tuple[str, str]]:
    """(role, text) of a plain chat: a task, then answers and short questions."""
    turns = [("system", "You are a helpful assistant."), ("user", "Why does the parser fail?")]
    for turn in range(count):
        turns += [("assistant", _answer(turn)), ("user", f"And what about case {turn}?")]
    return turns


@dataclass
class Api:
    """One API as a client speaks it: its path, its body, where its
    summarizer's prompts and its answers' texts are found."""

    name: str
    path: str
    body: Callable[[list[tuple[str, str]]], dict[str, Any]]
    reply_text: Callable[[dict[str, Any]], str]
    summary_prompts: Callable[[], list[str]]


def _chat_body(turns: list[tuple[str, str]]) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": r, "content": t} for r, t in turns]}


def _anthropic_body(turns: list[tuple[str, str]]) -> dict[str, Any]:
    system = [t for r, t in turns if r == "system"]
    messages = [{"role": r, "content": t} for r, t in turns if r != "system"]
    return {"model": MODEL, "max_tokens": 512, "system": system[0], "messages": messages}


def _responses_body(turns: list[tuple[str, str]]) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for role, text in turns:
        if role == "assistant":
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        else:
            items.append({"role": "developer" if role == "system" else role, "content": text})
    return {"model": MODEL, "input": items}


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, dict):
        for key in ("text", "content", "system", "instructions", "input", "messages"):
            if key in value:
                yield from _texts(value[key])


@contextmanager
def _api(name: str) -> Iterator[tuple[Api, InProcessProxy]]:
    """The API's upstream and a proxy in front of it; the proxy's /v1 URL."""
    if name == "chat":
        chat = FakeUpstream()
        upstream_app, prompts = chat.app(), lambda: chat.summary_prompts
        api = Api(
            name,
            "/chat/completions",
            _chat_body,
            lambda r: str(r["choices"][0]["message"]["content"]),
            lambda: prompts(),
        )
    elif name == "anthropic":
        claude = AnthropicUpstream()
        upstream_app = claude.app()
        api = Api(
            name,
            "/messages",
            _anthropic_body,
            lambda r: str(r["content"][0]["text"]),
            lambda: ["\n".join(_texts(s.json())) for s in claude.summary_requests],
        )
    else:
        responses = ResponsesUpstream()
        upstream_app = responses.app()
        api = Api(
            name,
            "/responses",
            _responses_body,
            lambda r: "".join(_texts(r["output"])),
            lambda: ["\n".join(_texts(s.json())) for s in responses.summary_requests],
        )
    settings = load_settings(
        None,
        upstream={"base_url": UPSTREAM_URL, "anthropic_base_url": UPSTREAM_URL, "trust_env": False},
        store={"url": "memory://"},
        models={MODEL: PROFILE},
    )
    with running(settings, RecordingTransport(app=upstream_app)) as proxy:
        yield api, proxy


def _post(proxy: InProcessProxy, api: Api, turns: list[tuple[str, str]]) -> httpx.Response:
    response = proxy.http.post(
        f"{proxy.url}{api.path}",
        json=api.body(turns),
        headers={"authorization": f"Bearer {KEY}", "x-api-key": KEY},
    )
    assert response.status_code == 200, response.text
    return response


def _until_compacted(proxy: InProcessProxy, api: Api) -> list[tuple[str, str]]:
    """Talk until the proxy compacts on its own: the request it compacted."""
    for count in range(1, 12):
        turns = _turns(count)
        if _post(proxy, api, turns).headers["x-compaction-stage"] == "condensed":
            return turns
    raise AssertionError("the conversation never crossed the trigger")


def _events(proxy: InProcessProxy) -> list[dict[str, Any]]:
    response = proxy.http.get(
        f"{proxy.url}/compaction/events", headers={"authorization": f"Bearer {KEY}"}
    )
    data: list[dict[str, Any]] = response.json()["data"]
    return data


@pytest.mark.parametrize("name", ["chat", "anthropic", "responses"])
def test_compact_after_an_automatic_compaction_summarizes_again_with_the_focus(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with _api(name) as (api, proxy):
        compacted = _until_compacted(proxy, api)
        # Its long answer is all that follows the automatic summary's span.
        history = [*compacted, ("assistant", _answer(len(compacted)))]
        asked = len(api.summary_prompts())
        with caplog.at_level(logging.INFO, logger=REQUESTS):
            response = _post(proxy, api, [*history, ("user", f"/compact {FOCUS}")])
        prompts = api.summary_prompts()[asked:]
        assert prompts, "the summarizer was asked again"
        assert all(FOCUS in prompt for prompt in prompts)
        # Nothing but the newest answer follows the automatic summary's span:
        # the summary is made again from the messages it covered, where the
        # numbers the user asks about are.
        assert any("err=1000" in prompt for prompt in prompts)

        headers = response.headers
        assert (headers["x-compaction-stage"], headers["x-compaction-reason"]) == (
            "condensed",
            "manual",
        )
        figures = _FIGURES.search(api.reply_text(response.json()))
        assert figures is not None, api.reply_text(response.json())
        before, after, condensed = (int(g.replace(",", "")) for g in figures.groups())
        assert before == int(headers["x-compaction-tokens-before"])
        assert after == int(headers["x-compaction-tokens-after"])
        assert after < before
        [line] = [r for r in caplog.records if r.name == REQUESTS]
        fields = line.fields  # type: ignore[attr-defined]
        assert (fields["stage"], fields["reason"]) == ("condensed", "manual")
        assert (fields["tokens_before"], fields["tokens_after"]) == (before, after)

        [event] = [e for e in _events(proxy) if e["type"] == "context.compacted"][:1]
        assert (event["reason"], event["tokens_after"]) == ("manual", after)
        assert event["checkpoint_id"] == headers["x-compaction-id"]
        # The count is the messages the new checkpoint stands for: more than the
        # automatic one covered (it folded that one and what came after it).
        checkpoint = proxy.http.get(
            f"{proxy.url}/compaction/checkpoints/{headers['x-compaction-id']}",
            headers={"authorization": f"Bearer {KEY}"},
        ).json()
        assert condensed == checkpoint["covered"]


def test_compact_folds_the_earlier_summary_with_what_came_after_it() -> None:
    with _api("chat") as (api, proxy):
        compacted = _until_compacted(proxy, api)
        count = len(compacted)
        history = [*compacted, ("assistant", _answer(count)), ("user", "And then?")]
        history += [("assistant", _answer(count + 1))]
        asked = len(api.summary_prompts())
        response = _post(proxy, api, [*history, ("user", f"/compact {FOCUS}")])
        prompts = api.summary_prompts()[asked:]
        assert prompts and all(FOCUS in prompt for prompt in prompts)
        # The automatic summary (the fake's text) travels as the one to update.
        folded = [p for p in prompts if "<previous-summary>" in p]
        assert folded and "parse_window_header" in folded[0].split("<previous-summary>")[1]
        text = api.reply_text(response.json())
        assert text.endswith("The previous summary was folded into the new one.")
        figures = _FIGURES.search(text)
        assert figures is not None
        assert int(figures.group(2).replace(",", "")) == int(
            response.headers["x-compaction-tokens-after"]
        )


def test_compact_with_nothing_to_condense_says_so() -> None:
    with _api("chat") as (api, proxy):
        response = _post(proxy, api, [("user", "hello"), ("user", "/compact")])
        text = api.reply_text(response.json())
        assert text.startswith("Nothing to compact:")
        assert f"{int(response.headers['x-compaction-tokens-before']):,} tokens" in text
        assert response.headers["x-compaction-reason"] == "manual"


def test_compact_now_after_an_automatic_compaction_summarizes_again() -> None:
    with _api("chat") as (api, proxy):
        compacted = _until_compacted(proxy, api)
        # Less has come since the automatic compaction than its summary holds.
        later = [*compacted, ("assistant", "Let me check."), ("user", "Go on.")]
        session = session_key(api.body(later)["messages"])
        queued = proxy.http.post(
            f"{proxy.url}/compaction/sessions/{session}/compact",
            headers={"authorization": f"Bearer {KEY}"},
        )
        assert queued.status_code == 202
        asked = len(api.summary_prompts())
        response = _post(proxy, api, later)
        assert len(api.summary_prompts()) > asked
        headers = response.headers
        assert (headers["x-compaction-stage"], headers["x-compaction-reason"]) == (
            "condensed",
            "manual",
        )
        [event] = [e for e in _events(proxy) if e["type"] == "context.compacted"][:1]
        assert (event["reason"], event["checkpoint_id"]) == ("manual", headers["x-compaction-id"])
        assert event["tokens_after"] == int(headers["x-compaction-tokens-after"])


# --- the command among what each client wraps around the typed text ---------------

QWEN_REMINDERS = [
    text_block(
        "<system-reminder>\nThe following skills are available for use with the Skill "
        "tool.\n</system-reminder>"
    ),
    text_block(
        "<system-reminder>\nThis is the Qwen Code. We are setting up the context for our "
        "chat.\nToday's date is Monday, November 30, 2026.\n</system-reminder>"
    ),
]


def _qwen_command(text: str) -> list[dict[str, Any]]:
    """qwen-code's last user message: its reminder parts, then the typed text
    (the reminders as recorded, where the recording is here)."""
    reminders = QWEN_REMINDERS
    if QWEN_REQUEST.exists():
        reminders = qwen_code_body(text)["messages"][1]["content"][:-1]
    return [*reminders, text_block(text)]


def _claude_code_custom_command(text: str) -> list[dict[str, Any]]:
    """Claude Code's message for a custom slash command ``/proxy-compact`` whose
    file holds ``/compact $ARGUMENTS``: its record of the command, then the
    expansion, then a reminder."""
    args = text.removeprefix(manual.COMMAND).strip()
    record = (
        "<command-message>proxy-compact is running…</command-message>\n"
        "<command-name>/proxy-compact</command-name>\n"
        f"<command-args>{args}</command-args>"
    )
    return [text_block(record), text_block(text + "\n"), text_block(CLAUDE_CODE_TODO)]


def _claude_code_typed(text: str) -> list[dict[str, Any]]:
    """The typed text with a reminder before and after it (Claude Code's ``-p``)."""
    return [text_block(CLAUDE_CODE_CONTEXT), text_block(text), text_block(CLAUDE_CODE_TODO)]


def _aider_last(body: dict[str, Any]) -> None:
    """aider closes every request with its system reminder, after the user's turn."""
    body["messages"].append({"role": "system", "content": AIDER_REMINDER})


@pytest.mark.parametrize(
    ("name", "content", "after"),
    [
        pytest.param("chat", _qwen_command, None, id="qwen-code"),
        pytest.param("chat", lambda text: text, _aider_last, id="aider"),
        pytest.param("anthropic", _claude_code_typed, None, id="claude-code"),
        pytest.param("anthropic", _claude_code_custom_command, None, id="claude-code-command"),
    ],
)
def test_compact_is_found_in_the_typed_text_whatever_the_client_wraps_around_it(
    name: str,
    content: Callable[[str], Any],
    after: Callable[[dict[str, Any]], None] | None,
) -> None:
    with _api(name) as (api, proxy):
        compacted = _until_compacted(proxy, api)
        history = [*compacted, ("assistant", _answer(len(compacted)))]
        body = api.body([*history, ("user", "placeholder")])
        body["messages"][-1]["content"] = content(f"/compact {FOCUS}")
        if after is not None:
            after(body)
        asked = len(api.summary_prompts())
        response = proxy.http.post(
            f"{proxy.url}{api.path}",
            json=body,
            headers={"authorization": f"Bearer {KEY}", "x-api-key": KEY},
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-compaction-reason"] == "manual"
        assert api.reply_text(response.json()).startswith("Context compacted:")
        prompts = api.summary_prompts()[asked:]
        assert prompts and all(FOCUS in prompt for prompt in prompts)
        assert all("<system-reminder>" not in p.split("<focus>")[-1][:200] for p in prompts)


@pytest.mark.parametrize(
    "content",
    [
        "please /compact now",
        [text_block("<system-reminder>/compact</system-reminder>"), text_block("Go on.")],
        "/compacting is what I asked about",
    ],
)
def test_compact_elsewhere_than_the_start_of_the_typed_text_is_a_prompt(content: Any) -> None:
    messages = [{"role": "user", "content": "task"}, {"role": "user", "content": content}]
    assert manual.find_command(messages) is None


def test_compact_after_system_messages_is_found_where_it_was_typed() -> None:
    messages = [
        {"role": "user", "content": "task"},
        {"role": "user", "content": f"/compact {FOCUS}"},
        {"role": "system", "content": AIDER_REMINDER},
    ]
    assert manual.find_command(messages) == manual.Command(1, FOCUS)


def test_compact_focus_leaves_out_the_system_prompt_aider_appends_to_the_typed_line() -> None:
    # For a model it has no settings for, aider appends the end of its system
    # prompt to the typed line; the focus is only what the user typed.
    system = aider_recorded()[0]["messages"][0]["content"]
    tail = system[system.index("To suggest changes to a file you MUST return a *file listing*") :]
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "task"},
        {"role": "user", "content": f"/compact {FOCUS}\n\n{tail}"},
    ]
    assert manual.find_command(messages) == manual.Command(2, FOCUS)
