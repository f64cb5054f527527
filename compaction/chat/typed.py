"""What the user typed: a user message less the context its client wrapped around it.

Agent CLIs send more than the user's words as ``user`` messages, and the task a
session pursues (its label, a summary's Goal, the words a model summary is
checked against, the ledger's user messages) is only what a person typed. This
module is the one place that knows the rest by its shape:

* ``<system-reminder>`` blocks anywhere in a text (Claude Code: the date,
  CLAUDE.md, tool notes; qwen-code: the skill listing, the environment);
* whole fragments a harness injects, known by their opening and closing tags
  (Codex: ``<environment_context>``, ``<user_instructions>``, ``# AGENTS.md
  instructions …</INSTRUCTIONS>``, ``<skill>``, ``<turn_aborted>``; Claude
  Code's ``<local-command-stdout>`` and its ``<command-name>`` record of a
  slash command, whose expansion is the text that follows);
* texts a harness sends on its own behalf, known whole (Claude Code's "Tool
  loaded." beside a tool search's result) or by their opening words: file
  listings it re-sends (aider's repository map and chat files, qwen-code's
  list of files read before its own compaction), its warnings and its format
  errors ("Please always provide EXACTLY ONE action…", "I didn't see any
  properly formatted edits…");
* at the start of a conversation, a canned example exchange (aider sends a
  made-up request, "Change the greeting to be more casual", and its answer,
  then "I switched to a new code base…" / "Ok." before the real conversation),
  and canned acknowledgements answering the context a client sent ("Ok, I
  won't try and edit those files without asking first.");
* a client's own instructions appended to the typed words: a closing run of
  paragraphs that repeats a stretch of the conversation's system text (aider,
  for a model it has no settings for, appends the end of its system prompt to
  the current message). Functions given a conversation find its system texts
  themselves; :func:`typed_text` of one message is told them (``echoes``).

Pure functions; nothing here mutates a message. Shapes, not client versions,
decide (docs/clients.md lists what each client sends).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from compaction.chat.messages import HEAD_ROLES, message_text, tool_calls
from compaction.chat.own import SUMMARY_MARKER
from compaction.text.cuts import without_reminders
from compaction.types import Message

#: Whole fragments a harness injects as (or into) a user message: dropped when
#: a text, trimmed, starts with the opener and ends with the closer.
CONTEXT_FRAGMENTS: Final = (
    ("<environment_context>", "</environment_context>"),
    ("<user_instructions>", "</user_instructions>"),
    ("# AGENTS.md instructions", "</INSTRUCTIONS>"),
    ("<INSTRUCTIONS>", "</INSTRUCTIONS>"),
    ("<skill>", "</skill>"),
    ("<turn_aborted>", "</turn_aborted>"),
    ("<subagent_notification>", "</subagent_notification>"),
    ("<local-command-stdout>", "</local-command-stdout>"),
    ("<local-command-caveat>", "</local-command-caveat>"),
)
#: Opening words of texts a harness sends on its own behalf.
HARNESS_PREFIXES: Final = (
    # aider's context messages (each answered by a canned "Ok…").
    "I have *added these files to the chat*",
    "Here are summaries of some files present in my git repository.",
    "Here are some READ ONLY files, provided for your reference.",
    "I am not sharing any files that you can edit yet.",
    "Don't try and edit any existing code without asking me to add the files to the chat!",
    # aider's and mini-swe-agent's answers to a reply in the wrong format.
    "I didn't see any properly formatted edits in your reply?!",
    "Please always provide EXACTLY ONE action in triple backticks",
    # qwen-code after its own compaction.
    "The following files were recently accessed before context was compacted.",
    # Codex's warnings.
    "Warning: The maximum number of unified exec processes you can keep open is",
    "Warning: apply_patch was requested via ",
)
#: Whole texts a harness puts beside a tool's result on its own behalf (Claude
#: Code 2.1.197 adds "Tool loaded." next to a ``ToolSearch`` result): matched
#: whole, as a person may well start a message with the same words.
HARNESS_TEXTS: Final = frozenset({"Tool loaded."})
#: What a client's assistant turn says to acknowledge context it sent itself.
ACKNOWLEDGEMENTS: Final = frozenset(
    {
        "Ok.",
        "Ok, I won't try and edit those files without asking first.",
        "Ok, any changes I propose will be to those files.",
        "Ok, I will use these files as references.",
        "Ok, I will use these images as references.",
        "Ok, based on your requests I will suggest which files need to be edited and then"
        " stop and wait for your approval.",
        "Got it. Thanks for the context!",
        "Got it. Thanks for the additional context!",
    }
)
#: The user message that closes aider's example exchange (answered by "Ok.").
EXAMPLE_CLOSER: Final = "I switched to a new code base."
#: How far after the leading system messages a canned example exchange may end:
#: aider's hold four messages or fewer before the closer.
EXAMPLE_SCAN: Final = 12

#: A closing run of paragraphs is the client's own instructions, not typed,
#: when at least this much of it repeats one of the conversation's system texts.
ECHO_MIN_CHARS: Final = 200
#: Only the end of a text this long is searched for such an echo.
ECHO_SCAN_CHARS: Final = 16_000
#: How much of a text's end must appear in a system text before any paragraph
#: is compared: one substring search per system text rules out almost all.
_ECHO_PROBE_CHARS: Final = 64

#: Claude Code's record of a slash command the user ran (its expansion, when
#: a custom command has one, follows as text of its own).
_COMMAND_MARKUP = re.compile(
    r"(?:\s*<command-(message|name|args)>[^<]*</command-\1>)+\s*", re.DOTALL
)
_OBSERVATION = re.compile(r"<returncode>|<output>|^OBSERVATION:|^Observation:", re.MULTILINE)
_COMPACT_COMMAND = re.compile(r"^\s*/compact\b")
#: Only this much of a text is searched for an observation's tags.
_OBSERVATION_SCAN = 2_000


def system_texts(messages: Sequence[Message]) -> tuple[str, ...]:
    """The texts of ``messages``' system and developer messages: what a client
    may repeat at the end of a user message (:data:`ECHO_MIN_CHARS`)."""
    texts = (message_text(m) for m in messages if m.get("role") in HEAD_ROLES)
    return tuple(text for text in texts if len(text) >= ECHO_MIN_CHARS)


def _without_echo(text: str, echoes: Sequence[str]) -> str:
    """``text`` less a closing run of paragraphs found in one of ``echoes``."""
    if not echoes or len(text) < ECHO_MIN_CHARS:
        return text
    probe = text[-_ECHO_PROBE_CHARS:]
    if not any(probe in echo for echo in echoes):
        return text
    at = text.find("\n\n", max(0, len(text) - ECHO_SCAN_CHARS))
    while at != -1 and len(text) - at >= ECHO_MIN_CHARS:
        tail = text[at:].strip()
        if len(tail) >= ECHO_MIN_CHARS and any(tail in echo for echo in echoes):
            return text[:at].rstrip()
        at = text.find("\n\n", at + 2)
    return text


def typed_part(text: str, echoes: Sequence[str] = ()) -> str:
    """``text`` (one text part of a user message) less what its client added; "" when
    it is all context. ``echoes`` are the conversation's system texts (:func:`system_texts`)."""
    text = _without_echo(without_reminders(text).strip(), echoes)
    if (
        not text
        or text in HARNESS_TEXTS
        or text.startswith(HARNESS_PREFIXES)
        or _COMMAND_MARKUP.fullmatch(text)
    ):
        return ""
    for opener, closer in CONTEXT_FRAGMENTS:
        if text.startswith(opener) and text.endswith(closer):
            return ""
    return text


