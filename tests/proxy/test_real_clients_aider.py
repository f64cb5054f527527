"""aider, unmodified, through the proxy: a chat long enough to be compacted.

aider (Chat Completions, no tools) starts every request with a canned example
exchange ("Change the greeting to be more casual" and its answer, then "I
switched to a new code base…" / "Ok."), then the files in the chat answered by
a canned "Ok…", the conversation, and the current message. The proxy must keep
all of it, and never take the example for the task: not as the session's
label, not as a summary's Goal, not as what a model summary is checked
against (an on-topic summary was once refused for "dropping the goal … casual,
chang, greet").

aider comes from PyPI into a virtualenv of its own (its pins would fight the
project's): ``.ci/run`` and ``make test-clients`` install it into
``.ci/clients/aider``; or put a folder holding ``aider`` in
``COMPACTION_TEST_CLIENTS``. Where it is not installed the test skips and says
how to install it. The user's messages are typed on aider's standard input,
one line a turn (``--no-fancy-input``), so the session is one aider process
and the requests are what aider sends in a chat. What aider 0.86.2 sent is
recorded in ``tests/data/aider-0.86.2-requests.json``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compaction import SUMMARY_MARKER
from proxy.dialects.chat import CHAT
from proxy.flow.answered.record import task_words
from proxy.state.stores import SessionSummary
from tests.client_bodies import (
    AIDER_EXAMPLE,
    AIDER_EXAMPLE_REPLY,
    AIDER_FILES,
    AIDER_REMINDER,
    AIDER_SWITCHED,
    AIDER_SYSTEM,
    aider_recorded,
)
from tests.proxy.real_clients_upstreams import Answered, compacted_figures, focus_of
from tests.proxy.servers import FakeUpstream, serve_in_thread
from tests.proxy.test_real_clients import _all_taken, _client, _proxy, _sessions

MODEL = "aider-e2e"
QUESTIONS = [f"Check case {n}: what does main return when the input is {n * 7}?" for n in range(14)]
#: What the scripted model answers a summary request with: on topic (the
#: questions about ``main``), with the sections the proxy asks for, numbered so
#: a forwarded summary can be told to be the model's.
SUMMARY = """\
## Goal
- Find what `main` in app.py returns for each input the user asks about.

## Constraints & Preferences
- None

## Progress
### Done
- Answered the user's questions about what `main` returns, case by case.
### In Progress
- None
### Blocked
- None

## Key Decisions
- None

## Next Steps
1. Answer the next case the user asks about.

## Critical Context
- Model summary number {call}."""
PROFILE: dict[str, Any] = {
    "context_window": 8_192,
    "reserve_tokens": 1_024,
    "keep_recent_tokens": 1_500,
    "summarizer": "llm",
    "summary_must_pay": False,  # a model asked for every summary
    "assistant_text_chars": 1_000_000,  # long answers are condensed, not briefed
}


def _aider_env(home: Path, proxy: str) -> dict[str, str]:
    """aider pointed at the proxy as its docs say (``OPENAI_API_BASE``), in a
    home of its own, none of the caller's OpenAI or aider settings."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AIDER_"))}
    return {
        **kept,
        "HOME": str(home),
        "OPENAI_API_BASE": proxy + "/v1",
        "OPENAI_API_KEY": "sk-test",
    }


def _texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if isinstance(m.get("content"), str)]


def _goal(summary: str) -> str:
    """The Goal section of a summary."""
    return summary.split("## Goal", 1)[1].split("\n## ", 1)[0]


@dataclass(frozen=True)
class Session:
    """An aider run through the proxy, as aider, the upstream and the store saw it."""

    printed: str
    upstream: FakeUpstream
    answered: list[Answered]
    sessions: list[SessionSummary]

    @property
    def compactions(self) -> list[Answered]:
        return [a for a in self.answered if a.headers.get("x-compaction-stage") == "condensed"]


