"""The ledger as a record and as text: :class:`Ledger` (each block's entries, oldest
first, merged by recency), written into a summary under a token budget
(:func:`render_ledger`) and read back from an earlier one (:func:`parse_ledger`);
a summary's text without it and its blocks as they stand (:func:`strip_ledger`,
:func:`ledger_text`, or both with the file lists in one reading,
:func:`split_ledger`).

Which lines of a summary are the ledger's is :mod:`compaction.summary.blocks`'
alone to say; this module decides what goes in them. What a span's ledger
holds is computed by :mod:`compaction.summary.ledger`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from compaction.summary.blocks import (
    ENTRY_CLOSE,
    ENTRY_OPEN,
    FILE_BLOCKS,
    LEDGER_BLOCKS,
    block_lines,
    split_blocks,
)
from compaction.summary.files import (
    FileLists,
    parse_file_lists,
    render_file_lists,
    strip_file_lists,
)
from compaction.tokens.counter import TokenCounter

#: Each block keeps at most this many entries, the newest: a bound on the
#: work of every later compaction, far above what a budget holds.
MAX_ENTRIES = 200

#: The order in which blocks claim their next entry from the budget: the
#: user's own words first (no other record of them is kept), then the
#: identifiers, the errors and the commands; the identifiers thrice a round,
#: since a name is a few tokens and a command can be hundreds.
_CLAIM_ORDER = ("user-messages", "identifiers", "errors", "identifiers", "commands", "identifiers")
#: Entries claimed before any other, in this order: the user's newest message,
#: then the last five distinct error lines (what the next turn is about).
_FIRST_CLAIMS = (("user-messages", 1), ("errors", 5))


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
            newest((*self.errors, *later.errors)),
            newest((*self.commands, *later.commands)),
            newest((*self.identifiers, *later.identifiers)),
            newest((*self.user_messages, *later.user_messages)),
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


def newest(entries: Iterable[str]) -> tuple[str, ...]:
    """Each entry once, at its last place, oldest first; at most :data:`MAX_ENTRIES`."""
    seen: dict[str, None] = {}
    for entry in reversed(tuple(entries)):
        if entry not in seen:
            seen[entry] = None
            if len(seen) == MAX_ENTRIES:
                break
    return tuple(reversed(seen))


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
    """The ledger rendered in ``text`` (an earlier summary); empty when it has none.

    Its lines are told apart by :func:`~compaction.summary.blocks.block_lines`,
    the reading every other use of the blocks shares.
    """
    found: dict[str, list[str]] = {tag: [] for tag in LEDGER_BLOCKS}
    file_lines: list[str] = []
    entry: list[str] | None = None  # the lines of the user message being read
    for block, raw, frame in block_lines(text):
        if block is None:
            continue
        if block in FILE_BLOCKS:
            file_lines.append(raw)
        elif block != "user-messages":
            if not frame and (line := raw.strip()):
                found[block].append(line)
        elif frame:
            # Inside an entry, the only frame is its closer.
            if entry is not None:
                found[block].append("\n".join(entry))
                entry = None
            elif raw.strip() == ENTRY_OPEN:
                entry = []
        elif entry is not None:
            entry.append(raw[1:] if raw.strip() == ENTRY_CLOSE else raw)
    # Rendered newest first; kept oldest first.
    return Ledger(
        parse_file_lists("\n".join(file_lines)),
        tuple(reversed(found["errors"])),
        tuple(reversed(found["commands"])),
        tuple(reversed(found["identifiers"])),
        tuple(reversed(found["user-messages"])),
    )


def strip_ledger(text: str) -> str:
    """``text`` without its ledger blocks (file lists included): they are recomputed,
    never summarized."""
    kept, _ = split_blocks(text)
    return _prose(kept)


def ledger_text(text: str) -> str:
    """The ledger blocks of ``text`` as they stand, line for line: what an edit of the
    prose keeps byte for byte."""
    _, blocks = split_blocks(text)
    return "\n".join(blocks)


@dataclass(frozen=True)
class LedgerSplit:
    """A summary's text taken apart along its ledger, in one reading."""

    prose: str  #: the text without its ledger (:func:`strip_ledger`)
    files: FileLists  #: the ledger's file lists (:func:`~compaction.summary.files.file_lists_in`)
    ledger: str  #: the ledger's blocks as they stand (:func:`ledger_text`)


def split_ledger(text: str) -> LedgerSplit:
    """``text``'s prose, file lists and ledger, its lines read once."""
    kept: list[str] = []
    blocks: list[str] = []
    file_lines: list[str] = []
    for block, raw, _ in block_lines(text):
        if block is None:
            kept.append(raw)
            continue
        blocks.append(raw)
        if block in FILE_BLOCKS:
            file_lines.append(raw)
    return LedgerSplit(_prose(kept), parse_file_lists("\n".join(file_lines)), "\n".join(blocks))


def _prose(kept: list[str]) -> str:
    """The lines outside the ledger's blocks as text, less any file block written
    within a line (a model's reply may run one into its prose).

    Stripping such a block leaves the text after its closer a line of its own,
    which may open a ledger block (``…</read-files><errors>``): the lines are
    read once more and those blocks go too. Nothing is left to strip after
    that: no file block opener has a closer after it any longer, and taking
    whole lines away joins none.
    """
    text = "\n".join(kept)
    stripped = strip_file_lists(text)
    if stripped == text.strip():
        return stripped
    prose, _ = split_blocks(stripped)
    return "\n".join(prose).strip()


__all__ = [
    "MAX_ENTRIES",
    "Ledger",
    "LedgerSplit",
    "ledger_text",
    "newest",
    "parse_ledger",
    "render_ledger",
    "split_ledger",
    "strip_ledger",
]
