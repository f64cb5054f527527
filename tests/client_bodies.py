"""Request bodies shaped as each agent CLI sends them, around the words a user typed.

What a client wraps around the user's words is what the proxy must not take
for the task (``compaction.typed``). qwen-code's body is the one recorded in
``../shared/fixtures/clients`` (its reminders are reused as they came); the
others are written from each client's source at the version named, since
their CLIs are not installed where the unit tests run:

* Claude Code 2.x (``POST /v1/messages``): the first user message is a
  ``<system-reminder>`` text block (CLAUDE.md and the date, "As you answer the
  user's questions…"), the typed text, and often a second reminder;
* Codex 0.171 (``POST /v1/responses``): a ``developer`` message of
  permissions, then ``user`` messages of its own — ``# AGENTS.md instructions
  for <cwd>`` wrapping ``<INSTRUCTIONS>``, and ``<environment_context>`` (the
  working directory, the shell, the date) — before the typed one
  (codex-rs ``CONTEXTUAL_USER_FRAGMENT_MATCHERS``);
* aider 0.86 (chat completions, no tools; ``aider/coders/base_coder.py``
  ``format_chat_chunks``, ``wholefile_prompts.py``): the system prompt, a
  canned example exchange closed by "I switched to a new code base…" / "Ok.",
  the repository map answered by a canned "Ok…", the history, the files in
  the chat answered by a canned "Ok…", the current message, and a closing
  system reminder. Two requests recorded from aider 0.86.2
  (``tests/data/aider-0.86.2-requests.json``, :func:`aider_recorded`: the
  first and the third of a chat, ``--no-git``, an ``openai/`` model aider does
  not know) hold the same canned texts (``tests/proxy/test_real_clients_aider.py``
  checks them) in another layout: no repository map without git, the
  exchanges of a chat with no edit applied after the files message (aider
  moves them before it once an edit is applied), a longer system prompt
  ending with the reminder, and the reminder appended to the current message
  after a blank line instead of a closing system message (aider's
  ``reminder: user``, the default for a model it does not know; ``sys`` for
  the models it knows).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
QWEN_REQUEST = FIXTURES / "clients" / "qwen-code-request.json"
AIDER_REQUESTS = Path(__file__).resolve().parent / "data" / "aider-0.86.2-requests.json"

CLAUDE_CODE_CONTEXT = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following "
    "context:\n# claudeMd\nCodebase and user instructions are shown below. Be sure to adhere "
    "to these instructions.\n\nContents of /work/app/CLAUDE.md (project instructions, checked "
    "into the codebase):\n\nRun pytest -q before finishing.\n# currentDate\nToday's date is "
    "2026-12-01.\n\n      IMPORTANT: this context may or may not be relevant to your tasks. "
    "You should not respond to this context unless it is highly relevant to your task.\n"
    "</system-reminder>\n"
)
CLAUDE_CODE_TODO = (
    "<system-reminder>\nThis is a reminder that your todo list is currently empty. DO NOT "
    "mention this to the user explicitly because they are already aware.\n</system-reminder>"
)
CODEX_AGENTS = (
    "# AGENTS.md instructions for /work/app\n\n<INSTRUCTIONS>\nKeep functions short. Run "
    "`make test` before you finish.\n</INSTRUCTIONS>"
)
CODEX_ENVIRONMENT = (
    "<environment_context>\n  <cwd>/work/app</cwd>\n  <approval_policy>never</approval_policy>\n"
    "  <sandbox_mode>workspace-write</sandbox_mode>\n  <network_access>restricted"
    "</network_access>\n  <shell>bash</shell>\n  <current_date>2026-12-01</current_date>\n"
    "  <timezone>Etc/UTC</timezone>\n</environment_context>"
)
AIDER_EXAMPLE = "Change the greeting to be more casual"
AIDER_EXAMPLE_REPLY = (
    'Ok, I will:\n\n1. Switch the greeting text from "Hello" to "Hey".\n\nshow_greeting.py\n'
    '```\nimport sys\n\ndef greeting(name):\n    print(f"Hey {name}")\n\nif __name__ == '
    "'__main__':\n    greeting(sys.argv[1])\n```\n"
)
AIDER_SWITCHED = (
    "I switched to a new code base. Please don't consider the above files or try to edit "
    "them any longer."
)
AIDER_REPO_MAP = (
    "Here are summaries of some files present in my git repository.\nDo not propose changes "
    "to these files, treat them as *read-only*.\nIf you need to edit any of these files, ask "
    "me to *add them to the chat* first.\n\nsrc/app.py:\n│def main():\n│def parse(text):\n"
)
AIDER_FILES = (
    "I have *added these files to the chat* so you can go ahead and edit them.\n\n*Trust "
    "this message as the true contents of these files!*\nAny other messages in the chat may "
    "contain outdated versions of the files' contents.\n\nsrc/app.py\n```\ndef main():\n"
    "    return parse(input())\n```\n"
)
AIDER_SYSTEM = (
    "Act as an expert software developer.\nTake requests for changes to the supplied code.\n"
    "If the request is ambiguous, ask questions."
)
AIDER_REMINDER = (
    "To suggest changes to a file you MUST return the entire content of the updated file."
)


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def claude_code_body(typed: str, *, model: str = "claude-sonnet-4-5") -> dict[str, Any]:
    """A Claude Code first request: reminders around what the user typed."""
    return {
        "model": model,
        "max_tokens": 32_000,
        "stream": True,
        "system": [
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    text_block(CLAUDE_CODE_CONTEXT),
                    {"type": "text", "text": typed, "cache_control": {"type": "ephemeral"}},
                    text_block(CLAUDE_CODE_TODO),
                ],
            }
        ],
        "metadata": {"user_id": "user_0123_account__session_4567"},
    }


def _input(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def codex_body(typed: str, *, model: str = "gpt-5-codex") -> dict[str, Any]:
    """A Codex first request: its own context as user messages before the typed one."""
    return {
        "model": model,
        "instructions": "You are Codex, based on GPT-5. You are running as a coding agent.",
        "input": [
            _input("developer", "<permissions instructions>\nFilesystem sandboxing: workspace"),
            _input("user", CODEX_AGENTS),
            _input("user", CODEX_ENVIRONMENT),
            _input("user", typed),
        ],
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a0b1-codex-thread",
    }


def aider_messages(typed: str, history: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """aider's messages for ``typed`` after ``history`` (earlier user/assistant turns)."""
    return [
        {"role": "system", "content": AIDER_SYSTEM},
        {"role": "user", "content": AIDER_EXAMPLE},
        {"role": "assistant", "content": AIDER_EXAMPLE_REPLY},
        {"role": "user", "content": AIDER_SWITCHED},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": AIDER_REPO_MAP},
        {
            "role": "assistant",
            "content": "Ok, I won't try and edit those files without asking first.",
        },
        *(history or []),
        {"role": "user", "content": AIDER_FILES},
        {"role": "assistant", "content": "Ok, any changes I propose will be to those files."},
        {"role": "user", "content": typed},
        {"role": "system", "content": AIDER_REMINDER},
    ]


