"""Whether a summarizer's reply says something about the span, beyond having the headings.

:func:`compaction.summary.prompts.summary_problem` checks a reply's form (headings,
no chat). Small local models pass it with replies that are worse than the
extractive summary of the same span; this module catches them:

* **an echo** — the reply repeats the prompt's own instructions
  (:func:`echo_problem`): one of its lines holds a whole clause of the
  prompt or is a long enough part of one, or most of its bullets are worded
  from the prompt. Clauses of fewer than :data:`MIN_ECHO_WORDS` words
  do not count, so "None stated" or "Next Steps" never make an echo;
* **markup or a continued transcript** (:func:`markup_problem`) — the reply
  holds a tag the prompt wraps its parts in (``<conversation>``,
  ``</previous-summary>`` …) or a line that starts with a transcript's
  speaker label (``[User]:``, or an unbulleted ``Assistant:``);
* **no anchor** (:func:`anchor_problem`) — the span named paths, commands
  or errors (:func:`span_anchors`) and the reply names none of them; or
  (:func:`unchanged_problem`) the reply is the previous summary, not a line
  added, though the span named something the previous summary did not.

What a reply must not contradict is :mod:`compaction.summary.contradictions`.

Pure functions, linear in the reply and the span: a bounded number of
prompt clauses and of anchors, each looked for once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from compaction.chat.own import is_summary
from compaction.summary.prompts import PROMPT_TAGS, ROLE_LABELS, instruction_texts
from compaction.summary.steps import tool_steps
from compaction.text.clipping import is_tally_line
from compaction.text.shell import looks_like_path
from compaction.types import Message

#: A clause shorter than this (in words) is too generic to make an echo.
MIN_ECHO_WORDS = 4
#: Anchors kept per kind, the most recent: enough to find one a summary names.
MAX_ANCHORS = 48
#: A line of this many words or more that is part of a clause of the prompt
#: echoes it; a shorter one ("The user stated none") may say the same by chance.
_MIN_PART_WORDS = 6
#: A bullet of this many content words or more may count as worded from the prompt…
_MIN_BORROWED_WORDS = 3
#: …when at least this share of them are words of one clause of the prompt.
_BORROWED_SHARE = 0.8
#: An anchor shorter than this matches too much ("go", "ls") to tell anything.
_MIN_ANCHOR_CHARS = 3
#: A longer file or program name is text passed where a path or a command was expected.
_MAX_NAME_CHARS = 80
_QUOTE_CHARS = 60
_ERROR_QUOTE_CHARS = 40

#: Sample lines earlier versions of the prompts showed under each heading. A
#: summary written then may hold one, and it is folded in as the previous
#: summary, so a reply repeating it is an echo too.
_RETIRED_PROMPT_LINES = (
    "What the user wants to achieve. List every request the user made.",
    "Requirements, restrictions and preferences the user stated.",
    "Completed steps and their outcomes.",
    "Work started but not finished.",
    "Open problems, each with the exact error message.",
    "Decisions taken, and why.",
    "What should happen next, in order.",
    "Facts needed to continue: values, identifiers, findings, outputs that matter.",
    "The steps taken in this turn and their outcomes.",
    "Findings, values, and exact file paths, commands and error messages that "
    "the following steps rely on.",
)
_CLAUSE_END = re.compile(r"[.;:!?]\s+|[.;:!?]$|\n")
#: A word of a lowered line, a list item's bullet, and the words too common to
#: tell texts apart: shared with :mod:`compaction.summary.contradictions`.
WORD = re.compile(r"[a-z0-9&]+")
BULLET = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
STOPWORDS = frozenset(
    "the and for with that this are was were has have its their each not but from into "
    "what which who how all any you your our them they then than there".split()
)
_SEPARATORS = re.compile(r"&&|\|\||[;|\n]")
_PROGRAM_PREFIXES = frozenset({"sudo", "env", "time", "nohup", "command", "builtin", "exec"})
#: Programs too common, or too like an English word, to show a summary read the span.
_GENERIC_PROGRAMS = frozenset(
    "cd ls echo cat true false set export source python python3 bash sh zsh head tail "
    "printf exit pwd clear test find make read open which sort file less more touch "
    "kill wait".split()
)
_EXCEPTION = re.compile(r"\b(?:[A-Za-z_]\w*\.)*+([A-Z]\w*(?:Error|Exception|Warning))\b")
#: The word an error line starts with ("error:", "FAILED", "npm ERR!"): the same in every one.
_ERROR_WORDS = re.compile(r"(?i)^(?:error|fatal|panic|failed)(?:\[\w+\])?[:!]?\s+")
#: A step's call as :mod:`compaction.summary.steps` writes it: ``bash: `pytest -q``` for a
#: command, ``read_file `src/app.py``` for a path.
_QUOTED_ARGUMENT = re.compile(r"^[^`]*?(?P<command>:)? `(?P<value>.*)`$", re.DOTALL)
_ERROR_TOKEN_SEPARATORS = re.compile(r"[\s:'\"()`,]+")


# --- echo ------------------------------------------------------------------


def _words(text: str) -> list[str]:
    """Lowercase words, numbers left out: the budget a prompt states varies."""
    return [w for w in WORD.findall(text.lower()) if not w.isdigit()]


@cache
def _prompt_clauses() -> tuple[tuple[str, frozenset[str]], ...]:
    """The prompts' clauses of :data:`MIN_ECHO_WORDS` words or more: each as its
    joined words, and its content words."""
    # A retired line is compared whole: its parts ("Facts needed to continue")
    # may open a summary's own line.
    parts = [c for text in instruction_texts() for c in _CLAUSE_END.split(text)]
    clauses: dict[str, frozenset[str]] = {}
    for clause in (*parts, *_RETIRED_PROMPT_LINES):
        words = _words(clause)
        if len(words) >= MIN_ECHO_WORDS:
            clauses[" ".join(words)] = frozenset(_content(words))
    return tuple(clauses.items())


def _content(words: Iterable[str]) -> list[str]:
    return [w for w in words if len(w) >= 3 and w not in STOPWORDS]


def echo_problem(reply: str) -> str | None:
    """Why ``reply`` repeats the prompt's instructions, or ``None`` when it does not.

    A line echoes when, compared as lowercase words without numbers, it holds
    a whole clause of the prompt (of :data:`MIN_ECHO_WORDS` words or more) or
    is itself, with :data:`_MIN_PART_WORDS` words or more, part of one. A bullet is worded from the
    prompt when :data:`_BORROWED_SHARE` of its content words (three or more)
    are words of one clause; more than half the bullets so, two at least, is
    an echo too.
    """
    clauses = _prompt_clauses()
    bullets = borrowed = 0
    for line in reply.splitlines():
        words = _words(line)
        if not words:
            continue
        joined = f" {' '.join(words)} "
        if len(words) >= MIN_ECHO_WORDS:
            part = len(words) >= _MIN_PART_WORDS
            for clause, _ in clauses:
                if f" {clause} " in joined or (part and joined in f" {clause} "):
                    return f"repeats the prompt's instructions ({_quote(line)})"
        if BULLET.match(line):
            bullets += 1
            content = set(_content(words))
            if len(content) >= _MIN_BORROWED_WORDS and any(
                len(content & words_of) >= _BORROWED_SHARE * len(content) for _, words_of in clauses
            ):
                borrowed += 1
    if borrowed >= 2 and borrowed * 2 > bullets:
        return f"repeats the prompt's instructions ({borrowed} of {bullets} bullets)"
    return None


# --- markup ----------------------------------------------------------------


def _bare_labels() -> tuple[str, ...]:
    return tuple(f"{label.strip('[]').lower()}:" for label in ROLE_LABELS)


def markup_problem(reply: str) -> str | None:
    """Why ``reply`` copies the prompt's markup or continues its transcript, or ``None``.

    Markup: a tag the prompt wraps its parts in (:data:`~compaction.summary.prompts.PROMPT_TAGS`),
    opening or closing. A continued transcript: a line starting with a speaker
    label of the transcript (``[User]``, ``[Tool result]`` …, after a bullet
    too), or an unbulleted line starting ``User:``, ``Assistant:`` … — a summary's
    bullet "- User: asked for X" is a summary's own line.
    """
    lowered = reply.lower()
    for tag in PROMPT_TAGS:
        for form in (f"<{tag}>", f"</{tag}>"):
            if form in lowered:
                return f"holds the prompt's markup ({form})"
    labels = tuple(label.lower() for label in ROLE_LABELS)
    bare = _bare_labels()
    for line in reply.splitlines():
        start = line.strip().lstrip("*_").lower()
        unbulleted = BULLET.sub("", start).lstrip("*_")
        if unbulleted.startswith(labels) or start.startswith(bare):
            return f"continues the transcript ({_quote(line)})"
    return None


# --- anchors ---------------------------------------------------------------


@dataclass(frozen=True)
class Anchors:
    """What a span named that its summary should name too: file names (a path's
    last part), programs run, and errors (an exception's name, or the start of
    the line), the most recent :data:`MAX_ANCHORS` of each kind, compared
    without regard to case."""

    paths: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.paths or self.commands or self.errors)

    @property
    def all(self) -> tuple[str, ...]:
        return (*self.errors, *self.paths, *self.commands)


def span_anchors(messages: Sequence[Message]) -> Anchors:
    """The anchors of ``messages`` (earlier summaries among them are not read).

    Read off the steps the extractive summary lists (:func:`compaction.summary.steps.tool_steps`):
    what each call acted on as its step line quotes it — a command's first
    line, a path — and the error lines its result printed. The fallback quotes
    the newest step and the newest errors first, so it always names one.
    """
    paths: list[str] = []
    commands: list[str] = []
    errors: list[str] = []
    for step in tool_steps([m for m in messages if not is_summary(m)]):
        # Only a call ending in a backtick is tried: the first " `" then always
        # matches, and the pattern cannot rescan the call from each of them.
        quoted = _QUOTED_ARGUMENT.match(step.call) if step.call.endswith("`") else None
        if quoted:
            value = quoted.group("value").rstrip(" …")
            if quoted.group("command"):
                commands.extend(_programs(value))
                paths.extend(t.strip("'\"") for t in value.split() if looks_like_path(t))
            else:
                paths.append(value)
        for line in step.errors:
            errors.extend(_error_anchors(line))
    return Anchors(
        _kept(name for name in map(file_name, paths) if _plain(name)),
        _kept(program for program in commands if _plain(program)),
        _kept(errors),
    )


def anchor_problem(reply: str, anchors: Anchors) -> str | None:
    """Why ``reply`` names nothing of its span, or ``None`` when it names an anchor
    (or the span has none). An anchor is named where it stands apart from the
    letters and digits around it: ``app.py`` in ``src/app.py``, not ``cat`` in
    ``concatenate``."""
    if not anchors:
        return None
    lowered = reply.lower()
    if any(_names(lowered, anchor.lower()) for anchor in anchors.all):
        return None
    examples = ", ".join(f"`{a}`" for a in _examples(anchors))
    return f"names none of the span's paths, commands or errors (such as {examples})"


def unchanged_problem(reply: str, previous: Sequence[str], anchors: Anchors) -> str | None:
    """Why ``reply`` is the previous summary again although the span brought news, or ``None``.

    News: an anchor of the span that no previous summary names. A reply that
    adds not one line to the previous summaries (compared without case,
    blanks and bullet marks) then kept the old summary and dropped the span:
    a small model folding a summary in often copies it back unchanged.
    """
    if not previous:
        return None
    old = {_line_key(line) for text in previous for line in text.splitlines()}
    if any(line.strip() and _line_key(line) not in old for line in reply.splitlines()):
        return None
    earlier = "\n".join(previous).lower()
    news = [a for a in anchors.all if not _names(earlier, a.lower())]
    if not news:
        return None
    return f"repeats the previous summary and adds nothing of the span (such as `{news[-1]}`)"


def _line_key(line: str) -> str:
    return " ".join(BULLET.sub("", line).lower().split())


def _names(text: str, anchor: str) -> bool:
    at = text.find(anchor)
    while at != -1:
        end = at + len(anchor)
        before = text[at - 1] if at else " "
        after = text[end] if end < len(text) else " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            return True
        at = text.find(anchor, at + 1)
    return False


def _examples(anchors: Anchors) -> list[str]:
    """The newest anchor of each kind: what the note shows of what was expected."""
    newest = (kind[-1] for kind in (anchors.errors, anchors.paths, anchors.commands) if kind)
    return list(dict.fromkeys(newest))


def _kept(values: Iterable[str]) -> tuple[str, ...]:
    """Distinct usable anchors (case aside), the most recent :data:`MAX_ANCHORS`."""
    found: dict[str, str] = {}
    for value in values:
        value = value.strip()
        if len(value) >= _MIN_ANCHOR_CHARS and any(c.isalpha() for c in value):
            found.pop(value.lower(), None)
            found[value.lower()] = value
    return tuple(found.values())[-MAX_ANCHORS:]


def _plain(name: str) -> bool:
    """A name as a summary would quote it: one word, not a paragraph passed as a path."""
    return len(name) <= _MAX_NAME_CHARS and not any(c.isspace() for c in name)


def file_name(path: str) -> str:
    """The last part of ``path``, as a summary names a file."""
    return path.strip("'\"").rstrip("/").rsplit("/", 1)[-1]


def _programs(command: str) -> list[str]:
    """The program each simple command of ``command`` runs, generic ones left out."""
    found = []
    for part in _SEPARATORS.split(command):
        words = [w for w in part.split() if "=" not in w and w not in _PROGRAM_PREFIXES]
        if len(words) >= 3 and words[1] == "-m":  # python -m pytest: the module is what runs
            words = words[2:]
        if words:
            program = file_name(words[0])
            if program not in _GENERIC_PROGRAMS:
                found.append(program)
    return found


def _error_anchors(line: str) -> list[str]:
    """An error line's exception names and file names; without either, its start."""
    tokens = _ERROR_TOKEN_SEPARATORS.split(line)
    found = [name for t in tokens if looks_like_path(t) and _plain(name := file_name(t))]
    # The exception last: of the newest error line, its name is what a note shows.
    found.extend(m.group(1) for m in _EXCEPTION.finditer(line))
    if not found and is_tally_line(line):
        return []  # "3 failed, 68 passed": figures, not a name a summary would quote
    if not found:
        rest = _ERROR_WORDS.sub("", line.strip(), count=1).strip() or line.strip()
        found.append(_first_words(rest, _ERROR_QUOTE_CHARS))
    return found


def _first_words(text: str, limit: int) -> str:
    """The words of ``text`` that fit in ``limit`` characters (the first one at least),
    so the quote ends where a word does."""
    words = text.split()
    kept = words[:1]
    for word in words[1:]:
        if len(" ".join([*kept, word])) > limit:
            break
        kept.append(word)
    return " ".join(kept)


def _quote(line: str) -> str:
    line = " ".join(line.split())
    return repr(line if len(line) <= _QUOTE_CHARS else line[: _QUOTE_CHARS - 1] + "…")
