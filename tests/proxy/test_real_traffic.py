"""Real agent traffic against an upstream that counts like a real one.

Each test replays one observation made with real clients (qwen-code 0.24.4,
the ``llm`` CLI, the openai SDK) in front of an upstream whose tokenizer is
not o200k: the fake upstream runs with ``counting="chat-template"`` — about
12 % more tokens than o200k for the same text, tool schemas rendered into the
prompt as spaced JSON, template tokens around every message — and enforces
its window on that count, stating the real figures in its errors.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from compaction import SUMMARY_MARKER, TokenCounter
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy
from tests.proxy.servers import (
    NOT_SUMMARIES,
    SUMMARY_TEXT,
    TURN_PREFIX_TEXT,
    FakeUpstream,
    Received,
)
from tests.synthetic import agent_session, tool_call

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
QWEN_REQUEST = FIXTURES / "clients" / "qwen-code-request.json"

#: A 16k window without ``max_tokens``: R_eff = min(16384, 16384 // 4) = 4096.
WINDOW = 16_384
LIMIT = WINDOW - WINDOW // 4  # 12,288
MODEL = "chat-model"
MODELS = {MODEL: {"context_window": WINDOW}}

SECTION_HEADINGS = (
    "## Goal",
    "## Constraints & Preferences",
    "## Progress",
    "### Done",
    "### In Progress",
    "### Blocked",
    "## Key Decisions",
    "## Next Steps",
    "## Critical Context",
)
_NOTE = re.compile(r"\[([\d,]+) earlier messages? (?:was|were) removed")
_WORDS = (
    "the parser reads each header and returns a window value that callers compare with the "
    "budget before they forward a request upstream so a change in one module can break tests "
    "in another unless the interface stays stable across releases and every caller converts "
    "values where they are read rather than where they are used which keeps the code simple "
    "retry cache stream chunk token limit summary model context proxy client server config"
).split()


# --- helpers ---------------------------------------------------------------


def _sdk(proxy: InProcessProxy) -> openai.OpenAI:
    return proxy.openai(api_key="sk-client")


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _lines(rng: random.Random, chars: int) -> str:
    """Command output: numbered lines of words, about ``chars`` characters."""
    lines: list[str] = []
    size = 0
    while size < chars:
        line = f"{len(lines) + 1:>4}: {_prose(rng, rng.randint(6, 14))}"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _tool_turn(
    call_id: str, command: str, output: str, text: str | None = None
) -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": text,
            "tool_calls": [tool_call(call_id, "bash", {"command": command})],
        },
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def _text(message: dict[str, Any]) -> str:
    """Everything of a message the model reads: its text and its tool calls' arguments."""
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        content = "\n".join(p for p in parts if isinstance(p, str))
    text = content if isinstance(content, str) else ""
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        text += f"\n{function.get('name')}({function.get('arguments')})"
    return text


def _forwarded_text(request: Received) -> str:
    return "\n".join(_text(m) for m in request.json()["messages"])


def _summaries(messages: list[dict[str, Any]]) -> list[str]:
    return [
        _text(m)
        for m in messages
        if isinstance(m.get("content"), str) and SUMMARY_MARKER in m["content"]
    ]


def _tag_summaries(upstream: FakeUpstream) -> None:
    """Number every summarizer reply, so each call's output can be traced."""
    upstream.summary_text = SUMMARY_TEXT + "\n- (summary #{call})"
    upstream.turn_prefix_text = TURN_PREFIX_TEXT + "\n- (summary #{call})"


def _discarded(upstream: FakeUpstream) -> list[int]:
    """The summaries (1, 2, …) whose text reached neither a later chat request nor a
    later summary prompt (a chunk's summary folded into the next call)."""
    order = {id(r): i for i, r in enumerate(upstream.received)}
    summaries = upstream.summary_requests
    prompts = upstream.summary_prompts
    lost = []
    for k, request in enumerate(summaries, 1):
        tag = f"(summary #{k})"
        later = order[id(request)]
        kept = any(
            tag in _forwarded_text(c) for c in upstream.chat_requests if order[id(c)] > later
        ) or any(tag in prompt for prompt in prompts[k:])
        if not kept:
            lost.append(k)
    return lost


