"""Whether a model's summary contradicts what the engine computed from its span.

A summary may leave out what the ledger carries; it must not say the
opposite of it, nor claim what the span did not do. Each of these makes the
condenser refuse a model's summary for the extractive one
(:func:`contradiction_problem`):

* **a file named as modified that the span only read**
  (:func:`modified_claim_problem`): the claim is the past-tense modify verb
  nearest before the path in its clause (or a passive one right after it),
  negations, conditions and plans aside;
* **a file named as modified that no tool call of the span touched**
  (:func:`untouched_claim_problem`, the same claim): an edit the span never
  made, as a small model reports a ``sed`` that printed or failed;
* **a request credited to the user that the user never made**
  (:func:`credited_request_problem`): "the user asked to push the branch"
  when no word of it is in what the user typed;
* **a dropped goal** (:func:`goal_problem`): the Goal section is empty or
  shares no content word with the task (:func:`task_of`: the user's own
  words of the head's first message, or the Goal of the summaries folded in).

Pure functions, linear in the reply and the task.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from compaction.chat.typed import first_typed, typed_messages
from compaction.summary.checks import BULLET, STOPWORDS, WORD, file_name
from compaction.summary.files import FileLists
from compaction.text.shell import looks_like_path
from compaction.types import Message

#: A task with fewer content words than this says too little to check a Goal against.
MIN_TASK_WORDS = 3
#: A request credited to the user is checked when it has this many content words or more.
MIN_CREDITED_WORDS = 2
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
#: What makes a token a file for :func:`untouched_claim_problem`: a short lowercase
#: extension on its last part (``src/app.py``, ``setup.cfg``; not ``config.DEFAULTS``,
#: not a directory such as ``/testbed``).
_FILE_LIKE = re.compile(r"(?:^|/)[\w.-]*\w\.[a-z][a-z0-9]{0,4}$")
#: Verbs that credit what follows them to the user as a request.
_ASKING = frozenset(
    "asked asks requested requests wants wanted instructed told wished insisted demanded".split()
)
_TOKEN_EDGES = "`'\"()[]{}<>,:;!?*_"
_HEADING_MARKS = "#*_ \t"


@dataclass(frozen=True)
class SpanFacts:
    """What the engine computed from a span that a model's summary must not contradict:
    the files it read and modified (:func:`compaction.summary.files.collect_files`), and the
    task the conversation pursues (the head's first user message, or the Goal of the
    summary being folded in). ``check_goal`` is off for a turn-prefix note, which has
    no Goal section."""

    files: FileLists = field(default_factory=FileLists)
    task: str = ""
    check_goal: bool = True
    #: What the user typed: the task, the span's typed messages, the current
    #: request of a turn. Empty: requests credited to the user are not checked.
    requests: str = ""


def task_of(head: Sequence[Message], previous: Sequence[str], *, task: str | None = None) -> str:
    """The task a summary's Goal restates: the first words typed in the head
    (:func:`compaction.chat.typed.first_typed`: not the client's context or canned
    examples; ``task`` when the caller has read them already), or, when the
    head has none, the Goal sections of the summaries being folded in."""
    task = first_typed(head) if task is None else task
    if task:
        return task
    return "\n".join(line for text in previous for line in summary_section(text, "goal"))


def requests_of(
    head: Sequence[Message],
    span: Sequence[Message],
    previous: Sequence[str],
    request: str | None = None,
) -> str:
    """What the user asked for, in their own words, as far as a summary of
    ``span`` can know: what was typed in the head and the span, the current
    request of a turn, and the Goal sections of the summaries folded in."""
    goals = [line for text in previous for line in summary_section(text, "goal")]
    return "\n".join([*typed_messages(head), *typed_messages(span), request or "", *goals])


def contradiction_problem(reply: str, facts: SpanFacts) -> str | None:
    """Why ``reply`` contradicts what the engine computed from its span, or ``None``:
    it names as modified a file the span only read (:func:`modified_claim_problem`),
    or it drops the goal (:func:`goal_problem`)."""
    problem = modified_claim_problem(reply, facts.files)
    problem = problem or untouched_claim_problem(reply, facts.files)
    if problem is None and facts.check_goal:
        problem = goal_problem(reply, facts.task)
    if problem is None and facts.requests:
        problem = credited_request_problem(reply, facts.requests)
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
    known = _path_resolver(only_read, files.modified)
    claimed = _first_claim(reply, lambda token: _resolve(token, known))
    if claimed is not None:
        return f"names `{claimed}` as modified, but the span only read it"
    return None


def untouched_claim_problem(reply: str, files: FileLists) -> str | None:
    """Why ``reply`` says a file was modified that no tool call of the span read
    or modified, or ``None``: a claim as :func:`modified_claim_problem` reads
    one, of a file (a short lowercase extension on its last part:
    ``config/app.py``, ``setup.cfg``; not ``config.DEFAULTS`` or a directory)
    that is not a listed path, the end of one, or one's last part. The lists hold the
    earlier summaries' too, so an edit reported before is no invention."""
    # Listed paths as a summary's words are read: cut at blanks, quotes and
    # punctuation stripped ("my notes.md", "a.py:" are named "notes.md", "a.py").
    touched = {
        piece.strip(_TOKEN_EDGES).rstrip(".").lstrip("./")
        for path in (*files.read, *files.modified)
        for piece in (path, *path.split())
    }
    known = {path: path for path in touched if path}
    names = {file_name(path) for path in known}

    def untouched(token: str) -> str | None:
        if not _FILE_LIKE.search(token):
            return None
        if _resolve(token, known) is not None or file_name(token) in names:
            return None
        return token

    claimed = _first_claim(reply, untouched)
    if claimed is not None:
        return f"names `{claimed}` as modified, but no tool call of the span touched it"
    return None


