"""Whether a summarizer's reply says something about the span, beyond having the headings.

:func:`compaction.prompts.summary_problem` checks a reply's form (headings,
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

Pure functions, linear in the reply and the span: a bounded number of
prompt clauses and of anchors, each looked for once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache

from compaction.clipping import is_tally_line
from compaction.files import FileLists
from compaction.messages import message_text
from compaction.prompts import PROMPT_TAGS, ROLE_LABELS, instruction_texts
from compaction.shell import looks_like_path
from compaction.steps import tool_steps
from compaction.summary import is_summary
from compaction.text import without_reminders
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
_WORD = re.compile(r"[a-z0-9&]+")
_BULLET = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_STOPWORDS = frozenset(
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
#: A step's call as :mod:`compaction.steps` writes it: ``bash: `pytest -q``` for a
#: command, ``read_file `src/app.py``` for a path.
_QUOTED_ARGUMENT = re.compile(r"^[^`]*?(?P<command>:)? `(?P<value>.*)`$", re.DOTALL)
_ERROR_TOKEN_SEPARATORS = re.compile(r"[\s:'\"()`,]+")


# --- echo ------------------------------------------------------------------


def _words(text: str) -> list[str]:
    """Lowercase words, numbers left out: the budget a prompt states varies."""
    return [w for w in _WORD.findall(text.lower()) if not w.isdigit()]


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
    return [w for w in words if len(w) >= 3 and w not in _STOPWORDS]


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
        if _BULLET.match(line):
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

    Markup: a tag the prompt wraps its parts in (:data:`~compaction.prompts.PROMPT_TAGS`),
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
        unbulleted = _BULLET.sub("", start).lstrip("*_")
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

    Read off the steps the extractive summary lists (:func:`compaction.steps.tool_steps`):
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
        _kept(name for name in map(_file_name, paths) if _plain(name)),
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
    return " ".join(_BULLET.sub("", line).lower().split())


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


def _file_name(path: str) -> str:
    return path.strip("'\"").rstrip("/").rsplit("/", 1)[-1]


def _programs(command: str) -> list[str]:
    """The program each simple command of ``command`` runs, generic ones left out."""
    found = []
    for part in _SEPARATORS.split(command):
        words = [w for w in part.split() if "=" not in w and w not in _PROGRAM_PREFIXES]
        if len(words) >= 3 and words[1] == "-m":  # python -m pytest: the module is what runs
            words = words[2:]
        if words:
            program = _file_name(words[0])
            if program not in _GENERIC_PROGRAMS:
                found.append(program)
    return found


def _error_anchors(line: str) -> list[str]:
    """An error line's exception names and file names; without either, its start."""
    tokens = _ERROR_TOKEN_SEPARATORS.split(line)
    found = [name for t in tokens if looks_like_path(t) and _plain(name := _file_name(t))]
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


# --- contradictions --------------------------------------------------------

#: A task with fewer content words than this says too little to check a Goal against.
MIN_TASK_WORDS = 3
#: A content word of the task has at least this many letters ("fix" and "the" do not count).
MIN_TASK_WORD_LETTERS = 4
#: Of a long task (a pasted issue) this much is read: an agent harness's boilerplate
#: ("We're currently solving the following issue …") may fill its first lines, and the
#: words a Goal restates come after.
_TASK_SCAN_CHARS = 4_000