def aider_body(
    typed: str, history: list[dict[str, Any]] | None = None, *, model: str = "chat-model"
) -> dict[str, Any]:
    """An aider request: no tools, streamed, its canned messages around the conversation."""
    return {
        "model": model,
        "messages": aider_messages(typed, history),
        "stream": True,
        "temperature": 0,
    }


def qwen_code_recorded() -> dict[str, Any]:
    """The recorded qwen-code 0.24.4 body (after its own compaction: its summary
    sits where the typed text goes)."""
    body: dict[str, Any] = json.loads(QWEN_REQUEST.read_text())
    return body


def qwen_code_body(typed: str) -> dict[str, Any]:
    """A qwen-code first request: its recorded reminder parts, then what the user typed."""
    body = qwen_code_recorded()
    reminders = [
        part
        for part in body["messages"][1]["content"]
        if part.get("text", "").startswith("<system-reminder>")
    ]
    first = {"role": "user", "content": [*copy.deepcopy(reminders), text_block(typed)]}
    return {**body, "messages": [body["messages"][0], first]}


def aider_recorded() -> list[dict[str, Any]]:
    """The first and the third request of a chat, as aider 0.86.2 sent them."""
    bodies: list[dict[str, Any]] = json.loads(AIDER_REQUESTS.read_text())
    return bodies
