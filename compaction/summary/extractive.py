"""The extractive summarizer: a deterministic digest of the middle, no LLM.

Used when no summarizer model is configured or when the LLM call fails. It
fills the same sections as the LLM summary from what can be read off the
messages directly:

* Goal — the task (named in one line; the head keeps it verbatim) and later
  user requests;
* Constraints & Preferences — the ``/compact`` instructions, user sentences
  that state a rule ("must", "don't", "always", …), and user messages sent
  again and again (an agent harness's format complaints), once with a count;
* Progress — one line per tool call (:mod:`compaction.summary.steps`) with its key
  argument and outcome; the latest call is In Progress; the last
  :data:`_MAX_ERRORS` distinct error lines seen are Blocked, quoted whole up
  to 300 characters and ranked above everything but the task and the plan;
* Key Decisions — assistant sentences that state a decision ("I'll use…",
  "decided to…", "instead of…", "switch to…", "the fix is…", "we should…"),
  not whatever sentence comes first;
* Next Steps — the end of the last assistant text;
* Critical Context — files modified and what an earlier summary held.

Every line gets a score, and the lowest-scored are dropped until the text
fits the token budget (:mod:`compaction.summary.ranked`): old steps go before new
ones, reasoning before requests. An earlier summary's Goal and Done lines are
carried over, so rolling compactions do not forget the start of the session.
Texts are read up to :data:`_SCAN_CHARS` and in linear time. No line is cut
inside a word (:func:`compaction.text.cuts.one_line`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

from compaction.chat.messages import message_text
from compaction.chat.own import is_summary
from compaction.chat.typed import first_typed, typed_messages
from compaction.summary.files import FileLists
from compaction.summary.ranked import RankedLines
from compaction.summary.steps import Step, tool_steps
from compaction.text.cuts import one_line
from compaction.tokens.counter import TokenCounter
from compaction.types import Message

_TASK_CHARS = 240
_REQUEST_CHARS = 300
_LINE_CHARS = 200
_NEXT_CHARS = 400
#: Distinct error lines quoted under Blocked, the newest. Five, because the
#: last errors of a session are what the next turn is about; measured over
#: ../shared/fixtures (tests/compaction/summary/test_summary_quality.py).
_MAX_ERRORS = 5
#: The tool call an error line came from, as quoted beside it.
_ERROR_SOURCE_CHARS = 80
#: Decisions quoted per assistant text, the first ones.
_DECISIONS_PER_TEXT = 2
_MAX_MODIFIED = 8
#: A path longer than this (text passed where a path was expected) is cut in the
#: list of modified files: whole, it crowded the span's steps out of the digest.
_PATH_CHARS = 120
_MIN_WORDS = 4
#: The newest steps and reasoning lines kept ahead of everything but the task.
_KEEP_RECENT = 3

_TAG = re.compile(r"</?[A-Za-z][\w-]*>")
_INTRODUCTION = re.compile(
    r"(?i)^(?:consider|here is|here's|here are|below is|given)\b[^\n]{0,80}:[ \t]*\n"
)
_DIGITS = re.compile(r"\d+")
_CODE_BLOCK = re.compile(r"```.*?(```|$)", re.DOTALL)
_THOUGHT = re.compile(r"^\s*(THOUGHT|Thought|DISCUSSION)\s*:\s*")
_PARAGRAPH = re.compile(r"\n\s*\n|\n(?=\s*[-*\d])")
_SENTENCE_END = re.compile(r"(?<=[.!?]) ")
#: Sentences are looked for in this much of a message only: rules and
#: decisions are stated early, and a huge paste holds none worth quoting.
_SCAN_CHARS = 2_000
_RULE = re.compile(
    r"(?i)\b(must|must not|mustn't|don't|do not|never|always|should|shouldn't|"
    r"make sure|prefer|please use|only)\b"
)
#: A sentence that states a decision: a choice, a plan of change, a fix.
#: Looking or checking ("Let me look at…", "I'll run the tests") is not one.
_DECISION = re.compile(
    r"(?i)\b(?:"
    r"decided?|decision|chose|choose|choosing|opt(?:ed)? (?:for|to)|go(?:ing)? with|"
    r"instead(?: of)?|rather than|switch(?:ed|ing)? (?:to|from|over)|"
    r"(?:the|my|our) (?:fix|solution|approach|plan|best (?:option|approach|way)|right way)"
    r" (?:is|will be|here is)|"
    r"(?:we|I) (?:should|need to|must|have to)|(?:it's|it is) better to|"
    r"(?:I|we)(?:'ll| will| am going to|'m going to| are going to|'re going to) "
    r"(?:use|add|change|replace|implement|modify|rewrite|remove|avoid|keep|move|"
    r"refactor|wrap|patch|fix|update|create|introduce|handle|override|drop|revert|"
    r"restore|rename|skip|guard|convert|make)\b|"
    r"let's (?:use|go with|switch|replace|change|implement|keep|fix|add|remove|modify)"
    r")"
)
# Possessive: a space could belong to the name or to the blanks around it, and
# trying every split took time growing with the fourth power of a line's blanks.
_HEADING = re.compile(r"^\s*+(?:#{1,6}\s*+)?(?:\*\*)?\s*+([A-Za-z &]++)\s*+(?:\*\*)?\s*+:?\s*+$")
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


def extractive_summary(
    middle: Sequence[Message],
    *,
    head: Sequence[Message] = (),
    task: str | None = None,
    previous: Sequence[str] = (),
    budget: int,
    counter: TokenCounter,
    instructions: str | None = None,
    files: FileLists | None = None,
    turn_prefix: bool = False,
) -> str:
    """A structured summary of ``middle`` in at most ``budget`` tokens.

    ``head`` is context only (the task is quoted from it); a caller that has
    read the task already (:func:`~compaction.chat.typed.first_typed` of the
    head) passes it as ``task`` instead, so the head is not read again for each
    summary. ``previous`` are the bodies of earlier summaries being replaced.
    With ``turn_prefix`` the Goal and Constraints sections are left out: the
    request that opened the turn is kept verbatim right above this summary.
    """
    lines = RankedLines()
    ordinary = [m for m in middle if not is_summary(m)]
    old = [_parse_previous(text) for text in previous]

    if not turn_prefix:
        requests = typed_messages(ordinary)
        _goal(lines, first_typed(head) if task is None else task, requests, old)
        _constraints(lines, requests, old, instructions)
    steps = tool_steps(ordinary)
    _progress(lines, steps, old)
    reasoning = _assistant_texts(ordinary)
    _decisions(lines, reasoning, old)
    _next_steps(lines, reasoning, old)
    _critical(lines, old, files)
    return lines.render(budget, counter, turn_prefix=turn_prefix)


def _recency(i: int, n: int) -> float:
    """0 for the oldest of ``n`` things, just under 1 for the newest."""
    return i / n if n else 0.0


# --- sections --------------------------------------------------------------


def _goal(
    lines: RankedLines,
    task: str,
    requests: Sequence[str],
    old: Sequence[dict[str, list[str]]],
) -> None:
    """``task`` is the head's first typed words; ``requests`` the user texts of the middle."""
    for sections in old:
        for line in sections.get("Goal", []):
            lines.add("Goal", line, 95)
    requests = list(requests)
    if task:
        lines.add("Goal", f"Task: {_task_quote(task)}", 100)
    elif requests and not old:
        lines.add("Goal", f"Task: {_task_quote(requests.pop(0))}", 100)
    tally = _tally(requests)
    for i, (text, count) in enumerate(tally):
        if count == 1:  # a repeated message is a reminder: see _constraints
            score = 80 + _recency(i, len(tally))
            lines.add("Goal", f"User: {one_line(text, _REQUEST_CHARS)}", score)