def typed_text(message: Message, echoes: Sequence[str] = ()) -> str:
    """What a person typed in ``message``: "" for any other role, a summary the
    proxy wrote or a text posing as one, a tool result or observation sent as a
    user message, or a message that is all context. ``echoes``: the
    conversation's system texts (:func:`system_texts`), which a client may
    repeat after the typed words."""
    # Not only the proxy's own summaries: a text that starts with the proxy's
    # marker and is not its own (a summary pasted back, a file posing as one)
    # was not typed by a person either, and its Goal is no request.
    if message.get("role") != "user" or message_text(message).startswith(SUMMARY_MARKER):
        return ""
    content = message.get("content")
    if isinstance(content, list):
        if any(isinstance(p, dict) and p.get("type") == "tool_result" for p in content):
            return ""
        texts = [p.get("text") if isinstance(p, dict) else p for p in content]
        parts = [typed_part(t, echoes) for t in texts if isinstance(t, str)]
        text = "\n".join(p for p in parts if p)
    else:
        text = typed_part(message_text(message), echoes)
    if _OBSERVATION.search(text[:_OBSERVATION_SCAN]):
        return ""
    return text


def typed_messages(messages: Sequence[Message]) -> list[str]:
    """The typed texts of ``messages``' user messages, in order, after the
    client's context (:func:`context_end`); ``/compact`` commands are
    instructions to the proxy, not the conversation's words."""
    echoes = system_texts(messages)
    texts = (typed_text(message, echoes) for message in messages[context_end(messages, echoes) :])
    return [text for text in texts if text and not _COMPACT_COMMAND.match(text)]