def _thrown_away(upstream: FakeUpstream) -> list[int]:
    """:func:`_discarded` but for the newest ones, made after every summary a
    request used: prepared in the background for a compaction the session
    ended before needing (one compaction's calls at most, checked here)."""
    lost = _discarded(upstream)
    used = [k for k in range(1, len(upstream.summary_requests) + 1) if k not in lost]
    waiting = [k for k in lost if k > max(used, default=0)]
    assert len(waiting) <= 2, f"summaries {waiting} were prepared ahead and never needed"
    return [k for k in lost if k not in waiting]


def _metrics(proxy: InProcessProxy) -> str:
    return proxy.http.get(proxy.url.removesuffix("/v1") + "/metrics").text


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? ([0-9.e+-]+)", line)
        if not match:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def _post(proxy: InProcessProxy, body: dict[str, Any]) -> httpx.Response:
    return proxy.http.post(
        f"{proxy.url}/chat/completions",
        json=body,
        headers={"authorization": "Bearer sk-client"},
    )


def _stream_text(stream: Any) -> str:
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


@pytest.fixture
def realistic(fake_upstream: FakeUpstream) -> FakeUpstream:
    """The fake upstream counting like a chat-template server, with a 16k window."""
    upstream = fake_upstream
    upstream.counting = "chat-template"
    upstream.window = WINDOW
    return upstream


# --- the overflow retry resends the same bytes ---------------------------

QWEN_MODEL = "qwen3-coder"
#: qwen-code asks for max_tokens 16384 on every request: R_eff = 16384, so the
#: proxy's input limit is 32,768 — and so is the upstream's room for the prompt
#: (prompt + max_tokens ≤ window). Its system prompt, skills reminder and 14
#: tools alone are 16.7k tokens by the proxy's estimate (19.3k as the upstream
#: counts them), so a 12k limit could not hold even those; at 32k the session
#: crosses the limit several times in 30 turns.
QWEN_WINDOW = 49_152
QWEN_TURNS = 30


def _qwen_request() -> dict[str, Any]:
    if not QWEN_REQUEST.is_file():
        pytest.skip(
            f"{QWEN_REQUEST} is absent (a standalone clone): the qwen-code request body "
            "lives in ../shared/fixtures/clients beside development checkouts"
        )
    body: dict[str, Any] = json.loads(QWEN_REQUEST.read_text())
    return body


def _qwen_shell_output(rng: random.Random, turn: int, command: str) -> str:
    """What qwen-code's run_shell_command returns: a few thousand characters."""
    lines = [
        f"tests/test_mod{turn}.py::test_case_{k} {rng.choice(['PASSED', 'PASSED', 'FAILED'])}"
        f" [{k * 3:>3}%] {_prose(rng, rng.randint(4, 10))}"
        for k in range(rng.randint(28, 40))
    ]
    return (
        f"Command: {command}\nDirectory: (root)\nOutput: "
        + "\n".join(lines)
        + "\nError: (none)\nExit Code: 1\nSignal: (none)\nBackground PIDs: (none)\n"
        "Process Group PGID: 41527"
    )