def _constraints(
    lines: RankedLines,
    requests: Sequence[str],
    old: Sequence[dict[str, list[str]]],
    instructions: str | None,
) -> None:
    section = "Constraints & Preferences"
    if instructions and instructions.strip():
        focus = f"Focus requested for this summary: {one_line(instructions, _LINE_CHARS)}"
        lines.add(section, focus, 100)
    for sections in old:
        for line in sections.get(section, []):
            if not re.search(r"(?i)none (stated|recorded)", line):
                lines.add(section, line, 75)
    rules: list[str] = []
    for text, count in _tally(requests):
        sentences = _sentences(_strip_code(text)) or [text]
        if count > 1:  # quoted by its first sentence, once
            said, sentences = sentences[0], sentences[1:]
            lines.add(section, f"User, {count} times: {one_line(said, _LINE_CHARS)}", 72)
        rules.extend([s for s in sentences if _RULE.search(s)] * count)
    for rule, count in _tally(rules):
        lines.add(section, one_line(rule, _LINE_CHARS) + _times(count), 70)


def _progress(
    lines: RankedLines, steps: Sequence[Step], old: Sequence[dict[str, list[str]]]
) -> None:
    previous_done = [line for sections in old for line in sections.get("Done", [])]
    for i, line in enumerate(previous_done):
        lines.add("Done", line, 50 + _recency(i, len(previous_done)))
    if steps:
        *done, last = steps
        for i, step in enumerate(done):
            recent = i >= len(done) - _KEEP_RECENT
            lines.add("Done", step.line, 82 if recent else 60 + 10 * _recency(i, len(done)))
        lines.add("In Progress", f"Most recent step: {last.line.removeprefix('- ')}", 90)
    errors = _last_errors(steps)
    for i, (error, call) in enumerate(errors):
        source = one_line(call, _ERROR_SOURCE_CHARS)
        lines.add("Blocked", f"Error seen: `{error}` (from {source})", 91 + i / 10)
    for sections in old:
        for line in sections.get("Blocked", []):
            if not re.search(r"(?i)^- none", line):
                lines.add("Blocked", line, 35)


