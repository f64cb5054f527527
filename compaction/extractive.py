"""The extractive summarizer: a deterministic digest of the middle, no LLM.

Used when no summarizer model is configured or when the LLM call fails. It
fills the same sections as the LLM summary from what can be read off the
messages directly:

* Goal — the task (quoted briefly from the head) and later user requests;
* Constraints & Preferences — the ``/compact`` instructions and user
  sentences that state a rule ("must", "don't", "always", …);
* Progress — one line per tool call with its key argument and outcome
  (exit status, error line, size); the latest call is In Progress; the last
  error lines seen are Blocked;
* Key Decisions — the first sentence of each assistant text;
* Next Steps — the end of the last assistant text;
* Critical Context — files modified and what an earlier summary held.

Everything is ranked, and the lowest-ranked lines are dropped until the text
fits the token budget: old steps go before new ones, reasoning before
requests. An earlier summary's Goal and Done lines are carried over, so
rolling compactions do not forget the start of the session.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from compaction.files import FileLists, results_after
from compaction.messages import (
    call_name_and_arguments,
    is_summary,
    key_argument,
    message_text,
    tool_calls,
)
from compaction.prompts import PROGRESS_SUBSECTIONS, SUMMARY_SECTIONS, fit_tokens
from compaction.tokens import TokenCounter
from compaction.types import Message

_TASK_CHARS = 400
_REQUEST_CHARS = 300
_ARGUMENT_CHARS = 120
_LINE_CHARS = 200
_NEXT_CHARS = 400
_MAX_ERRORS = 3
_MAX_MODIFIED = 8
_MIN_WORDS = 4
#: The newest steps and reasoning lines kept ahead of everything but the task.
_KEEP_RECENT = 3
_OMITTED_RESERVE = 16

_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_EXIT_CODE = re.compile(r"(?i)\bexit(?:\s+code|\s+status)?\s*[:=]?\s*(-?\d+)\b")
_OUTPUT = re.compile(r"<output>\n?(.*?)</output>", re.DOTALL)
_EXCEPTION_LINE = re.compile(r"^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit)\b.*")
_ERROR_WORDS = re.compile(
    r"(?i)\b(error|fatal|failed|failure|no such file|not found|permission denied|"
    r"cannot|can't|could not|unable to)\b"
)
_BRIEF_OUTCOME = re.compile(r"(?:→ (?P<size>[^()]*?))?\s*(?:\((?P<extras>[^()]*)\))?$")
_BRIEF_SIZE = re.compile(r"[\d,]+ (chars|lines?( output)?|images?)")
_FAILED_START = re.compile(r"(?i)^\s*(error|traceback|fatal|failed|exception)\b")
_CODE_BLOCK = re.compile(r"```.*?(```|$)", re.DOTALL)
_THOUGHT = re.compile(r"^\s*(THOUGHT|Thought|DISCUSSION)\s*:\s*")
_SENTENCE = re.compile(r".+?[.!?](?=\s|$)")
_RULE = re.compile(
    r"(?i)\b(must|must not|mustn't|don't|do not|never|always|should|shouldn't|"
    r"make sure|prefer|please use|only)\b"
)
_HEADING = re.compile(r"^\s*(?:#{1,6}\s*)?(?:\*\*)?\s*([A-Za-z &]+?)\s*(?:\*\*)?\s*:?\s*$")
_PREVIOUS_SECTIONS = {
    "goal": "Goal",
    "constraints & preferences": "Constraints & Preferences",
    "constraints": "Constraints & Preferences",
    "progress": "Done",
    "done": "Done",
    "done so far": "Done",
    "in progress": "In Progress",
    "blocked": "Blocked",
    "key decisions": "Key Decisions",
    "next steps": "Next Steps",
    "critical context": "Critical Context",
    "context needed next": "Critical Context",
}


@dataclass(frozen=True)
class _Item:
    section: str
    text: str
    score: float  # lowest is dropped first
    order: int  # position within its section


@dataclass(frozen=True)
class _Step:
    line: str
    error: str | None


def extractive_summary(
    middle: Sequence[Message],
    *,
    head: Sequence[Message] = (),
    previous: Sequence[str] = (),
    budget: int,
    counter: TokenCounter,
    instructions: str | None = None,
    files: FileLists | None = None,
    turn_prefix: bool = False,
) -> str:
    """A structured summary of ``middle`` in at most ``budget`` tokens.

    ``head`` is context only (the task is quoted from it); ``previous`` are the
    bodies of earlier summaries being replaced. With ``turn_prefix`` the Goal
    and Constraints sections are left out: the request that opened the turn
    is kept verbatim right above this summary.
    """
    items: list[_Item] = []
    add = _Adder(items)
    ordinary = [m for m in middle if not is_summary(m)]
    old = [_parse_previous(text) for text in previous]

    if not turn_prefix:
        _goal(add, head, ordinary, old)
        _constraints(add, ordinary, old, instructions)
    steps = _steps(ordinary)
    _progress(add, steps, old)
    _decisions(add, ordinary, old)
    _next_steps(add, ordinary, old)
    _critical(add, old, files)
    return _render_within(items, budget, counter, turn_prefix)


class _Adder:
    """Collects items, numbering them within their section and skipping duplicates."""

    def __init__(self, items: list[_Item]) -> None:
        self._items = items
        self._seen: set[tuple[str, str]] = set()

    def __call__(self, section: str, text: str, score: float) -> None:
        text = text if text.startswith("- ") else f"- {text}"
        key = (section, text)
        if key in self._seen:
            return
        self._seen.add(key)
        self._items.append(_Item(section, text, score, len(self._seen)))


def _recency(i: int, n: int) -> float:
    """0 for the oldest of ``n`` things, just under 1 for the newest."""
    return i / n if n else 0.0


# --- sections --------------------------------------------------------------


def _goal(
    add: _Adder,
    head: Sequence[Message],
    ordinary: Sequence[Message],
    old: Sequence[dict[str, list[str]]],
) -> None:
    for sections in old:
        for line in sections.get("Goal", []):
            add("Goal", line, 95)
    task = _first_user_text(head)
    requests = [message_text(m) for m in ordinary if m.get("role") == "user"]
    if task:
        add("Goal", f"Task: {_one_line(task, _TASK_CHARS)}", 100)
    elif requests and not old:
        add("Goal", f"Task: {_one_line(requests.pop(0), _TASK_CHARS)}", 100)
    for i, text in enumerate(requests):
        if text.strip():
            score = 80 + _recency(i, len(requests))
            add("Goal", f"User: {_one_line(text, _REQUEST_CHARS)}", score)


def _constraints(
    add: _Adder,
    ordinary: Sequence[Message],
    old: Sequence[dict[str, list[str]]],
    instructions: str | None,
) -> None:
    if instructions and instructions.strip():
        add(
            "Constraints & Preferences",
            f"Focus requested for this summary: {_one_line(instructions, _LINE_CHARS)}",
            100,
        )
    for sections in old:
        for line in sections.get("Constraints & Preferences", []):
            if not re.search(r"(?i)none (stated|recorded)", line):
                add("Constraints & Preferences", line, 75)
    for message in ordinary:
        if message.get("role") != "user":
            continue
        for sentence in _sentences(_strip_code(message_text(message))):
            if _RULE.search(sentence):
                add("Constraints & Preferences", _one_line(sentence, _LINE_CHARS), 70)


def _progress(add: _Adder, steps: Sequence[_Step], old: Sequence[dict[str, list[str]]]) -> None:
    previous_done = [line for sections in old for line in sections.get("Done", [])]
    for i, line in enumerate(previous_done):
        add("Done", line, 50 + _recency(i, len(previous_done)))
    if steps:
        *done, last = steps
        for i, step in enumerate(done):
            recent = i >= len(done) - _KEEP_RECENT
            add("Done", step.line, 82 if recent else 60 + 10 * _recency(i, len(done)))
        add("In Progress", f"Most recent step: {last.line.removeprefix('- ')}", 90)
    errors = [s for s in steps if s.error]
    for i, step in enumerate(errors[-_MAX_ERRORS:]):
        add("Blocked", f"Last error seen: `{step.error}` (from {_call_label(step)})", 85 + i / 10)
    for sections in old:
        for line in sections.get("Blocked", []):
            if not re.search(r"(?i)^- none", line):
                add("Blocked", line, 35)


def _call_label(step: _Step) -> str:
    return step.line.removeprefix("- ").split(" → ", 1)[0]


def _decisions(
    add: _Adder, ordinary: Sequence[Message], old: Sequence[dict[str, list[str]]]
) -> None:
    for sections in old:
        for line in sections.get("Key Decisions", []):
            add("Key Decisions", line, 38)
    texts = _assistant_texts(ordinary)[:-1]  # the last one becomes Next Steps
    for i, text in enumerate(texts):
        # The first sentence that says something: "Great!" or "Good." does not.
        sentence = next((s for s in _sentences(text) if len(s.split()) >= _MIN_WORDS), "")
        if sentence:
            # The newest few always stay; older reasoning ages like the steps do.
            recent = i >= len(texts) - _KEEP_RECENT
            score = 80 if recent else 60 + 10 * _recency(i, len(texts))
            add("Key Decisions", _one_line(sentence, _LINE_CHARS), score)


def _next_steps(
    add: _Adder, ordinary: Sequence[Message], old: Sequence[dict[str, list[str]]]
) -> None:
    texts = _assistant_texts(ordinary)
    if texts:
        sentences = list(_sentences(texts[-1]))
        add("Next Steps", f"Last plan: {_one_line(' '.join(sentences[-3:]), _NEXT_CHARS)}", 90)
        return
    for sections in old:
        for line in sections.get("Next Steps", []):
            add("Next Steps", line, 45)


def _critical(add: _Adder, old: Sequence[dict[str, list[str]]], files: FileLists | None) -> None:
    if files and files.modified:
        shown = files.modified[-_MAX_MODIFIED:]
        more = len(files.modified) - len(shown)
        extra = f" (+{more} more)" if more else ""
        add("Critical Context", "Last files modified: " + ", ".join(shown) + extra, 72)
    for sections in old:
        for line in sections.get("Critical Context", []):
            add("Critical Context", line, 65)
        for line in sections.get("In Progress", []):
            add("Critical Context", f"Earlier: {line.removeprefix('- ')}", 30)


# --- reading messages ------------------------------------------------------


def _first_user_text(messages: Iterable[Message]) -> str:
    for message in messages:
        if message.get("role") == "user" and not is_summary(message):
            text = message_text(message).strip()
            if text:
                return text
    return ""


def _assistant_texts(messages: Sequence[Message]) -> list[str]:
    texts = []
    for message in messages:
        if message.get("role") == "assistant":
            text = _THOUGHT.sub("", _strip_code(message_text(message))).strip()
            if text:
                texts.append(text)
    return texts


def _steps(messages: Sequence[Message]) -> list[_Step]:
    steps = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        results = results_after(messages, i)
        for call in tool_calls(message):
            steps.append(_step(call, results.get(call.get("id"))))
        function_call = message.get("function_call")
        if isinstance(function_call, dict):
            following = messages[i + 1] if i + 1 < len(messages) else {}
            result = message_text(following) if following.get("role") == "function" else None
            steps.append(_step(function_call, result))
    return steps


def _step(call: dict[str, Any], result: str | None) -> _Step:
    name, _ = call_name_and_arguments(call)
    key, value = key_argument(call)
    if not value:
        what = name or "tool"
    elif key in ("command", "cmd"):
        what = f"{name}: `{_first_line(value)}`"
    elif key in ("path", "file_path", "filepath", "file", "filename", "target_file"):
        what = f"{name} `{_first_line(value)}`"
    else:
        what = f"{name}({key}={_first_line(value)})"
    if result is None:
        return _Step(f"- {what}", None)
    brief = _pruned_brief(name, result)
    outcome, error = brief if brief else _outcome(result)
    return _Step(f"- {what} → {outcome}", error)


def _outcome(result: str) -> tuple[str, str | None]:
    """A few words on how a tool call went, and its error line if it failed."""
    code_match = _RETURNCODE.search(result) or _EXIT_CODE.search(result[:200])
    code = int(code_match.group(1)) if code_match else None
    output_match = _OUTPUT.search(result)
    body = output_match.group(1) if output_match else result
    if code is not None:
        failed = code != 0
    else:
        failed = bool(_FAILED_START.match(body) or _exception_line(body))
    error = _error_line(body) if failed else None
    lines = [line for line in body.splitlines() if line.strip()]
    if not lines:
        size = "no output"
    elif len(lines) == 1 and len(body) <= 80 and not error:
        size = f"`{lines[0].strip()}`"
    elif len(lines) == 1:
        size = f"{len(body.strip()):,} chars"
    else:
        size = f"{len(lines):,} lines"
    parts = [f"exit {code}"] if code is not None else []
    parts.append(f"error: `{error}`" if error else size)
    return ", ".join(parts), error


def _pruned_brief(name: str, result: str) -> tuple[str, str | None] | None:
    """The outcome already written by the pruner into a one-line brief.

    ``[bash] "pytest" → 32 lines output (exit code 1, AssertionError: …)`` or
    ``[read_file] src/app.py (45,210 chars)``: in the pipeline the condenser
    sees the middle after pruning, so most long results arrive like this.
    """
    if "\n" in result or not result.startswith(f"[{name}] "):
        return None
    match = _BRIEF_OUTCOME.search(result)
    if not match:
        return None
    size, extras = match.group("size"), (match.group("extras") or "")
    parts = [p.strip() for p in extras.split(", ") if p.strip()]
    code = next((p for p in parts if p.startswith("exit code")), None)
    details = [p for p in parts if p != code and not _BRIEF_SIZE.fullmatch(p)]
    sizes = [p for p in parts if _BRIEF_SIZE.fullmatch(p)]
    failed = code is not None and code != "exit code 0"
    error = details[-1] if details and (failed or code is None) else None
    words = [code.replace("exit code", "exit")] if code else []
    size = (size or ", ".join(sizes)).removesuffix(" output").strip()
    words.append(f"error: `{error}`" if error else size)
    return ", ".join(w for w in words if w), error


def _exception_line(text: str) -> str | None:
    for line in reversed(text.splitlines()):
        if _EXCEPTION_LINE.match(line):
            return line.strip()
    return None


def _error_line(text: str) -> str | None:
    """The line that best says what went wrong: a traceback's last line first."""
    line = _exception_line(text)
    if line is None:
        line = next(
            (s.strip() for s in reversed(text.splitlines()) if _ERROR_WORDS.search(s)), None
        )
    return _one_line(line, _LINE_CHARS) if line else None