#: Past forms saying a file was changed: what a summary claims when it reports work done.
#: Bare and future forms ("fix", "will edit") are plans, not claims, and do not count.
_MODIFY_VERBS = frozenset(
    "modified edited changed created wrote written rewrote rewritten updated fixed patched "
    "added removed deleted renamed refactored replaced implemented inserted appended "
    "overwrote overwritten saved moved applied reverted amended adjusted corrected".split()
)
#: Other verbs of a summary's report: one standing nearer before a path than a modify
#: verb takes the path from it ("fixed the bug after reading `a.py`").
_OTHER_VERBS = frozenset(
    "read reads reading opened open opens opening viewed view viewing inspected inspecting "
    "examined examining looked looking checked checking reviewed reviewing searched "
    "searching grepped ran run running listed listing found located saw seen showed shown "
    "displayed loaded loading compared studied explored investigated traced tested testing "
    "scanned analyzed analysed confirmed verified noted contains defines imports uses calls "
    "mentions describes lists reported printed inspects examines checks views".split()
)
#: Words that take the claim away from the verb they stand by: a negation ("`a.py` was
#: read, not modified"), or a condition or plan ("once `a.py` is updated").
_NEUTRALIZERS = frozenset(
    "not no never without nothing neither nor unchanged untouched instead if once until "
    "unless whether will would should could must might may need needs plan planned "
    "planning want wants going yet".split()
)
#: Words joining a path to a passive verb after it: "`a.py` was read", "`b.py` has been fixed".
_AUXILIARIES = frozenset("was were is are got has have had been".split())
#: Sections whose lines are plans, not reports of work done.
_PLAN_SECTIONS = frozenset({"next steps", "next step", "context needed next"})
#: Section names a summary line may carry as its heading (``## Goal``, ``**Goal:**``, ``Goal:``).
_KNOWN_SECTIONS = frozenset(
    {
        "goal",
        "goals",
        "constraints & preferences",
        "constraints and preferences",
        "constraints",
        "progress",
        "done",
        "in progress",
        "blocked",
        "key decisions",
        "decisions",
        "next steps",
        "next step",
        "critical context",
        "done so far",
        "context needed next",
    }
)
_CLAUSE_SPLIT = re.compile(r"[.;!?](?=\s|$)|\n")
_TOKEN_EDGES = "`'\"()[]{}<>,:;!?*_"
_HEADING_MARKS = "#*_ \t"


@dataclass(frozen=True)
class SpanFacts:
    """What the engine computed from a span that a model's summary must not contradict:
    the files it read and modified (:func:`compaction.files.collect_files`), and the
    task the conversation pursues (the head's first user message, or the Goal of the
    summary being folded in). ``check_goal`` is off for a turn-prefix note, which has
    no Goal section."""

    files: FileLists = field(default_factory=FileLists)
    task: str = ""
    check_goal: bool = True


def task_of(head: Sequence[Message], previous: Sequence[str]) -> str:
    """The task a summary's Goal restates: the head's first user message (less
    the client's ``<system-reminder>`` context), or, when the head has none, the
    Goal sections of the summaries being folded in."""
    for message in head:
        if message.get("role") == "user" and not is_summary(message):
            text = without_reminders(message_text(message)).strip()
            if text:
                return text
    return "\n".join(line for text in previous for line in summary_section(text, "goal"))


def contradiction_problem(reply: str, facts: SpanFacts) -> str | None:
    """Why ``reply`` contradicts what the engine computed from its span, or ``None``:
    it names as modified a file the span only read (:func:`modified_claim_problem`),
    or it drops the goal (:func:`goal_problem`)."""
    problem = modified_claim_problem(reply, facts.files)
    if problem is None and facts.check_goal:
        problem = goal_problem(reply, facts.task)
    return problem


def modified_claim_problem(reply: str, files: FileLists) -> str | None:
    """Why ``reply`` says a file was modified that ``files`` lists as only read, or ``None``.

    The claim is the verb nearest before the path within its clause (clauses end at
    ``.``, ``;``, ``!``, ``?`` before a blank, and at a line's end): "Read `a.py` and
    fixed `b.py`" says "fixed" of ``b.py`` only. A passive verb right after the
    path ("`a.py` was read", "`b.py` has been updated") is the path's own and comes
    first. Only past forms of a modify word (modified, edited, fixed …) claim; a
    negation, a condition or a plan between the verb and the path or just before the
    verb ("not modified", "once … is updated", "will need to be fixed") takes the
    claim away, and so does one before a path a passive verb follows ("once `a.py` is
    updated"). Under a heading that names modification ("## Modified files") a path
    with no verb before it is claimed modified. Lines under Next Steps are plans and
    are not read. Verbs inside backticks are quoted commands, not the summary's
    words. A name without a directory ("`app.py`") stands for a listed path ending in
    it, and claims nothing when a modified file ends in it too.
    """
    modified = set(files.modified)
    only_read = [path for path in files.read if path not in modified]
    if not only_read:
        return None
    resolve = _path_resolver(only_read, files.modified)
    section = ""
    for line in reply.splitlines():
        heading = _heading_name(line)
        if heading is not None:
            section = heading
            rest = _heading_rest(line)
            if not rest:
                continue
            line = rest
        if section in _PLAN_SECTIONS:
            continue
        modified_heading = any(word in section for word in ("modif", "changed", "edited"))
        for clause in _CLAUSE_SPLIT.split(line):
            claimed = _claimed_paths(clause, resolve, modified_heading)
            if claimed is not None:
                return f"names `{claimed}` as modified, but the span only read it"
    return None