def credited_request_problem(reply: str, requests: str) -> str | None:
    """Why ``reply`` credits the user with a request the user never made, or ``None``.

    A clause where "user" is followed, within two words, by a verb of asking
    ("the user asked to …", "User requested …", "the user wants …") credits
    the user with what follows it. When that holds :data:`MIN_CREDITED_WORDS`
    content words or more and not one of them is a word of ``requests`` (what
    the user typed, compared as :func:`goal_problem` compares), the request
    is the summary's own: a small model's "the user asked to commit, push
    and open a PR".
    """
    said = {_stem(w) for w in _task_words(requests)}
    for line in reply.splitlines():
        for clause in _CLAUSE_SPLIT.split(line):
            words = WORD.findall(clause.lower())
            for i, word in enumerate(words):
                if word not in ("user", "users"):
                    continue
                verb = next(
                    (j for j in range(i + 1, min(i + 4, len(words))) if words[j] in _ASKING),
                    None,
                )
                if verb is None:
                    continue
                credited = {_stem(w) for w in _task_words(" ".join(words[verb + 1 :]))}
                if len(credited) >= MIN_CREDITED_WORDS and not credited & said:
                    quote = " ".join(clause.split())[:80]
                    return f"credits the user with a request the user never made ({quote!r})"
    return None


def _first_claim(reply: str, resolve: Callable[[str], str | None]) -> str | None:
    """The first path ``reply`` claims was modified, as ``resolve`` names it (a
    path it does not name claims nothing): see :func:`modified_claim_problem`."""
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
                return claimed
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
    said = {_stem(w) for w in WORD.findall(" ".join(goal).lower())}
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
    unbulleted = BULLET.sub("", stripped, count=1)
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
    taken = {file_name(path) for path in modified}
    found: dict[str, str] = {}
    names: dict[str, set[str]] = {}
    for path in only_read:
        clean = path.strip("'\"").lstrip("./")
        found[clean] = path
        names.setdefault(file_name(clean), set()).add(path)
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


def _claimed_paths(
    clause: str, resolve: Callable[[str], str | None], modified_heading: bool
) -> str | None:
    """The first path ``resolve`` names that ``clause`` claims was modified, or ``None``."""
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
        path = resolve(token)
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
        for w in WORD.findall(text.lower())
        if len(w) >= MIN_TASK_WORD_LETTERS
        and w.isalpha()
        and w not in STOPWORDS
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
