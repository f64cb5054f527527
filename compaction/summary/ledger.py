"""The ledger: facts of a compacted span kept verbatim, computed without an LLM.

A summary's prose is written by a model (or by :mod:`compaction.summary.extractive`)
and may leave out what the agent needs to go on. The ledger is computed by
the engine from the messages it replaces, deterministically, and appended to
every summary after the prose:

* ``<read-files>`` / ``<modified-files>`` — :mod:`compaction.summary.files`, as before;
* ``<errors>`` — the last distinct error lines the span's tool results printed
  (:func:`compaction.text.clipping.error_lines`, test-runner result lines
  included), whole up to :data:`~compaction.text.clipping.KEPT_LINE_CHARS`;
* ``<commands>`` — the commands run, whole up to :data:`COMMAND_CHARS` (a
  multi-line one with its line breaks shown as ``↵``: a heredoc's definitions
  and a ``sed`` script's line numbers are what the agent wrote and will use
  again), each with its exit status when known;
* ``<identifiers>`` — issue and ticket ids, URLs and branch names named by the
  task or by the user, and the names the agent's own turns used: files (with
  a line, ``path:123``), dotted, ``snake_case`` and ``CamelCase`` names as
  written; with a main summary, also those of the agent's turns kept after
  the span whose text the pruner cut (:func:`names_cut_by_pruning`);
* ``<user-messages>`` — every message the user typed in the span, verbatim
  up to :data:`USER_MESSAGE_CHARS`, less what its client added
  (:func:`compaction.chat.typed.typed_messages`: tool observations sent as user
  messages, earlier summaries, ``/compact`` commands and client boilerplate
  are not typed words).

Every block keeps its entries oldest first; the position of an entry is its
recency. An earlier summary's ledger is parsed back and merged in, its
entries older than the span's, and a repeated entry keeps its newest place:
when the budget cannot hold everything, the newest entries win, whether new
or carried over. The file lists keep their own bound
(:data:`~compaction.summary.files.DEFAULT_MAX_FILES`) and are always rendered; the
other blocks share a token budget, ``Profile.ledger_share``
(:data:`DEFAULT_LEDGER_SHARE`) of the summary's.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from compaction.budget.profile import DEFAULT_LEDGER_SHARE, Profile
from compaction.chat.calls import COMMAND_ARGUMENTS, key_argument, shows_files
from compaction.chat.messages import message_text, tool_calls
from compaction.chat.own import is_summary
from compaction.chat.recall import mark, original_text, output_ref, ref_of
from compaction.chat.typed import typed_messages
from compaction.summary.blocks import ENTRY_CLOSE, ENTRY_OPEN, LEDGER_BLOCKS, split_blocks
from compaction.summary.files import (
    FileLists,
    collect_files,
    file_lists_in,
    render_file_lists,
    results_after,
    strip_file_lists,
)
from compaction.summary.steps import exit_code, tool_steps
from compaction.text.cuts import word_cut
from compaction.tokens.counter import TokenCounter
from compaction.types import Message

#: A user message is kept whole up to this many characters, then cut between
#: words with a marker: a pasted log must not take the whole ledger.
USER_MESSAGE_CHARS = 2_000
#: A command is quoted whole up to this many characters, then cut between words.
COMMAND_CHARS = 1_000
#: What stands for a line break inside a quoted command (an entry is one line).
LINE_BREAK = " ↵ "
#: Each block keeps at most this many entries, the newest: a bound on the
#: work of every later compaction, far above what a budget holds.
MAX_ENTRIES = 200
#: Names read from one of the agent's turns, at most: no more than a block
#: holds (the work per turn is bounded by the characters read). Not fewer: a
#: long turn names what it concluded near its end, and the budget, which
#: keeps the newest names first, decides which fit — a count per turn cut
#: off the end of the long turns, whose names were the ones used next.
NAMES_PER_TURN = MAX_ENTRIES

#: The order in which blocks claim their next entry from the budget: the
#: user's own words first (no other record of them is kept), then the
#: identifiers, the errors and the commands; the identifiers thrice a round,
#: since a name is a few tokens and a command can be hundreds.
_CLAIM_ORDER = ("user-messages", "identifiers", "errors", "identifiers", "commands", "identifiers")
#: Entries claimed before any other, in this order: the user's newest message,
#: then the last five distinct error lines (what the next turn is about).
_FIRST_CLAIMS = (("user-messages", 1), ("errors", 5))
_CUT_MARKER = " […{:,} characters cut]"

_ISSUE = re.compile(r"(?<![\w#/&])#\d{1,7}\b")
_TICKET = re.compile(r"\b[A-Z][A-Z0-9]{1,9}-\d{1,7}\b")
_URL = re.compile(r"\bhttps?://[^\s<>()\"'`]{1,300}")
_BRANCH = re.compile(
    r"\bgit\s+(?:checkout\s+-[bB]|switch\s+(?:-[cC]\s+)?)\s*([\w./-]{1,100})"
    r"|\bbranch\s+'([\w./-]{1,100})'"
)
_URL_TRAIL = ".,;:!?"


@dataclass(frozen=True)
class Ledger:
    """What a span did and said, each block oldest first (an entry's place is its recency)."""

    files: FileLists = field(default_factory=FileLists)
    errors: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    identifiers: tuple[str, ...] = ()
    user_messages: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(
            self.files or self.errors or self.commands or self.identifiers or self.user_messages
        )

    def merge(self, later: Ledger) -> Ledger:
        """This ledger followed by ``later``: a repeated entry keeps its newest place."""
        return Ledger(
            self.files.merge(later.files),
            _newest((*self.errors, *later.errors)),
            _newest((*self.commands, *later.commands)),
            _newest((*self.identifiers, *later.identifiers)),
            _newest((*self.user_messages, *later.user_messages)),
        )

    def naming_only_what_is_gone(self, kept: str) -> Ledger:
        """This ledger without the identifiers that ``kept`` (the text of the
        messages kept after the summary, as they are sent) already holds: the
        model reads those where they stand, and the budget they took goes to
        older names, which nothing else keeps."""
        return dataclasses.replace(
            self, identifiers=tuple(name for name in self.identifiers if name not in kept)
        )

    def blocks(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """``(tag, entries)`` of the budgeted blocks, in their fixed order."""
        return (
            ("errors", self.errors),
            ("commands", self.commands),
            ("identifiers", self.identifiers),
            ("user-messages", self.user_messages),
        )


def _newest(entries: Iterable[str]) -> tuple[str, ...]:
    """Each entry once, at its last place, oldest first; at most :data:`MAX_ENTRIES`."""
    seen: dict[str, None] = {}
    for entry in reversed(tuple(entries)):
        if entry not in seen:
            seen[entry] = None
            if len(seen) == MAX_ENTRIES:
                break
    return tuple(reversed(seen))


# --- computing -----------------------------------------------------------------


def ledger_of(
    messages: Sequence[Message],
    profile: Profile,
    previous: Ledger | None = None,
    *,
    task: str = "",
    salt: str = "",
) -> Ledger:
    """The ledger of ``messages`` (a span's originals), folded after ``previous``.

    An earlier summary among ``messages`` has its ledger parsed back and
    merged at its place. ``task`` (the head's first user message) is read for
    identifiers only: the head keeps it verbatim. With a ``salt`` (recall on),
    each command and each file read ends with the ref of the output it
    printed (:mod:`compaction.chat.recall`), so that the model can read it back.
    """
    ledger = previous or Ledger()
    ledger = ledger.merge(Ledger(identifiers=tuple(identifiers_in(task))))
    stretch: list[Message] = []
    for message in messages:
        if is_summary(message):
            ledger = ledger.merge(_stretch_ledger(stretch, profile, salt))
            ledger = ledger.merge(parse_ledger(message_text(message)))
            stretch = []
        else:
            stretch.append(message)
    ledger = ledger.merge(_stretch_ledger(stretch, profile, salt))
    # The file lists compute their own merge order (a modified file is never read).
    found = collect_files(messages, profile, salt=salt)
    files = (previous.files if previous else FileLists()).merge(found)
    return Ledger(
        files.limited(),
        ledger.errors,
        ledger.commands,
        ledger.identifiers,
        ledger.user_messages,
    )


def _stretch_ledger(messages: Sequence[Message], profile: Profile, salt: str = "") -> Ledger:
    """The ledger of messages holding no summary (files are computed by the caller)."""
    if not messages:
        return Ledger()
    errors = errors_in(messages)
    users = typed_messages(messages)
    found_ids = [i for text in users for i in identifiers_in(text)]
    found_ids += [name for message in messages for name in _names_used(message)]
    return Ledger(
        errors=_newest(errors),
        commands=_newest(_commands(messages, salt)),
        identifiers=_newest(found_ids),
        user_messages=_newest(_cap_user("\n".join(text.splitlines())) for text in users),
    )


def errors_in(messages: Sequence[Message]) -> list[str]:
    """The error lines the tool results among ``messages`` printed, in order."""
    return [error for step in tool_steps(messages) for error in step.errors]


def _cap_user(text: str) -> str:
    if len(text) <= USER_MESSAGE_CHARS:
        return text
    kept = word_cut(text, USER_MESSAGE_CHARS)
    return kept + _CUT_MARKER.format(len(text) - len(kept))


def _commands(messages: Sequence[Message], salt: str = "") -> Iterator[str]:
    """``command → exit N`` for each command a tool call ran, in order; with a
    ``salt``, `` [ref: …]`` of its output after (:func:`compaction.chat.recall.output_ref`),
    however short — the summary removed it — and a command cut short carries
    the ref of the agent's message that wrote it, right after the cut."""
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        results = results_after(messages, index)
        for call in tool_calls(message):
            key, value = key_argument(call)
            if key not in COMMAND_ARGUMENTS or not value or shows_files(call):
                continue
            lines = [" ".join(line.split()) for line in value.strip().splitlines()]
            command = LINE_BREAK.join(line for line in lines if line)
            if not command:
                continue
            entry = f"`{command}`"
            if len(command) > COMMAND_CHARS:
                entry = f"`{word_cut(command, COMMAND_CHARS)} …`"
                if salt:
                    entry = mark(entry, ref_of(salt, original_text(message)))
            result = results.get(call.get("id"))
            code = exit_code(message_text(result)) if result is not None else None
            if code is not None:
                entry = f"{entry} → exit {code}"
            ref = output_ref(salt, result, 0) if result is not None else None
            yield entry if ref is None else mark(entry, ref)


def identifiers_in(text: str) -> list[str]:
    """Issue and ticket ids, URLs and branch names in ``text``, in order."""
    text = text[:20_000]  # a task names its identifiers early; bounded work
    found: list[tuple[int, str]] = []
    for match in _URL.finditer(text):
        found.append((match.start(), match.group(0).rstrip(_URL_TRAIL)))
    for pattern in (_ISSUE, _TICKET):
        found.extend((m.start(), m.group(0)) for m in pattern.finditer(text))
    for match in _BRANCH.finditer(text):
        name = (match.group(1) or match.group(2)).rstrip(_URL_TRAIL)
        if name:
            found.append((match.start(), f"branch {name}"))
    inside_urls = [(m.start(), m.end()) for m in _URL.finditer(text)]
    kept = [
        value
        for at, value in sorted(found)
        if value.startswith("http") or not any(s < at < e for s, e in inside_urls)
    ]
    return list(dict.fromkeys(kept))


#: A file is not followed by ``.`` and a letter: ``os.path.basename`` and
#: ``django.utils.translation`` are dotted names, not the files ``os.path`` and
#: ``django.utils`` (whose "extensions" are short words).
_NAME = re.compile(
    r"(?<![\w/.-])(?:[\w.-]*/)*[\w-]+\.[A-Za-z][A-Za-z0-9]{0,4}(?::\d{1,6})?(?![\w/]|\.\w)"
    r"|(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"  # a dotted name
    r"|(?<![\w.])[A-Za-z_]\w{3,}"  # a word, kept if snake_case or CamelCase
)
_CAMEL = re.compile(r"[a-z][A-Z]|[A-Z][a-z]+[A-Z]")
_NAME_CHARS = 120


def _names_used(message: Message) -> list[str]:
    """The names one of the agent's turns used, in order: files (with a line
    when one is given), dotted names, ``snake_case`` and ``CamelCase`` words —
    what it was working with, and so what its next turns are likely to use."""
    if message.get("role") != "assistant":
        return []
    parts = [message_text(message)[:20_000]]
    parts += [str(key_argument(call)[1] or "")[:20_000] for call in tool_calls(message)]
    found: list[str] = []
    for text in parts:
        for match in _NAME.finditer(text):
            # Sentence punctuation off the ends, never an underscore: ``_private``
            # and ``__init__.py`` are names as written (stripped, they name nothing).
            name = match.group(0).strip(".-")
            if 4 <= len(name) <= _NAME_CHARS and (
                "_" in name or "." in name or "/" in name or _CAMEL.search(name)
            ):
                found.append(name)
    return list(dict.fromkeys(found))[:NAMES_PER_TURN]


def names_cut_by_pruning(messages: Sequence[Message], profile: Profile) -> list[str]:
    """The names used by the agent's turns among ``messages`` whose text the
    pruner cuts (a text longer than ``profile.assistant_text_chars`` keeps only
    its start and end). Kept after a summary only as the pruner left them,
    such turns have lost their middle, and the summary's ledger is the one
    place left to name what they worked with."""
    found: list[str] = []
    for message in messages:
        if _cut_by_pruning(message, profile.assistant_text_chars):
            found.extend(_names_used(message))
    return found


def _cut_by_pruning(message: Message, limit: int) -> bool:
    """Whether the pruner cuts ``message``'s text: an assistant message's
    content, or one of its text parts, is longer than ``limit``."""
    if message.get("role") != "assistant":
        return False
    content = message.get("content")
    if isinstance(content, str):
        return len(content) > limit
    if isinstance(content, list):
        return any(
            isinstance(part, dict)
            and isinstance(part.get("text"), str)
            and len(part["text"]) > limit
            for part in content
        )
    return False


# --- rendering and parsing -------------------------------------------------------


def render_ledger(ledger: Ledger, budget_tokens: int, counter: TokenCounter) -> str:
    """The ledger as blocks: the file lists whole, then the budgeted blocks in a fixed
    order, each newest first and holding its newest entries that fit ``budget_tokens``.

    The user's newest message and the five newest error lines claim their
    room first (:data:`_FIRST_CLAIMS`); then entries are taken newest first,
    one from each block in turn (:data:`_CLAIM_ORDER`), so that no block
    crowds the others out. A block stops at its first entry that does not
    fit, so an older entry is never kept over a newer one.
    """
    chosen: dict[str, list[str]] = {tag: [] for tag in LEDGER_BLOCKS}
    queues = {tag: list(reversed(entries)) for tag, entries in ledger.blocks()}
    full: set[str] = set()  # blocks whose next entry did not fit
    used = 0

    def claim(tag: str) -> None:
        nonlocal used
        if tag in full or len(chosen[tag]) >= len(queues[tag]):
            full.add(tag)
            return
        entry = queues[tag][len(chosen[tag])]
        cost = counter.count_text(_entry_text(tag, entry)) + 1
        if not chosen[tag]:
            cost += counter.count_text(f"<{tag}>\n</{tag}>") + 1
        if used + cost > budget_tokens:
            full.add(tag)
            return
        chosen[tag].append(entry)
        used += cost

    for tag, count in _FIRST_CLAIMS:
        for _ in range(count):
            claim(tag)
    while len(full) < len(LEDGER_BLOCKS):
        for tag in _CLAIM_ORDER:
            claim(tag)
    text = _render(ledger.files, chosen)
    # Counted apart, entries may join into fewer tokens than together; the
    # check on the whole drops the oldest entry of the longest block until it fits.
    files_only = counter.count_text(_render(ledger.files, {}))
    while counter.count_text(text) - files_only > budget_tokens and any(chosen.values()):
        longest = max(LEDGER_BLOCKS, key=lambda tag: len(chosen[tag]))
        chosen[longest].pop()
        text = _render(ledger.files, chosen)
    return text


def _entry_text(tag: str, entry: str) -> str:
    if tag != "user-messages":
        return entry
    lines = [f" {line}" if line.strip() == ENTRY_CLOSE else line for line in entry.splitlines()]
    return "\n".join([ENTRY_OPEN, *lines, ENTRY_CLOSE])


def _render(files: FileLists, chosen: dict[str, list[str]]) -> str:
    parts = [render_file_lists(files)] if files else []
    for tag in LEDGER_BLOCKS:
        entries = chosen.get(tag)
        if entries:
            body = "\n".join(_entry_text(tag, entry) for entry in entries)
            parts.append(f"<{tag}>\n{body}\n</{tag}>")
    return "\n".join(parts)


def parse_ledger(text: str) -> Ledger:
    """The ledger rendered in ``text`` (an earlier summary); empty when it has none."""
    found: dict[str, list[str]] = {tag: [] for tag in LEDGER_BLOCKS}
    current: str | None = None
    entry: list[str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if current is None:
            if line.startswith("<") and line.endswith(">") and line[1:-1] in found:
                current = line[1:-1]
            continue
        if line == f"</{current}>" and entry is None:
            current = None
        elif current != "user-messages":
            if line:
                found[current].append(line)
        elif entry is None:
            if line == ENTRY_OPEN:
                entry = []
        elif raw == ENTRY_CLOSE:
            found[current].append("\n".join(entry))
            entry = None
        else:
            entry.append(raw[1:] if raw.strip() == ENTRY_CLOSE else raw)
    # Rendered newest first; kept oldest first.
    return Ledger(
        file_lists_in(text),
        tuple(reversed(found["errors"])),
        tuple(reversed(found["commands"])),
        tuple(reversed(found["identifiers"])),
        tuple(reversed(found["user-messages"])),
    )


def strip_ledger(text: str) -> str:
    """``text`` without its ledger blocks (file lists included): they are recomputed,
    never summarized."""
    kept, _ = split_blocks(text)
    return strip_file_lists("\n".join(kept)).strip()


def ledger_text(text: str) -> str:
    """The ledger blocks of ``text`` as they stand, line for line: what an edit of the
    prose keeps byte for byte."""
    _, blocks = split_blocks(text)
    return "\n".join(blocks)


__all__ = [
    "DEFAULT_LEDGER_SHARE",
    "Ledger",
    "identifiers_in",
    "ledger_of",
    "ledger_text",
    "names_cut_by_pruning",
    "parse_ledger",
    "render_ledger",
    "strip_ledger",
]