def goal_problem(reply: str, task: str) -> str | None:
    """Why ``reply`` drops the goal of ``task``, or ``None``.

    Checked only when the task has :data:`MIN_TASK_WORDS` content words or more (of
    :data:`MIN_TASK_WORD_LETTERS` letters or more, stopwords aside, from its opening
    :data:`_TASK_SCAN_CHARS` characters): the reply's Goal section is empty, or
    shares not one of them. Words are compared lowercase without a plural or
    past ending ("tests" is "test", "failing" is "fail").
    """
    wanted = {_stem(w) for w in _task_words(task[:_TASK_SCAN_CHARS])}
    if len(wanted) < MIN_TASK_WORDS:
        return None
    goal = summary_section(reply, "goal")
    if not any(line.strip(" -*•\t") for line in goal):
        return "drops the goal (its Goal section is empty)"
    said = {_stem(w) for w in _WORD.findall(" ".join(goal).lower())}
    if wanted & said:
        return None
    example = ", ".join(sorted(wanted)[:3])
    return f"drops the goal (its Goal section shares no word of the task, such as {example})"


def summary_section(text: str, name: str) -> list[str]:
    """The lines of ``text``'s section ``name`` (lowercase, as :data:`_KNOWN_SECTIONS`),
    text after its heading's colon first; empty when there is no such heading."""
    lines: list[str] = []
    inside = False
    for line in text.splitlines():
        heading = _heading_name(line)
        if heading is not None:
            inside = heading in (name, f"{name}s")
            rest = _heading_rest(line)
            if inside and rest:
                lines.append(rest)
            continue
        if inside:
            lines.append(line)
    return lines


def _heading_name(line: str) -> str | None:
    """The lowercase name of the heading ``line`` is, or ``None``: a Markdown
    heading (any name), or a known section's name bold or before a colon."""
    stripped = line.strip()
    if not stripped:
        return None
    markdown = stripped.startswith("#")
    if markdown:
        name = stripped.lstrip("#").strip(" \t*_")
        name = name.split("(", 1)[0].split(":", 1)[0]
        return " ".join(name.lower().split())
    unbulleted = _BULLET.sub("", stripped, count=1)
    head, colon, _ = unbulleted.partition(":")
    name = " ".join(head.strip(_HEADING_MARKS).lower().split())
    if name in _KNOWN_SECTIONS and (colon or unbulleted.strip(_HEADING_MARKS) == head.strip()):
        return name
    # "**Files modified:**", "Changed files:": a heading of the summary's own, bold or
    # a short line ending in its colon.
    bold = head.lstrip().startswith(("**", "__"))
    if colon and (bold or not _heading_rest(line)) and 0 < len(name.split()) <= 4:
        return name
    return None


def _heading_rest(line: str) -> str:
    """The text after a heading's colon ("**Goal:** fix it" → "fix it")."""
    stripped = line.strip()
    if stripped.startswith("#"):
        return ""
    _, colon, rest = stripped.partition(":")
    return rest.strip(_HEADING_MARKS) if colon else ""


def _path_resolver(only_read: Sequence[str], modified: Sequence[str]) -> dict[str, str]:
    """A map from how a summary may write a path (whole, or its last part) to the
    only-read path it names; a last part a modified file shares is left out."""
    taken = {_file_name(path) for path in modified}
    found: dict[str, str] = {}
    names: dict[str, set[str]] = {}
    for path in only_read:
        clean = path.strip("'\"").lstrip("./")
        found[clean] = path
        names.setdefault(_file_name(clean), set()).add(path)
    for name, paths in names.items():
        if name not in taken and len(paths) == 1 and name not in found:
            found[name] = next(iter(paths))
    return found