def _decisions(
    lines: RankedLines, reasoning: Sequence[str], old: Sequence[dict[str, list[str]]]
) -> None:
    """``reasoning`` are the assistant texts of the middle."""
    for sections in old:
        for line in sections.get("Key Decisions", []):
            lines.add("Key Decisions", line, 38)
    texts = reasoning[:-1]  # the last one becomes Next Steps
    for i, text in enumerate(texts):
        decisions = [
            s for s in _iter_sentences(text) if len(s.split()) >= _MIN_WORDS and _DECISION.search(s)
        ]
        for sentence in decisions[:_DECISIONS_PER_TEXT]:
            # The newest few always stay; older reasoning ages like the steps do.
            recent = i >= len(texts) - _KEEP_RECENT
            score = 80 if recent else 60 + 10 * _recency(i, len(texts))
            lines.add("Key Decisions", one_line(sentence, _LINE_CHARS), score)


def _next_steps(
    lines: RankedLines, texts: Sequence[str], old: Sequence[dict[str, list[str]]]
) -> None:
    if texts:
        sentences = _sentences(texts[-1], from_end=True)
        lines.add("Next Steps", f"Last plan: {one_line(' '.join(sentences[-3:]), _NEXT_CHARS)}", 90)
        return
    for sections in old:
        for line in sections.get("Next Steps", []):
            lines.add("Next Steps", line, 45)


def _critical(
    lines: RankedLines, old: Sequence[dict[str, list[str]]], files: FileLists | None
) -> None:
    if files and files.modified:
        shown = files.modified[-_MAX_MODIFIED:]
        more = len(files.modified) - len(shown)
        extra = f" (+{more} more)" if more else ""
        names = ", ".join(one_line(path, _PATH_CHARS) for path in shown)
        lines.add("Critical Context", f"Last files modified: {names}{extra}", 72)
    for sections in old:
        for line in sections.get("Critical Context", []):
            lines.add("Critical Context", line, 65)
        for line in sections.get("In Progress", []):
            lines.add("Critical Context", f"Earlier: {line.removeprefix('- ')}", 30)


# --- reading messages ------------------------------------------------------


def _last_errors(steps: Sequence[Step]) -> list[tuple[str, str]]:
    """``(error line, call)`` of the last :data:`_MAX_ERRORS` distinct error lines, oldest first."""
    found: dict[str, str] = {}
    for step in reversed(steps):
        for error in reversed(step.errors):
            if error not in found:
                found[error] = step.call
                if len(found) == _MAX_ERRORS:
                    return list(reversed(found.items()))
    return list(reversed(found.items()))


def _task_quote(text: str) -> str:
    """The task in a line: the head keeps it verbatim, the summary only names it.

    Markup tags and an introduction ("Consider the following PR
    description:") are left out, and a cut falls between words.
    """
    text = _INTRODUCTION.sub("", _TAG.sub(" ", text[:_SCAN_CHARS]).strip(), count=1)
    quote = one_line(text, _TASK_CHARS)
    if quote.endswith("…"):
        quote = quote[:-1].rsplit(" ", 1)[0].rstrip(" ,;:") + " …"
    return quote


def _tally(texts: Iterable[str]) -> list[tuple[str, int]]:
    """``(text, how many times)`` for texts that differ only in numbers, case or spacing.

    Agent harnesses repeat their complaints ("found 3 actions", "found 2
    actions"); one line with a count says the same in far less. Each entry
    holds the newest text and stands where its newest copy did.
    """
    found: dict[str, tuple[str, int]] = {}
    for text in texts:
        key = _DIGITS.sub("0", " ".join(text.lower().split()))
        _, count = found.pop(key, ("", 0))
        found[key] = (text, count + 1)
    return list(found.values())


def _times(count: int) -> str:
    return f" ({count} times)" if count > 1 else ""


def _assistant_texts(messages: Sequence[Message]) -> list[str]:
    texts = []
    for message in messages:
        if message.get("role") == "assistant":
            text = _THOUGHT.sub("", _strip_code(message_text(message))).strip()
            if text:
                texts.append(text)
    return texts


# --- text helpers ----------------------------------------------------------


def _strip_code(text: str) -> str:
    return _CODE_BLOCK.sub(" ", text)


def _sentences(text: str, *, from_end: bool = False) -> list[str]:
    """The sentences of the first (or last) :data:`_SCAN_CHARS` of ``text``.

    Split at end punctuation followed by a blank, in one linear pass: a regex
    that searches for a sentence's end from every position is quadratic on
    long text without any.
    """
    return list(_iter_sentences(text, from_end=from_end))


def _iter_sentences(text: str, *, from_end: bool = False) -> Iterator[str]:
    """:func:`_sentences`, one by one: most callers want only the first that says something."""
    text = text[-_SCAN_CHARS:] if from_end else text[:_SCAN_CHARS]
    for paragraph in _PARAGRAPH.split(text):
        flat = " ".join(paragraph.split())
        yield from (s for s in _SENTENCE_END.split(flat) if s)


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
            sections.setdefault(current, []).append("- " + one_line(line, 3 * _LINE_CHARS))
    return sections