def test_qwen_code_session_never_sees_an_overflow_and_retries_always_shrink(
    realistic: FakeUpstream, start_app: AppFactory
) -> None:
    """Qwen-code's 14 tools and max_tokens 16384, 30 turns, streamed."""
    upstream = realistic
    upstream.window = QWEN_WINDOW
    _tag_summaries(upstream)
    # A summary restates its session's task, or the goal check takes it for a
    # summary of something else: the fixture's task is its resumed summary's.
    upstream.summary_text = upstream.summary_text.replace(
        "## Goal\n", "## Goal\n- Investigate the repository as asked; resume the prior task.\n", 1
    )
    base = _qwen_request()
    proxy = start_app(models={"qwen*": {"context_window": QWEN_WINDOW}})
    sdk = _sdk(proxy)
    rng = random.Random(9)

    history: list[dict[str, Any]] = list(base["messages"][:3])  # system, reminder, "Got it."
    errors: list[tuple[int, str]] = []
    answer: str | None = None
    for turn in range(QWEN_TURNS):
        if answer is not None:
            history.append({"role": "assistant", "content": answer})
        command = f"python -m pytest -x tests/test_mod{turn}.py"
        history.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"Step {turn}: run {command} and fix what fails."}
                ],
            }
        )
        call_id = f"call_{turn:04d}"
        arguments = {
            "command": command,
            "description": f"run the tests of step {turn}",
            "is_background": False,
        }
        history.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "run_shell_command",
                            "arguments": json.dumps(arguments, separators=(",", ":")),
                        },
                    }
                ],
            }
        )
        output = _qwen_shell_output(rng, turn, command)
        history.append(
            {"role": "tool", "tool_call_id": call_id, "content": [{"type": "text", "text": output}]}
        )
        try:
            stream = sdk.chat.completions.create(
                model=QWEN_MODEL,
                messages=history,
                tools=base["tools"],
                max_tokens=base["max_tokens"],
                stream=True,
                stream_options={"include_usage": True},
            )
            answer = _stream_text(stream)
        except openai.APIError as exc:
            errors.append((turn, str(exc)[:200]))
            answer = None

    chat = upstream.chat_requests
    discarded = _thrown_away(upstream)
    summary_tokens = sum(r.prompt_tokens or 0 for r in upstream.summary_requests)
    chat_tokens = sum(r.prompt_tokens or 0 for r in chat)
    resent = [
        i
        for i, (failed, retry) in enumerate(itertools.pairwise(chat))
        if failed.overflowed and retry.body == failed.body
    ]
    print(
        f"\nqwen-code session, {QWEN_TURNS} turns: {len(errors)} errors reached the client "
        f"(turns {[t for t, _ in errors]}), {len(upstream.overflows)} upstream overflows, "
        f"{len(resent)} retries with byte-identical bodies, {len(upstream.summary_requests)} "
        f"summarizer calls ({len(discarded)} thrown away), summary ÷ chat prompt tokens "
        f"{summary_tokens / max(chat_tokens, 1):.2f}"
    )
    for failed, retry in itertools.pairwise(chat):
        if failed.overflowed:
            assert retry.body != failed.body, "the overflow retry resent the same bytes"
            assert retry.prompt_tokens is not None and failed.prompt_tokens is not None
            assert retry.prompt_tokens < failed.prompt_tokens, "the overflow retry did not shrink"
    assert len(upstream.overflows) <= 1, f"{len(upstream.overflows)} upstream overflows"
    assert not errors, f"{len(errors)} of {QWEN_TURNS} turns failed at the client: {errors[:2]}"
    assert not discarded, f"summaries {discarded} were made and thrown away"


# --- summaries are made and thrown away ----------------------------------

LLM_TURNS = 14
#: About 6.4k tokens a turn as the upstream counts them: each prompt pastes
#: one part of a long document (``llm -c`` reading a file from stdin).
PART_WORDS = 5_600