def first_typed(
    messages: Sequence[Message],
    echoes: Sequence[str] | None = None,
    context: int | None = None,
) -> str:
    """The task: the first text a person typed, after the client's context
    (:func:`context_end`); "" when there is none. ``echoes`` and ``context``:
    the conversation's system texts and where its context ends, when the
    caller has them already (a conversation's reading keeps both)."""
    if echoes is None:
        echoes = system_texts(messages)
    start = context_end(messages, echoes) if context is None else context
    # By index: a slice would copy the whole history to read its first turns.
    for index in range(start, len(messages)):
        text = typed_text(messages[index], echoes)
        if text:
            return text
    return ""


def context_end(messages: Sequence[Message], echoes: Sequence[str] | None = None) -> int:
    """Index past the client's context at the start of ``messages``: system and
    developer messages, user messages holding only context, with the canned
    acknowledgement answering them, and a canned example exchange. ``echoes``:
    the conversation's system texts, when the caller has them already."""
    i = 0
    if echoes is None:
        echoes = system_texts(messages)
    while i < len(messages):
        message = messages[i]
        if message.get("role") in HEAD_ROLES:
            i += 1
        elif _is_context(message, echoes):
            i += 2 if i + 1 < len(messages) and _acknowledges(messages[i + 1]) else 1
        elif (end := _example_end(messages, i)) is not None:
            i = end
        else:
            break
    return i


def _is_context(message: Message, echoes: Sequence[str]) -> bool:
    """A user message of text only, all of it context (an image is the user's)."""
    if message.get("role") != "user":
        return False
    content = message.get("content")
    if isinstance(content, list) and not all(
        isinstance(p, dict) and p.get("type") in ("text", "input_text") for p in content
    ):
        return False
    return bool(message_text(message).strip()) and not typed_text(message, echoes)


def _acknowledges(message: Message) -> bool:
    return (
        message.get("role") == "assistant"
        and not tool_calls(message)
        and message_text(message).strip() in ACKNOWLEDGEMENTS
    )


def _example_end(messages: Sequence[Message], start: int) -> int | None:
    """Index past a canned example exchange opening at ``start``: plain user and
    assistant turns closed by :data:`EXAMPLE_CLOSER` and its acknowledgement."""
    for i in range(start, min(start + EXAMPLE_SCAN, len(messages) - 1)):
        message = messages[i]
        if message.get("role") not in ("user", "assistant") or tool_calls(message):
            return None
        if (
            message.get("role") == "user"
            and message_text(message).strip().startswith(EXAMPLE_CLOSER)
            and _acknowledges(messages[i + 1])
        ):
            return i + 2
    return None