def _run_aider(tmp_path: Path, typed: list[str]) -> Session:
    """aider in a chat of ``typed`` lines, one a turn, through the proxy; it must
    end well, every request taken."""
    aider = _client("aider")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "app.py").write_text("def main():\n    return int(input()) * 2\n")
    # Answers of ~1,000 tokens: a few turns outgrow the 8k window.
    upstream = FakeUpstream(window=PROFILE["context_window"], chunks=400, summary_text=SUMMARY)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    argv = [aider, "--model", f"openai/{MODEL}", "--yes-always", "--no-git"]
    argv += ["--no-check-update", "--no-analytics", "--no-show-model-warnings"]
    argv += ["--no-pretty", "--no-fancy-input", "app.py"]
    with (
        serve_in_thread(upstream.app()) as upstream_url,
        _proxy(upstream_url, MODEL, PROFILE, store=store) as proxy,
    ):
        run = subprocess.run(
            argv,
            cwd=work,
            env=_aider_env(home, proxy.url),
            input="".join(line + "\n" for line in typed),
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert run.returncode == 0, run.stderr[-2000:]
    # Every request the upstream was sent was taken (the proxy's own GET
    # /v1/models, which it asks about a window, is not a request of aider's).
    _all_taken([r for r in upstream.received if r.method == "POST"])
    return Session(run.stdout, upstream, proxy.answers.answered, _sessions(store))


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return _run_aider(tmp_path_factory.mktemp("aider"), QUESTIONS)


def test_aider_chat_is_compacted_and_nothing_is_lost(session: Session) -> None:
    upstream = session.upstream
    bodies = [r.json() for r in upstream.chat_requests]
    assert len(bodies) == len(QUESTIONS), [_texts(b)[-1][:40] for b in bodies]
    # Never over the window.
    assert not upstream.overflows
    assert all((r.prompt_tokens or 0) <= PROFILE["context_window"] for r in upstream.chat_requests)
    assert session.compactions, "the chat never crossed the trigger"

    # aider's context reaches every request as aider sent it in the first
    # (which nothing compacted): the system prompt, the example exchange, the
    # files in the chat with their canned answers.
    head = bodies[0]["messages"][:-1]
    assert head[1]["content"] == AIDER_EXAMPLE
    summarized = 0
    for number, body in enumerate(bodies):
        messages = body["messages"]
        assert messages[: len(head)] == head, number
        # The question of this turn, verbatim, with what aider appends to it.
        assert messages[-1]["content"].startswith(QUESTIONS[number] + "\n\n"), number
        # Nothing is lost: every earlier question is in the request, as its own
        # message or among a summary's user messages.
        text = "\n".join(_texts(body))
        missing = [q for q in QUESTIONS[:number] if q not in text]
        assert not missing, (number, missing)
        summarized += any(t.startswith(SUMMARY_MARKER) for t in _texts(body))
    assert summarized >= 2, "fewer than two forwarded requests held a summary"


def test_aider_canned_example_is_never_the_summary_goal(session: Session) -> None:
    """Every summary forwarded is the model's (the checks took it: had they held
    it against aider's example as the task, they would have refused it for the
    extractive one), and its Goal is the user's questions."""
    assert session.upstream.summary_requests
    for body in (r.json() for r in session.upstream.chat_requests):
        for summary in (t for t in _texts(body) if t.startswith(SUMMARY_MARKER)):
            assert "Model summary number" in summary, summary
            goal = _goal(summary).lower()
            assert "greeting" not in goal and "casual" not in goal, goal


def test_aider_session_is_labelled_with_the_first_typed_words(session: Session) -> None:
    (chat,) = [s for s in session.sessions if s.api == "chat"]
    assert chat.requests == len(QUESTIONS), chat
    assert chat.label.startswith("Check case 0"), chat.label
    assert "greeting" not in chat.label.lower()


# --- /compact <focus> typed in aider ------------------------------------------------

FOCUS = "keep the err= numbers"


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """A chat that has not reached the trigger, then ``/compact <focus>`` typed
    with a leading space (aider's own commands start at the first character),
    then one more question."""
    typed = [*QUESTIONS[:5], f" /compact {FOCUS}", "Go on."]
    return _run_aider(tmp_path_factory.mktemp("aider-compact"), typed)


def test_aider_compact_with_a_focus_compacts_and_the_next_request_is_sent_over_it(
    compacted: Session,
) -> None:
    *asked, manual, after = [a for a in compacted.answered if a.path == "/v1/chat/completions"]
    assert not [a for a in asked if a.headers.get("x-compaction-stage") == "condensed"]
    stage = (manual.headers["x-compaction-stage"], manual.headers["x-compaction-reason"])
    assert stage == ("condensed", "manual"), manual.headers
    # aider shows the proxy's answer as the model's; the command is never forwarded.
    before, after_tokens, condensed = compacted_figures(compacted.printed)
    assert (before, after_tokens) == manual.tokens() and condensed > 0
    bodies = [r.json() for r in compacted.upstream.chat_requests]
    assert not any("/compact" in t for b in bodies for t in _texts(b))
    assert after.headers["x-compaction-id"] == manual.headers["x-compaction-id"]
    assert any(t.startswith(SUMMARY_MARKER) for t in _texts(bodies[-1]))


def test_aider_compact_focus_the_summarizer_sees_is_only_what_the_user_typed(
    compacted: Session,
) -> None:
    focuses = [focus_of(r.json()) for r in compacted.upstream.summary_requests]
    assert FOCUS in focuses, focuses


# --- the requests recorded from aider (no aider needed) ----------------------------


def test_the_recorded_aider_requests_hold_the_canned_texts_the_tests_write() -> None:
    """What ``tests/client_bodies.py`` writes from aider's source is what aider
    0.86.2 sent: the example exchange, the files message and its answer, the
    system prompt's opening and the reminder's first line."""
    first, third = aider_recorded()
    for body in (first, third):
        assert "tools" not in body and body["stream"] is True
        messages = body["messages"]
        canned = [AIDER_EXAMPLE, AIDER_EXAMPLE_REPLY, AIDER_SWITCHED, "Ok."]
        assert [m["content"] for m in messages[1:5]] == canned
        assert messages[0]["role"] == "system"
        assert messages[0]["content"].startswith(AIDER_SYSTEM)
        assert messages[5]["content"].startswith(AIDER_FILES.split("src/app.py")[0])
        assert messages[6]["content"] == "Ok, any changes I propose will be to those files."
    # The typed text of the current message, then the reminder after a blank line.
    for body, question in ((first, QUESTIONS[0]), (third, QUESTIONS[2])):
        typed, reminder = body["messages"][-1]["content"].split("\n\n", 1)
        assert typed == question and reminder.startswith(AIDER_REMINDER)
    # The chat so far, after the files message.
    assert [m["content"] for m in third["messages"][7:-1:2]] == QUESTIONS[:2]


def test_the_label_of_aiders_first_request_is_only_what_the_user_typed() -> None:
    first, _ = aider_recorded()
    assert task_words(CHAT.to_engine(first).messages) == QUESTIONS[0]