def _part(turn: int) -> str:
    rng = random.Random(turn)
    paragraphs = [_prose(rng, 140) + "." for _ in range(PART_WORDS // 140)]
    return f"[part {turn:02d}]\n" + "\n\n".join(paragraphs) + "\n\nWhat do you make of this part?"


def test_llm_c_growth_run_discards_no_summary_and_summarizes_each_span_once(
    realistic: FakeUpstream, start_app: AppFactory
) -> None:
    """A 14-turn ``llm -c`` chat (no system prompt) at a 16k window.

    Each prompt pastes about 6.4k tokens (as the upstream counts them). The
    proxy used to summarize the growing middle on every turn from the third
    on and throw each summary away (the request was truncated instead). As
    ``llm`` sends no system prompt, the head is the first exchange, itself a
    part: head + newest part leave no room for a summary once the budget is
    calibrated, so a correct proxy may well truncate without asking the
    summarizer at all — what it must not do is ask and discard, or ask twice
    for the same part.
    """
    upstream = realistic
    _tag_summaries(upstream)
    proxy = start_app(models=MODELS, compaction={"summarizer": "llm"})
    sdk = _sdk(proxy)

    history: list[dict[str, Any]] = []
    for turn in range(1, LLM_TURNS + 1):
        history.append({"role": "user", "content": _part(turn)})
        stream = sdk.chat.completions.create(
            model=MODEL,
            messages=history,
            stream=True,
            stream_options={"include_usage": True},
        )
        history.append({"role": "assistant", "content": _stream_text(stream)})

    summaries = upstream.summary_requests
    summary_tokens = sum(r.prompt_tokens or 0 for r in summaries)
    chat_tokens = sum(r.prompt_tokens or 0 for r in upstream.chat_requests)
    discarded = _thrown_away(upstream)
    prompts = upstream.summary_prompts
    twice = [
        turn
        for turn in range(1, LLM_TURNS + 1)
        if sum(f"[part {turn:02d}]" in prompt for prompt in prompts) > 1
    ]
    calls_counted = _metric(_metrics(proxy), "compaction_proxy_summarizer_calls_total")
    print(
        f"\nllm -c run, {LLM_TURNS} turns: {len(summaries)} summarizer calls, "
        f"{len(discarded)} of them thrown away; summary prompt tokens {summary_tokens:,} vs "
        f"chat prompt tokens {chat_tokens:,} (ratio {summary_tokens / max(chat_tokens, 1):.2f}); "
        f"parts summarized more than once: {twice}; summarizer_calls_total {calls_counted:g}"
    )
    assert not discarded, f"summaries {discarded} of {len(summaries)} were made and thrown away"
    assert not twice, f"parts {twice} were summarized more than once"
    assert len(summaries) <= LLM_TURNS // 2, "the summarizer was asked on most turns"
    assert summary_tokens <= 0.5 * chat_tokens
    assert calls_counted == len(summaries), "summarizer calls are not all counted"


#: A chat with a system prompt (``llm -s``) and smaller pastes (~2.3k tokens):
#: here summaries are needed, and must be made once per span and kept.
SMALL_PART_WORDS = 2_000


def _small_part(turn: int) -> str:
    rng = random.Random(1000 + turn)
    paragraphs = [_prose(rng, 100) + "." for _ in range(SMALL_PART_WORDS // 100)]
    return f"[part {turn:02d}]\n" + "\n\n".join(paragraphs) + "\n\nAnd this part?"


def test_a_growing_chat_keeps_every_summary_and_summarizes_each_part_once(
    realistic: FakeUpstream, start_app: AppFactory
) -> None:
    """Where summaries are due: a 20-turn chat at a 16k window."""
    upstream = realistic
    _tag_summaries(upstream)
    proxy = start_app(models=MODELS, compaction={"summarizer": "llm"})
    sdk = _sdk(proxy)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You review long documents, part by part."},
    ]
    turns = 20
    for turn in range(1, turns + 1):
        history.append({"role": "user", "content": _small_part(turn)})
        stream = sdk.chat.completions.create(
            model=MODEL, messages=history, stream=True, stream_options={"include_usage": True}
        )
        history.append({"role": "assistant", "content": _stream_text(stream)})

    summaries = upstream.summary_requests
    summary_tokens = sum(r.prompt_tokens or 0 for r in summaries)
    chat_tokens = sum(r.prompt_tokens or 0 for r in upstream.chat_requests)
    prompts = upstream.summary_prompts
    twice = [t for t in range(1, turns + 1) if sum(f"[part {t:02d}]" in p for p in prompts) > 1]
    print(
        f"\ngrowing chat, {turns} turns: {len(summaries)} summarizer calls, "
        f"{len(_thrown_away(upstream))} thrown away; summary ÷ chat prompt tokens "
        f"{summary_tokens / max(chat_tokens, 1):.2f}; parts summarized twice: {twice}"
    )
    assert len(summaries) >= 2, "the chat outgrew the window: summaries were due"
    assert not _thrown_away(upstream), "a summary was made and thrown away"
    assert not twice, f"parts {twice} were summarized more than once"
    assert summary_tokens <= 0.5 * chat_tokens
    assert all(r.status == 200 for r in upstream.chat_requests)


# --- identical resends summarize again -----------------------------------

DIFF_START = "DIFF-START-7f3a"
DIFF_END = "DIFF-END-9c2e"


def _git_diff(chars: int = 151_000) -> str:
    lines = []
    size = 0
    k = 0
    while size < chars:
        line = f"+    budget_{k} = read_budget_value(settings, 'limit-{k}')  # line {k}"
        lines.append(line)
        size += len(line) + 1
        k += 1
    return (
        f"{DIFF_START}\ndiff --git a/src/app.py b/src/app.py\n" + "\n".join(lines) + f"\n{DIFF_END}"
    )


def _review_session(rng: random.Random) -> list[dict[str, Any]]:
    """System, task, six tool steps; every message carries a tag ``[mNNN]`` (its index)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "[m000] You are a coding agent. Use the tools."},
        {"role": "user", "content": "[m001] Review the branch and fix what is broken."},
    ]
    for step in range(6):
        index = len(messages)
        messages += _tool_turn(
            f"call_{step}",
            f"cat src/module_{step}.py",
            f"[m{index + 1:03d}]\n" + _lines(rng, 4_000),
            text=f"[m{index:03d}] Looking.",
        )
    return messages


def _with_diff(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    index = len(messages)
    return [
        *messages,
        *_tool_turn("call_diff", "git diff", _git_diff(), text=f"[m{index:03d}] Showing the diff."),
    ]


def test_an_identical_resend_of_an_oversized_request_makes_no_new_summary(
    realistic: FakeUpstream, start_app: AppFactory
) -> None:
    """The newest message alone (a 151k-character diff) exceeds the window."""
    upstream = realistic
    proxy = start_app(models=MODELS)
    body = {"model": MODEL, "messages": _with_diff(_review_session(random.Random(3)))}
    statuses = [_post(proxy, body).status_code for _ in range(3)]
    calls = len(upstream.summary_requests)
    print(f"\n3 identical sends: statuses {statuses}, {calls} summarizer calls")
    assert statuses == [200, 200, 200]
    newest = upstream.chat_requests[-1].json()["messages"][-1]
    assert newest["content"].startswith(DIFF_START) and len(newest["content"]) < 151_000
    assert calls <= 1, f"{calls} summarizer calls for 3 identical requests"


# --- the summarizer never sees the content -------------------------------

ERROR_LINES = (
    "ValueError: bad frobnicator 4711",
    "KeyError: 'gizmo_7' not found in the registry",
    "AssertionError: expected 3 widgets, got 5 (test_widget_42)",
    "ModuleNotFoundError: No module named 'flux_capacitor'",
    "TypeError: zap() missing 1 required positional argument: 'level'",
)


def test_error_lines_of_condensed_turns_reach_the_summarizer(
    realistic: FakeUpstream, start_app: AppFactory
) -> None:
    """Error lines buried in long tool outputs, in turns that get condensed."""
    upstream = realistic
    proxy = start_app(models=MODELS)
    rng = random.Random(4)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Make the test suite pass."},
    ]
    for step in range(24):
        output = _lines(rng, 2_200)
        if 2 <= step < 2 + len(ERROR_LINES):
            error = ERROR_LINES[step - 2]
            output += f"\nTraceback (most recent call last):\nE   {error}\n" + _lines(rng, 2_200)
        output += f"\n{_lines(rng, 2_200)}\n[exit code {1 if 2 <= step < 7 else 0}]"
        messages += _tool_turn(
            f"call_{step}",
            f"python -m pytest -x tests/test_step_{step}.py",
            output,
            text=f"Step {step}: {_prose(rng, 200)}",  # ~1,200 characters: not pruned
        )
    response = _post(proxy, {"model": MODEL, "messages": messages})
    assert response.status_code == 200
    assert upstream.summary_requests, "precondition: the session was condensed"
    prompts = "\n".join(upstream.summary_prompts)
    missing = [error for error in ERROR_LINES if error not in prompts]
    print(
        f"\n{len(ERROR_LINES) - len(missing)} of {len(ERROR_LINES)} error lines "
        "reached the summarizer"
    )
    assert not missing, f"the summarizer never saw {missing}"


# --- large messages vanish unseen ----------------------------------------


def _summarized(upstream: FakeUpstream, forwarded_text: str) -> set[int]:
    """The tags ``[mNNN]`` of the messages the forwarded llm summaries stand for: what
    their prompts held, and what the summaries folded into them stood for."""
    prompts = upstream.summary_prompts
    used = {k for k in range(1, len(prompts) + 1) if f"(summary #{k})" in forwarded_text}
    pending = list(used)
    while pending:
        prompt = prompts[pending.pop() - 1]
        for j in range(1, len(prompts) + 1):
            if j not in used and f"(summary #{j})" in prompt:
                used.add(j)
                pending.append(j)
    return {int(n) for k in used for n in re.findall(r"\[m(\d{3})\]", prompts[k - 1])}


def _call_key(message: dict[str, Any]) -> tuple[str, str] | None:
    """What identifies a tool call or result however much of it was cut."""
    if message.get("role") == "tool":
        return ("result", str(message.get("tool_call_id")))
    calls = message.get("tool_calls")
    return ("call", str(calls[0].get("id"))) if calls else None


def _wrong_notes(
    original: list[dict[str, Any]], forwarded: Received, upstream: FakeUpstream
) -> tuple[int, int] | None:
    """(stated, true) when the removal notes of a forwarded request do not state how
    many of the client's messages it lost; ``None`` when they do.

    A client's message is kept when a forwarded message is that message whole,
    cut or briefed (same tool call id, or same ``[mNNN]`` tag); summarized when
    a forwarded llm summary stands for it (traced through the summary prompts);
    otherwise removed, and the notes must count it. Where an untraceable
    (extractive) summary is forwarded, the notes may count fewer.
    """
    by_key = {key: i for i, m in enumerate(original) if (key := _call_key(m))}
    kept: set[int] = set()
    sent = forwarded.json()["messages"]
    for message in sent:
        key = _call_key(message)
        if key in by_key:
            kept.add(by_key[key])
        text = _text(message)
        if SUMMARY_MARKER not in text and not _NOTE.search(text):
            kept.update(int(n) for n in re.findall(r"\[m(\d{3})\]", text))
    summarized = _summarized(upstream, _forwarded_text(forwarded))
    # A tool result was summarized with its call (the prompt may brief it).
    for i in list(summarized):
        key = _call_key(original[i]) if i < len(original) else None
        if key and key[0] == "call" and ("result", key[1]) in by_key:
            summarized.add(by_key[("result", key[1])])
    lost = sum(1 for i in range(len(original)) if i not in kept and i not in summarized)
    texts = [_text(m) for m in sent]
    stated = sum(int(n.replace(",", "")) for t in texts for n in _NOTE.findall(t))
    untraceable = any(SUMMARY_MARKER in t and not re.search(r"\(summary #\d+\)", t) for t in texts)
    if stated == lost or (untraceable and stated <= lost):
        return None
    return stated, lost


def test_an_oversized_message_is_excerpted_or_summarized_and_removal_notes_count_true(
    realistic: FakeUpstream, start_app: AppFactory
) -> None:
    """A diff too large for the window, once a newer turn follows it.

    The diff is pasted by the user (``git diff | llm -c "review"``): an old
    *tool* output of any size becomes the pruner's one-line brief by design
    (DESIGN §5.1); a user's paste is the pruner's to keep, so it must be
    excerpted or summarized, never dropped unseen.
    """
    upstream = realistic
    _tag_summaries(upstream)
    proxy = start_app(models=MODELS)
    session = _review_session(random.Random(5))
    first = [
        *session,
        {"role": "user", "content": f"[m{len(session):03d}] Review this:\n" + _git_diff()},
    ]
    second = [
        *first,
        {
            "role": "assistant",
            "content": f"[m{len(first):03d}] The diff adds one parse per header.",
        },
        {"role": "user", "content": f"[m{len(first) + 1:03d}] Good. Now run the tests."},
    ]
    sends = []
    for messages in (first, second):
        assert _post(proxy, {"model": MODEL, "messages": messages}).status_code == 200
        sends.append((messages, upstream.chat_requests[-1]))

    wrong_notes = [_wrong_notes(messages, sent, upstream) for messages, sent in sends]
    wrong_notes = [wrong for wrong in wrong_notes if wrong is not None]
    forwarded = sends[1][1]
    excerpt = next(
        (
            m["content"]
            for m in forwarded.json()["messages"]
            if isinstance(m.get("content"), str)
            and DIFF_START in m["content"]
            and DIFF_END in m["content"]
            and SUMMARY_MARKER not in m["content"]
        ),
        None,
    )
    text = _forwarded_text(forwarded)
    summarized = any(
        DIFF_START in prompt and DIFF_END in prompt and f"(summary #{k})" in text
        for k, prompt in enumerate(upstream.summary_prompts, 1)
    )
    print(
        f"\nafter the diff: excerpt {'kept' if excerpt else 'absent'}, summarized "
        f"{summarized}; forwarded {forwarded.prompt_tokens:,} tokens (upstream count) of "
        f"{LIMIT:,}; removal notes (stated, true): {wrong_notes or 'all true'}"
    )
    assert excerpt is not None or summarized, "the diff vanished: neither excerpted nor summarized"
    if excerpt is not None:
        assert len(excerpt) < 151_000
        assert re.search(r"(?i)cut|omitted|removed|truncated|elided|…", excerpt), "no cut marker"
        assert (forwarded.prompt_tokens or 0) >= LIMIT // 4, "the excerpt leaves the window empty"
    assert not wrong_notes, f"removal notes state the wrong count: {wrong_notes}"


# --- a streamed overflow is relayed as an empty 200 ----------------------

#: llama-cpp-python with n_ctx 16384 and max_tokens 4096: the prompt may have
#: 12,288 tokens as the server counts them, and the proxy's limit is the same.
LLAMA_MAX_TOKENS = 4_096


def _near_the_limit(counter: TokenCounter, low: float, high: float) -> list[dict[str, Any]]:
    """An agent session whose estimate lies between ``low`` and ``high`` × LIMIT."""
    rng = random.Random(7)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Find out why the build fails."},
    ]
    step = 0
    while counter.count_request({"messages": messages}) < low * LIMIT:
        candidate = messages + _tool_turn(
            f"call_{step}", f"make target_{step}", _lines(rng, 1_500), text=f"Step {step}."
        )
        if counter.count_request({"messages": candidate}) > high * LIMIT:
            break
        messages = candidate
        step += 1
    assert low * LIMIT <= counter.count_request({"messages": messages}) <= high * LIMIT
    return messages


def test_a_streamed_overflow_answered_as_an_empty_200_is_retried_smaller(
    realistic: FakeUpstream, start_app: AppFactory
) -> None:
    """Llama-cpp-python answers an over-long stream with 200 and no events."""
    upstream = realistic
    upstream.error_style = "llama-cpp-python"
    proxy = start_app(models=MODELS)
    messages = _near_the_limit(TokenCounter(MODEL), 0.93, 0.97)
    stream = _sdk(proxy).chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=LLAMA_MAX_TOKENS,
        stream=True,
    )
    text = _stream_text(stream)
    chat = upstream.chat_requests
    print(
        f"\nstreamed request near the limit: {len(chat)} upstream requests "
        f"({len(upstream.overflows)} empty 200s); the client read {text!r}"
    )
    assert chat[0].overflowed, "precondition: the upstream refused the first request"
    assert text.startswith("w0 "), "the client got an empty answer"
    assert len(chat) == 2 and not chat[1].overflowed
    assert (chat[1].prompt_tokens or 0) < (chat[0].prompt_tokens or 0)


def test_an_empty_200_stream_for_a_small_request_reaches_the_client_as_an_error(
    realistic: FakeUpstream, start_app: AppFactory
) -> None:
    """A small request's stream that ends before its first event."""
    upstream = realistic
    upstream.behaviours = ["empty-stream", "empty-stream"]
    proxy = start_app(models=MODELS)
    with pytest.raises(openai.APIError):
        stream = _sdk(proxy).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        print(f"\nthe client read {_stream_text(stream)!r} and no error")


# --- summaries that are not summaries ------------------------------------


@pytest.mark.parametrize("reply", sorted(NOT_SUMMARIES))
def test_a_reply_that_is_not_a_summary_is_rejected_for_the_extractive_one(
    realistic: FakeUpstream, start_app: AppFactory, reply: str
) -> None:
    """A reply of "I'm ready to help. What's the next step?" replaced 10 messages."""
    upstream = realistic
    upstream.summary_reply = reply
    proxy = start_app(models=MODELS)
    body = {"model": MODEL, "messages": agent_session(seed=8, steps=60)}
    bad = NOT_SUMMARIES[reply]

    report = proxy.http.post(f"{proxy.url}/compaction/preview", json=body).json()["report"]
    assert upstream.summary_requests, "precondition: the llm summarizer was asked"
    print(f"\npreview: summarizer {report['summarizer']!r}, notes {report['notes']}")
    assert report["summarizer"] == "extractive", "the reply was accepted as a summary"
    assert any("extractive" in note for note in report["notes"]), report["notes"]

    response = _post(proxy, body)
    assert response.status_code == 200
    sent = upstream.chat_requests[-1].json()["messages"]
    summaries = _summaries(sent)
    assert summaries, "no summary was forwarded"
    assert not any(bad in _text(m) for m in sent), "the reply that is not a summary was forwarded"
    missing = [h for h in SECTION_HEADINGS if h not in summaries[0]]
    assert not missing, f"the forwarded summary lacks {missing}"
    failures = _metric(_metrics(proxy), "compaction_proxy_summarizer_failures_total")
    assert failures >= 1, "the rejected summary is not counted as a summarizer failure"


# --- summarizing what cannot fit -----------------------------------------


def test_no_summary_is_asked_for_when_head_and_newest_turn_leave_no_room_for_one(
    realistic: FakeUpstream, start_app: AppFactory
) -> None:
    """Head + newest turn leave less than summary_min_tokens (500)."""
    upstream = realistic
    proxy = start_app(models=MODELS, compaction={"summary_min_tokens": 500})
    counter = TokenCounter(MODEL)
    rng = random.Random(9)
    messages = _review_session(rng)
    head = counter.count_request({"messages": messages[:2]})
    room = LIMIT - head - 200  # the newest turn leaves 200 tokens: no summary fits
    question = "Here is the log of the failing run:\n"
    while counter.count_text(question) < room:
        question += _prose(rng, 400) + "\n"
    messages.append({"role": "user", "content": question})
    response = _post(proxy, {"model": MODEL, "messages": messages})
    calls = len(upstream.summary_requests)
    print(f"\nno room for a summary: {calls} summarizer calls, status {response.status_code}")
    assert response.status_code == 200
    assert calls == 0, f"{calls} summarizer calls for a summary that could not fit"


# --- misleading figures in errors ---------------------------------------


def test_a_newest_group_that_cannot_fit_is_reported_with_its_own_size(
    realistic: FakeUpstream, start_app: AppFactory
) -> None:
    """The error counted the system prompt and task with the newest group."""
    proxy = start_app(models=MODELS)
    counter = TokenCounter(MODEL)
    rng = random.Random(10)
    system = {"role": "system", "content": "You review screenshots. " + _prose(rng, 2_400)}
    task = {"role": "user", "content": "Compare the screenshots of the release candidate."}
    images = [
        {"type": "image_url", "image_url": {"url": f"https://example.com/shot-{i}.png"}}
        for i in range(10)
    ]
    newest = {"role": "user", "content": [{"type": "text", "text": "Here they are."}, *images]}
    messages = [system, task, {"role": "assistant", "content": "Send them."}, newest]
    head = counter.count_request({"messages": [system, task]})
    own = counter.count_request({"messages": [newest]})
    response = _post(proxy, {"model": MODEL, "messages": messages})
    error = response.json().get("error", {})
    figures = [
        int(n.replace(",", "")) for n in re.findall(r"\d[\d,]{2,}", error.get("message", ""))
    ]
    print(f"\nhead {head:,}, newest group {own:,} tokens; the error says: {error.get('message')!r}")
    assert response.status_code == 400
    assert error.get("code") == "context_length_exceeded"
    assert set(error) >= {"message", "type", "param", "code"}
    assert any(abs(n - own) <= own * 0.05 for n in figures), (
        "the newest group's own size is not stated"
    )
    assert not any(n >= own + head // 2 for n in figures), "the stated size includes the head"


# --- observability ----------------------------------------------------------


def test_a_request_that_reuses_a_checkpoint_says_so(
    fake_upstream: FakeUpstream, start_app: AppFactory
) -> None:
    """A request that reused a stored checkpoint answered ``x-compaction-stage: none``.

    The upstream counts as the proxy does here, so the follow-up surely fits
    beside the stored summary (with a calibrated budget it might not, and
    would rightly be compacted again).
    """
    upstream = fake_upstream
    proxy = start_app(models=MODELS)
    messages = agent_session(seed=11, steps=60)
    first = _post(proxy, {"model": MODEL, "messages": messages})
    assert first.status_code == 200 and first.headers["x-compaction-stage"] == "condensed"
    calls = len(upstream.summary_requests)
    follow_up = [*messages, {"role": "user", "content": "Thanks. Anything else?"}]
    second = _post(proxy, {"model": MODEL, "messages": follow_up})
    print(
        f"\nreusing the checkpoint: x-compaction-stage {second.headers['x-compaction-stage']!r}, "
        f"id {second.headers.get('x-compaction-id')!r}"
    )
    assert second.status_code == 200
    assert len(upstream.summary_requests) == calls, "precondition: the stored summary was reused"
    assert second.headers["x-compaction-stage"] == "reused"
    assert second.headers.get("x-compaction-id") == first.headers["x-compaction-id"]


def test_compact_is_counted_in_the_metrics(realistic: FakeUpstream, start_app: AppFactory) -> None:
    """``/compact`` went uncounted in ``compaction_proxy_compactions_total``."""
    proxy = start_app(models=MODELS)
    messages = [*agent_session(seed=12, steps=60), {"role": "user", "content": "/compact"}]
    manual = _post(proxy, {"model": MODEL, "messages": messages})
    assert manual.status_code == 200
    assert manual.json()["choices"][0]["message"]["content"].startswith("Context compacted")
    metrics = _metrics(proxy)
    counted = _metric(metrics, "compaction_proxy_compactions_total", reason="manual")
    print(f"\nmanual compactions counted: {counted:g}")
    assert counted == 1
    assert _metric(metrics, "compaction_proxy_compactions_total") == 1
