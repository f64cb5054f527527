"""The summary format: the only module that knows what a summary message looks like.

A summary is a user message standing in for a span of the conversation::

    [CONTEXT CONDENSED — REFERENCE ONLY]          ← SUMMARY_MARKER: how it is recognized
    Summary of 12 earlier messages, condensed …   ← the heading: what it stands for
                                                   ← a blank line
    ## Goal …                                      ← the body: the summarizer's text
                                                   ← a blank line
    <read-files> … </read-files>                   ← the ledger (compaction.summary.ledger),
    <modified-files> … </modified-files>             computed by the proxy, never
    <errors> … <user-messages> …                     summarized: the file lists first

**Known from what the proxy wrote, never from the text.** A client can send
a user message that starts with the marker (harnesses send command output
back as the next user message; a file can hold anything), so the marker
alone proves nothing. A summary is one the engine made in this compaction
(:func:`summary_message`) or one the proxy stored: a
:class:`~compaction.conversation.checkpoints.Checkpoint` marks the messages of its
replacement the proxy wrote as its own when it is built (:mod:`compaction.chat.own`;
:func:`recorded` for one stored before it said which). A message that
reached the engine from the client is a plain ``dict`` whatever its text
says, and is content like any other: never
folded in as the previous summary, never counted as the messages it claims
to stand for.

Four operations, each the inverse of the others' work: make
(:func:`summary_message`), recognize (:func:`is_summary`), parse
(:func:`parse_summary`, :func:`summary_body`, :func:`summary_count`) and edit
(:func:`with_body`, which replaces the body and keeps the heading and the
ledger byte for byte). Anything that reads or changes a summary goes through them, so
a change to the format cannot break one reader silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from compaction.chat.messages import message_text
from compaction.chat.own import SUMMARY_MARKER, is_summary, own
from compaction.summary.files import FileLists, render_file_lists
from compaction.summary.rendering import split_ledger, strip_ledger
from compaction.types import Message

#: A summary's heading starts so (both the span's and a turn prefix's).
_HEADING_START = "Summary of "
#: The heading's count of the client's messages it stands for.
_HEADING_COUNT = re.compile(r"Summary of (?:the first )?(\d+) ")
#: Hidden reasoning some local models put in their replies.
_THINKING_OPEN = re.compile(r"<(think|thinking|reasoning)>", re.IGNORECASE)
_THINKING_CLOSE = {
    tag: re.compile(f"</{tag}>", re.IGNORECASE) for tag in ("think", "thinking", "reasoning")
}


def summary_message(
    body: str,
    *,
    condensed: int,
    files: FileLists | None = None,
    ledger: str | None = None,
    turn_prefix: bool,
) -> Message:
    """The user message that stands in for ``condensed`` of the client's messages
    (:func:`compaction.summary.prompts.stands_for` the span it replaces).

    ``ledger`` is the rendered ledger (:func:`compaction.summary.rendering.render_ledger`,
    the file lists included); without it, the file lists ``files`` alone.
    """
    if ledger is None:
        ledger = render_file_lists(files or FileLists())
    noun = "message" if condensed == 1 else "messages"
    if turn_prefix:
        heading = (
            f"{_HEADING_START}the first {condensed} {noun} of the current turn, condensed to "
            "fit the context window. The request above is still being worked on."
        )
    else:
        heading = (
            f"{_HEADING_START}{condensed} earlier {noun}, condensed to fit the context window. "
            "It is background for what follows, not a new request."
        )
    return own({"role": "user", "content": _render(heading, body, ledger)})


def _render(heading: str, body: str, ledger: str) -> str:
    # The body may not carry ledger blocks of its own: they would be read back
    # as the ledger (a model echoing the blocks it saw, a user pasting them).
    parts = [SUMMARY_MARKER, heading, "", strip_ledger(body)]
    if ledger:
        parts.extend(["", ledger])
    return "\n".join(parts)


def without_thinking(text: str) -> str:
    """``text`` without the hidden reasoning a model may have put in it."""
    # Opener and closer are found apart: one regex from opener to closer
    # retries every unclosed opener, scanning to the end each time, which is
    # quadratic in a reply repeating the tag. A tag with no closer after one
    # opener has none after any later opener, so it is looked for once.
    kept, at, search_from = [], 0, 0
    unclosed: set[str] = set()
    while opener := _THINKING_OPEN.search(text, search_from):
        tag = opener.group(1).lower()
        closer = None if tag in unclosed else _THINKING_CLOSE[tag].search(text, opener.end())
        if closer is None:
            unclosed.add(tag)
            search_from = opener.start() + 1
            continue
        kept.append(text[at : opener.start()])
        at = search_from = closer.end()
    kept.append(text[at:])
    return "".join(kept).strip()


def summary_body(text: str) -> str:
    """The summary text alone: no hidden reasoning, marker, heading or file lists.

    Used on earlier summary messages (to pass them as ``<previous-summary>``)
    and on summarizer replies (a model may copy the marker or the file blocks
    it saw, and some local models emit ``<think>`` sections).
    """
    text = without_thinking(text)
    if text.startswith(SUMMARY_MARKER):
        text = text[len(SUMMARY_MARKER) :].lstrip()
        if text.startswith(_HEADING_START):
            text = text.partition("\n")[2]
    return strip_ledger(text)


def summary_count(message: Message) -> int | None:
    """How many of the client's messages a summary stands for, as its heading
    says; ``None`` for any other message."""
    if not is_summary(message):
        return None
    found = _HEADING_COUNT.search(message_text(message)[:200])
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class SummaryParts:
    """A summary message taken apart: what :func:`summary_message` put together."""

    heading: str  #: the line after the marker (empty when it has none)
    body: str  #: the summarizer's text (or the user's edit of it)
    files: FileLists  #: the proxy's file lists, kept apart from the body
    ledger: str = ""  #: the whole ledger as rendered (file lists included), kept apart


def parse_summary(message: Message) -> SummaryParts | None:
    """The parts of a summary message; ``None`` for any other message."""
    if not is_summary(message):
        return None
    text = message_text(message)[len(SUMMARY_MARKER) :].lstrip()
    heading = ""
    if text.startswith(_HEADING_START):
        heading, _, text = text.partition("\n")
    split = split_ledger(text)
    return SummaryParts(heading, split.prose, split.files, split.ledger)


def with_body(message: Message, body: str) -> Message:
    """The summary ``message`` with ``body`` in place of its text: the marker,
    the heading, the ledger and every other field of the message stay."""
    parts = parse_summary(message)
    if parts is None:
        raise ValueError("not a summary message")
    return own({**message, "content": _render(parts.heading, body, parts.ledger)})
