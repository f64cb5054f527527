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
  the span whose text the pruner cut (:mod:`compaction.summary.names`);
* ``<user-messages>`` — every message the user typed in the span, verbatim
  up to :data:`USER_MESSAGE_CHARS`, less what its client added
  (:func:`compaction.chat.typed.typed_messages`: tool observations sent as user
  messages, earlier summaries, ``/compact`` commands and client boilerplate
  are not typed words).

Every block keeps its entries oldest first; the position of an entry is its
recency (:class:`~compaction.summary.rendering.Ledger`). An earlier summary's
ledger is parsed back and merged in, its entries older than the span's, and
a repeated entry keeps its newest place: when the budget cannot hold
everything, the newest entries win, whether new or carried over. The file lists keep their own bound
(:data:`~compaction.summary.files.DEFAULT_MAX_FILES`) and are always rendered; the
other blocks share a token budget, ``Profile.ledger_share``
(:data:`DEFAULT_LEDGER_SHARE`) of the summary's.

This module gathers a span's entries (:func:`ledger_of`); the names come from
:mod:`compaction.summary.names`, and the record, its rendering under the
budget and its parsing back from :mod:`compaction.summary.rendering`, whose
public names it re-exports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from compaction.budget.profile import DEFAULT_LEDGER_SHARE, Profile
from compaction.chat.calls import COMMAND_ARGUMENTS, key_argument, shows_files
from compaction.chat.messages import message_text, tool_calls
from compaction.chat.own import is_summary
from compaction.chat.recall import mark, original_text, output_ref, ref_of
from compaction.chat.typed import typed_messages
from compaction.summary.files import FileLists, collect_files, results_after
from compaction.summary.names import identifiers_in, names_cut_by_pruning, names_used
from compaction.summary.rendering import (
    Ledger,
    ledger_text,
    newest,
    parse_ledger,
    render_ledger,
    strip_ledger,
)
from compaction.summary.steps import exit_code, tool_steps
from compaction.text.cuts import word_cut
from compaction.types import Message

#: A user message is kept whole up to this many characters, then cut between
#: words with a marker: a pasted log must not take the whole ledger.
USER_MESSAGE_CHARS = 2_000
#: A command is quoted whole up to this many characters, then cut between words.
COMMAND_CHARS = 1_000
#: What stands for a line break inside a quoted command (an entry is one line).
LINE_BREAK = " ↵ "

_CUT_MARKER = " […{:,} characters cut]"


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
    # A session compacted many times carries its summary in every request:
    # each is read once, and its file lists go to the file collection.
    summaries: dict[int, FileLists] = {}
    for index, message in enumerate(messages):
        if is_summary(message):
            parsed = parse_ledger(message_text(message))
            summaries[index] = parsed.files
            ledger = ledger.merge(_stretch_ledger(stretch, profile, salt))
            ledger = ledger.merge(dataclasses.replace(parsed, files=FileLists()))
            stretch = []
        else:
            stretch.append(message)
    ledger = ledger.merge(_stretch_ledger(stretch, profile, salt))
    # The file lists compute their own merge order (a modified file is never read).
    found = collect_files(messages, profile, salt=salt, summaries=summaries)
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
    found_ids += [name for message in messages for name in names_used(message)]
    return Ledger(
        errors=newest(errors),
        commands=newest(_commands(messages, salt)),
        identifiers=newest(found_ids),
        user_messages=newest(_cap_user("\n".join(text.splitlines())) for text in users),
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


__all__ = [
    "DEFAULT_LEDGER_SHARE",
    "Ledger",
    "errors_in",
    "identifiers_in",
    "ledger_of",
    "ledger_text",
    "names_cut_by_pruning",
    "parse_ledger",
    "render_ledger",
    "strip_ledger",
]