# --- text helpers ----------------------------------------------------------


def _strip_code(text: str) -> str:
    return _CODE_BLOCK.sub(" ", text)


def _sentences(text: str) -> Iterable[str]:
    for paragraph in re.split(r"\n\s*\n|\n(?=\s*[-*\d])", text):
        flat = " ".join(paragraph.split())
        end = 0
        for match in _SENTENCE.finditer(flat):
            yield match.group().strip()
            end = match.end()
        if flat[end:].strip():
            yield flat[end:].strip()


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    first = _one_line(lines[0], _ARGUMENT_CHARS) if lines else ""
    return first + (" …" if len(lines) > 1 and not first.endswith("…") else "")


# --- previous summaries ----------------------------------------------------


def _parse_previous(text: str) -> dict[str, list[str]]:
    """An earlier summary's lines by section; unrecognized text goes to Critical Context."""
    sections: dict[str, list[str]] = {}
    current = "Critical Context"
    for raw in text.splitlines():
        match = _HEADING.match(raw)
        name = _PREVIOUS_SECTIONS.get(match.group(1).strip().lower()) if match else None
        if name:
            current = name
            continue
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = re.sub(r"^[-*•]\s*|^\d+[.)]\s*", "", line)
        if line:
            sections.setdefault(current, []).append("- " + _one_line(line, 3 * _LINE_CHARS))
    return sections