def _resolve(token: str, resolve: dict[str, str]) -> str | None:
    """The only-read path ``token`` names: whole, with a leading ``./`` or a root
    directory before it (``/testbed/src/a.py``), or as a bare last part."""
    clean = token.lstrip("./") if token.startswith("./") else token
    if clean in resolve:
        return resolve[clean]
    if "/" in clean:
        # The path ends in a listed one at a directory boundary: /testbed/src/a.py.
        parts = clean.split("/")
        for start in range(1, len(parts)):
            tail = "/".join(parts[start:])
            if tail in resolve and "/" in tail:
                return resolve[tail]
    return None


def _claimed_paths(clause: str, resolve: dict[str, str], modified_heading: bool) -> str | None:
    """The first only-read path ``clause`` claims was modified, or ``None``."""
    words: list[tuple[str, bool]] = []  # (word, inside backticks)
    quoted = False
    for raw in clause.split():
        starts_quoted = quoted
        if raw.count("`") % 2:
            quoted = not quoted
        words.append((raw, starts_quoted or raw.startswith("`")))
    verb: str | None = None  # "modify" or "other": the nearest verb before
    neutral = False  # a negation or plan next to the nearest verb
    pending = False  # a negation or plan since that verb, for the next one
    for index, (raw, in_code) in enumerate(words):
        word = raw.strip(_TOKEN_EDGES).rstrip(".").lower()
        if not in_code and not looks_like_path(word):
            if word in _NEUTRALIZERS or word.endswith("n't"):
                pending = neutral = True
                continue
            if word in _MODIFY_VERBS or word in _OTHER_VERBS:
                verb = "modify" if word in _MODIFY_VERBS else "other"
                neutral, pending = pending, False
                continue
        token = raw.strip(_TOKEN_EDGES).rstrip(".")
        if not looks_like_path(token):
            continue
        path = _resolve(token, resolve)
        if path is None:
            continue
        passive = _passive_claim(words, index + 1)
        if passive is not None:
            if passive and not pending:
                return path
            continue
        if verb == "modify" and not neutral:
            return path
        if verb is None and modified_heading and not pending:
            return path
    return None


def _passive_claim(words: Sequence[tuple[str, bool]], start: int) -> bool | None:
    """After a path, "was read" / "has been updated": ``True`` when that verb claims a
    change, ``False`` when it is another verb or negated, ``None`` without one."""
    seen_auxiliary = neutral = False
    for raw, in_code in words[start : start + 5]:
        word = raw.strip(_TOKEN_EDGES).rstrip(".").lower()
        if in_code:
            return None
        if word in _AUXILIARIES:
            seen_auxiliary = True
        elif not seen_auxiliary:
            return None
        elif word in _NEUTRALIZERS or word.endswith("n't"):
            neutral = True
        elif word in _MODIFY_VERBS:
            return not neutral
        elif word in _OTHER_VERBS:
            return False
        elif word not in ("also", "then", "just", "already", "successfully", "only", "been"):
            return None
    return None


def _task_words(text: str) -> list[str]:
    return [
        w
        for w in _WORD.findall(text.lower())
        if len(w) >= MIN_TASK_WORD_LETTERS
        and w.isalpha()
        and w not in _STOPWORDS
        and w not in _TASK_STOPWORDS
    ]


#: Words of four letters or more a task holds whatever it is about.
_TASK_STOPWORDS = frozenset(
    "please make sure should would could will must need want like just also then when "
    "where here some more most only very well into onto over about after before them "
    "these those such been being does done have having were your yours help task user".split()
)


def _stem(word: str) -> str:
    """``word`` without a plural, past or -ing ending, and then a final "e": "tests"
    and "test", "updates" and "updating" compare equal."""
    for ending in ("ing", "ed", "s"):
        if word.endswith(ending) and len(word) - len(ending) >= 3:
            word = word[: -len(ending)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word
