"""``/compact [instructions]``: compaction on the user's command.

The command is what the user typed in the last user turn of a request
(:func:`compaction.typed_text`): the reminders and context a client puts in
the same message (qwen-code's ``<system-reminder>`` part before the typed
text, Claude Code's after it, Claude Code's record of a custom slash command
that expands to ``/compact …``) do not hide it, and system messages a client
sends after the turn (aider's closing reminder) are instructions, not a turn.
The proxy compacts the history before it, stores the result as a checkpoint,
and answers with a synthetic reply in the request's own API (its dialect's
``manual_reply`` or ``manual_events``) — the model is not called. On later
requests the command and the synthetic reply are removed before anything
else, so the model never sees them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compaction import Message, is_summary, message_text, system_texts, typed_text

if TYPE_CHECKING:
    from proxy.session.conversation import Resolved

COMMAND = "/compact"
#: Every synthetic reply starts with one of these; how later requests find it.
REPLY_PREFIXES = ("Context compacted:", "Nothing to compact:")


#: Roles a client may send after the user's turn without it ending the turn.
_AFTER_TURN = frozenset({"system", "developer"})


#: A JSON string may spell a letter ``\u00XX`` (an ASCII letter is 0x41–0x7a):
#: bytes that do so may hide the word from :func:`may_hold_command`'s search.
_ESCAPED_LETTER = re.compile(rb"\\u00[4-7]")


#: Bodies larger than this are not searched: a search costs about a
#: millisecond per 400 KB, more than finding the command in the last turn and
#: an exchange among the pairs a growing conversation added.
SEARCHED_BYTES = 64 * 1024


def may_hold_command(raw: bytes) -> bool:
    """Whether a request's bytes may hold a ``/compact`` command or an exchange
    one left (:data:`REPLY_PREFIXES`): never ``False`` for one that does. Most
    bodies hold neither word, and are not read for them message by message."""
    if len(raw) > SEARCHED_BYTES:
        return True
    return b"compact" in raw or _ESCAPED_LETTER.search(raw) is not None


@dataclass(frozen=True)
class Command:
    """A ``/compact`` command: where it is, and its instructions ("" when none)."""

    index: int
    instructions: str


def find_command(messages: Sequence[Message]) -> Command | None:
    """The ``/compact`` command typed as the last user turn, else ``None``."""
    index = len(messages) - 1
    while index >= 0 and messages[index].get("role") in _AFTER_TURN:
        index -= 1
    if index < 0 or COMMAND not in message_text(messages[index]):
        # What is typed is cut out of the message's text: a turn whose text has
        # no command anywhere is not one, without finding what was typed.
        return None
    instructions = _instructions(messages[index], system_texts(messages))
    return None if instructions is None else Command(index, instructions)


def _instructions(message: Message, echoes: Sequence[str] = ()) -> str | None:
    text = typed_text(message, echoes)
    if text == COMMAND or text.startswith((COMMAND + " ", COMMAND + "\n")):
        return text[len(COMMAND) :].strip()
    return None


def _is_command(message: Message) -> bool:
    return _instructions(message) is not None


def _is_reply(message: Message) -> bool:
    return message.get("role") == "assistant" and message_text(message).startswith(REPLY_PREFIXES)


def strip_commands(messages: list[Message]) -> list[Message]:
    """``messages`` without earlier ``/compact`` commands and their synthetic replies.

    Returns the same list object when there is nothing to remove.
    """
    drop: set[int] = set()
    for i in range(len(messages) - 1):
        # The role first: this runs over every message of every request.
        if messages[i].get("role") != "user" or messages[i + 1].get("role") != "assistant":
            continue
        # The reply first: finding what was typed reads the whole message.
        if _is_reply(messages[i + 1]) and _is_command(messages[i]):
            drop.update((i, i + 1))
    if not drop:
        return messages
    return [m for i, m in enumerate(messages) if i not in drop]


@dataclass(frozen=True)
class Outcome:
    """What one manual compaction did, in the terms its reply states.

    Every figure is this compaction's, the same the response headers and the
    log line give: ``tokens_before`` is the client's conversation as it came,
    ``tokens_after`` what is sent for it from now on, ``messages`` how many of
    the client's messages the checkpoint made now stands for.
    """

    stage: str
    tokens_before: int
    tokens_after: int
    messages: int | None  #: ``None`` when no reusable checkpoint was made
    #: A new summary was written with the earlier one folded into it.
    folded: bool
    #: An earlier compaction is still what is sent (nothing was done now).
    earlier: bool


def outcome_of(resolved: Resolved) -> Outcome:
    result, made, base = resolved.result, resolved.made, resolved.base
    folded = (
        result.summary is not None
        and base is not None
        and any(is_summary(m) for m in base.replacement)
    )
    return Outcome(
        stage=result.stage,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        messages=made.covered if made is not None else None,
        folded=folded,
        earlier=resolved.checkpoint is not None and made is None,
    )


#: How each stage is told, after the count of messages it stands for.
_DONE = {
    "pruned": "shortened (older tool results and long texts briefed)",
    "condensed": "condensed",
    "truncated": "condensed or removed to fit",
}


def reply_text(outcome: Outcome) -> str:
    """The synthetic reply: what was done now, or that nothing could be."""
    before, after = outcome.tokens_before, outcome.tokens_after
    if outcome.stage in ("none", "reused"):
        text = f"Nothing to compact: the conversation is {before:,} tokens"
        if outcome.earlier:
            text += f", sent as {after:,} tokens over the compaction already made"
        return text + "; nothing more could be condensed."
    text = f"Context compacted: {before:,} → {after:,} tokens"
    done = _DONE.get(outcome.stage, outcome.stage)
    if outcome.messages is not None:
        text += f" ({outcome.messages} messages {done})."
    else:
        text += f" ({done})."
    if outcome.folded:
        text += " The previous summary was folded into the new one."
    return text