# --- fitting the budget ----------------------------------------------------


def _render(items: Sequence[_Item], omitted_steps: int, turn_prefix: bool) -> str:
    by_section: dict[str, list[_Item]] = {}
    for item in items:
        by_section.setdefault(item.section, []).append(item)

    def lines(section: str) -> list[str]:
        found = sorted(by_section.get(section, []), key=lambda i: i.order)
        out = [i.text for i in found]
        if section == "Done" and omitted_steps:
            out.insert(0, f"- ({omitted_steps:,} earlier steps not listed)")
        return out or ["- None recorded"]

    out: list[str] = []
    for section in SUMMARY_SECTIONS:
        if turn_prefix and section in ("Goal", "Constraints & Preferences"):
            continue
        out.append(f"## {section}")
        if section == "Progress":
            for sub in PROGRESS_SUBSECTIONS:
                out.append(f"### {sub}")
                out.extend(lines(sub))
        else:
            out.extend(lines(section))
        out.append("")
    return "\n".join(out).strip()


def _render_within(
    items: Sequence[_Item], budget: int, counter: TokenCounter, turn_prefix: bool
) -> str:
    kept = list(items)
    costs = {id(i): counter.count_text(i.text) + 1 for i in kept}
    frame = counter.count_text(_render([], 0, turn_prefix)) + _OMITTED_RESERVE
    total = frame + sum(costs.values())
    by_rank = sorted(kept, key=lambda i: (i.score, i.order))
    dropped: set[int] = set()
    omitted = 0
    while True:
        while total > budget and len(dropped) < len(by_rank):
            victim = by_rank[len(dropped)]
            dropped.add(id(victim))
            total -= costs[id(victim)]
            omitted += victim.section == "Done"
        kept = [i for i in items if id(i) not in dropped]
        text = _render(kept, omitted, turn_prefix)
        actual = counter.count_text(text)
        if actual <= budget or len(dropped) >= len(by_rank):
            return fit_tokens(text, budget, counter)
        total = actual + 1  # joins tokenized differently: drop one more and retry
