"""The requests put to a real model: agent transcripts whose next step needs a
fact that only recall can bring back, and long ones that need a summary.

A **recall case** is a real mini-swe-agent run (``../shared/fixtures``) cut
after a tool output, so that at an 8k window the proxy prunes its early
outputs into briefs, and one user turn after it asking for a line of an
early file read (``cat``, ``sed -n``, …) that the brief replaced — the line
:func:`evaluation.recall.draw_output_facts` draws, the longest of the
output's middle third. The turn never names the recall tool: whether the
model reaches for it is what is measured. The case is only kept when the
proxy's own preview shows the output as a brief with its ``[ref: …]`` and
without the line (so the model cannot answer from what it sees).

A case comes in one of two clients' words (``client``): ``mini-swe-agent``,
as the run was recorded — a system prompt that asks for a ``bash`` block in
the text, which weighs against any tool call — or ``qwen-code``, the same
run as a tool-calling agent would send it: the opening of qwen-code's real
system prompt and its "Using Your Tools" rules, its real ``run_shell_command``
and ``read_file`` schemas (``../shared/fixtures/clients``), each ``bash`` call
made a ``run_shell_command`` call, and the task without mini-swe-agent's
format instructions.

A **summary case** is a whole run, longer than pruning can bring under the
window, so the proxy asks its summarizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction import message_text, tool_calls
from evaluation.facts import collapse
from evaluation.recall import OutputFact, draw_output_facts

#: A conversation is cut at its first tool output past this many windows
#: (estimated in characters, 4 a token): its early outputs are then briefed or
#: summarized, and the agent is still at work.
WINDOW_SHARE = 2.0


@dataclass(frozen=True)
class RecallCase:
    """One request whose answer needs a line only recall can give back."""

    name: str
    body: dict[str, Any]  #: the Chat Completions request, its last turn the question
    fact: OutputFact
    call_id: str  #: the tool call whose output holds the fact
    command: str


def _command_of(messages: list[dict[str, Any]], call_id: str) -> str:
    for message in messages:
        for call in tool_calls(message):
            if call.get("id") == call_id:
                arguments = call.get("function", {}).get("arguments", "")
                try:
                    return str(json.loads(arguments).get("command", arguments))
                except (ValueError, AttributeError):
                    return str(arguments)
    return ""


def question(fact: OutputFact, command: str) -> str:
    """The user's turn: a next step that needs the line, in an agent's words."""
    return (
        f"Before you change anything: line {fact.line} of what `{command}` printed earlier "
        "is the one to edit. Quote that line exactly as it was printed, then say what "
        "you would change in it."
    )


def _read_facts(messages: list[dict[str, Any]]) -> Iterator[tuple[OutputFact, str]]:
    """The file reads' facts in the first three quarters of ``messages``, newest
    first (the commands a summary's ledger lists with their refs are its span's
    latest), each with its call's id."""
    early = messages[: len(messages) * 3 // 4]
    facts = [f for f in draw_output_facts(early) if f.kind == "read"]
    for fact in reversed(facts):
        for message in early:
            if message.get("role") == "tool" and message_text(message) == fact.output:
                call_id = message.get("tool_call_id")
                if isinstance(call_id, str):
                    yield fact, call_id
                    break


def _chars(messages: list[dict[str, Any]]) -> int:
    return sum(len(json.dumps(m)) for m in messages)


def _cut(messages: list[dict[str, Any]], window: int) -> list[dict[str, Any]] | None:
    """The shortest prefix ending with a tool output past WINDOW_SHARE windows."""
    for end in range(2, len(messages)):  # the whole run ends with its submission
        prefix = messages[:end]
        if prefix[-1].get("role") == "tool" and _chars(prefix) / 4 >= WINDOW_SHARE * window:
            return prefix
    return None


#: The clients a recall case can be sent as (see the module's docstring).
CLIENTS = ("mini-swe-agent", "qwen-code")
#: qwen-code's tools a case declares: a shell, and the file reader it asks for.
_QWEN_TOOLS = ("run_shell_command", "read_file")


def _qwen_system(prompt: str) -> str:
    """qwen-code's opening paragraph and its tool rules: the whole prompt
    (about 7,000 tokens) would not leave an 8k window room for a conversation."""
    opening = prompt[: prompt.index("# Core Mandates")].rstrip()
    rules = prompt[prompt.index("## Using Your Tools") : prompt.index("- **Tool Fallback:**")]
    return f"{opening}\n\n{rules.rstrip()}"


def _as_qwen_code(messages: list[dict[str, Any]], clients: Path) -> dict[str, Any]:
    """``messages`` as qwen-code would send them: its system prompt and tools,
    ``bash`` calls made ``run_shell_command`` calls, the task alone."""
    request = json.loads((clients / "qwen-code-request.json").read_text())
    schemas = json.loads((clients / "qwen-code-tools.json").read_text())
    tools = [t for name in _QWEN_TOOLS for t in schemas if t["function"]["name"] == name]
    system = {"role": "system", "content": _qwen_system(request["messages"][0]["content"])}
    out: list[dict[str, Any]] = [system]
    for message in messages[1:]:
        text = message.get("content")
        if message.get("role") == "user" and isinstance(text, str) and "</pr_description>" in text:
            message = {**message, "content": text[: text.index("</pr_description>")]
                       .replace("<pr_description>", "").strip()}  # fmt: skip
        if message.get("role") == "assistant" and isinstance(text, str):
            message = {**message, "content": text.removeprefix("THOUGHT: ")}
        if tool_calls(message):
            message = {**message, "tool_calls": [_shell_call(c) for c in tool_calls(message)]}
        out.append(message)
    return {"messages": out, "tools": tools}


def _shell_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function", {})
    if function.get("name") != "bash":
        return call
    return {**call, "function": {**function, "name": "run_shell_command"}}


def fixtures(folder: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted((folder / "mini-swe-agent").glob("*.json")):
        yield path.stem, json.loads(path.read_text())


def recall_cases(
    folder: Path, model: str, window: int, max_tokens: int, client: str = "mini-swe-agent"
) -> Iterator[RecallCase]:
    """Candidate recall cases, in the fixtures' order (the preview keeps or drops each),
    in ``client``'s words (one of :data:`CLIENTS`)."""
    for name, request in fixtures(folder):
        messages = _cut(request["messages"], window)
        if messages is None:
            continue
        for fact, call_id in _read_facts(messages):
            command = _command_of(messages, call_id)
            sent = {"messages": messages, "tools": request.get("tools", [])}
            if client == "qwen-code":
                sent = _as_qwen_code(messages, folder / "clients")
            question_turn = {"role": "user", "content": question(fact, command)}
            body = {
                "model": model,
                "messages": [*sent["messages"], question_turn],
                "tools": sent["tools"],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
            yield RecallCase(name, body, fact, call_id, command)


def briefed(case: RecallCase, sent: list[dict[str, Any]]) -> bool:
    """The compacted request no longer shows the line, and shows the ref of its
    output where a model can find it: the output's brief, the summary's ledger
    line naming its command, or the read-files line of a file no later command
    names (that line's ref is of the newest output showing the file; after a
    later read or edit of it, no model could recall the line by it)."""
    texts = [message_text(m) for m in sent]
    if any(case.fact.needle in collapse(text) for text in texts):
        return False
    for message, text in zip(sent, texts, strict=True):
        if message.get("role") == "tool" and message.get("tool_call_id") == case.call_id:
            return "[ref: " in text
    names = [case.command[:60], *_last_named(case)]
    return any(
        "[ref: " in line and any(name in line for name in names)
        for text in texts
        for line in text.splitlines()
    )


def _last_named(case: RecallCase) -> list[str]:
    """The file paths ``case.command`` names that no later command of the case names."""
    later: list[str] = []
    seen = False
    for message in case.body["messages"]:
        for call in tool_calls(message):
            if seen:
                later.append(call.get("function", {}).get("arguments", ""))
            seen = seen or call.get("id") == case.call_id
    return [path for path in _paths(case.command) if not any(path in c for c in later)]


def _paths(command: str) -> list[str]:
    """The file paths a command names (a summary's read-files list gives each a ref)."""
    return [word for word in re.findall(r"[\w./-]+", command) if "/" in word and "." in word]


def summary_cases(folder: Path, model: str, window: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """Whole runs of 2.5 to 4 windows: pruning alone does not bring them under,
    and the span fits one summary prompt (a longer one is summarized in
    chunks, a model call each)."""
    for name, request in fixtures(folder):
        if 2.5 * window < _chars(request["messages"]) / 4 < 4 * window:
            yield name, {**request, "model": model, "max_tokens": 64}
