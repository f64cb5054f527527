"""Facts of a conversation by rules of the eval's own, not the summarizers'.

:mod:`evaluation.probes` reads the conversation as the summaries do (the same
file lists, the same error lines), so it scores what they were built to keep.
The rules here are written apart from them and import nothing of
``compaction`` beyond its public API (a test holds it), so a summary that
loses what an agent needs can score low here even where the probes pass:

    fact          drawn from                                    kept when the request holds
    path          every file a tool call read or modified,      the path
                  from the call's arguments (below)
    error         the last :data:`ERROR_COUNT` distinct          the whole line, or its first
                  failure lines of tool outputs (below)           :data:`ERROR_CHARS` characters
    typed         every message the user typed (not a tool       the whole message, or its first
                  observation sent as a user message, not a       :data:`TYPED_CHARS` characters
                  summary)

Presence is verbatim with whitespace collapsed on both sides (as
:func:`evaluation.probes.request_text` collapses it).

**Paths.** A dedicated tool's file argument (``path``, ``file_path``,
``filename``, ``absolute_path``, … or a list under ``paths``/``files``) is a
path as written. A shell command (``command``/``cmd``/``script``) is split
into words by shell rules (heredoc bodies and ``-c``/``-m`` operands are code,
not words); a word is a path when it looks like one with an extension
(``src/a.py``, ``setup.cfg``: without a ``/``, a common file extension, so
``queries.tests`` is a test label; not ``tests/``, ``*.py``, a URL, an option, or
a pytest node's ``::test`` part), except a ``grep``-like command's pattern.
Files without an extension (``Makefile``) are not counted.

**Error lines.** In the output of a tool (a ``tool`` message, or a user
message that is a tool observation), a line states failure when, trimmed, it
is an exception's name and message (``ValueError: …``,
``django.core.exceptions.ImproperlyConfigured: …``, ``…Exception`` alone;
not ``AssertionError raised as expected``), starts with ``Error:``/``error:``,
``FAILED``, ``FAIL:`` or ``ERROR``, is a pytest ``E   `` line, holds
``SyntaxError``, is pytest's or unittest's count of failures
(``3 failed, 68 passed in 4.7s`` — its ``=`` rule is trimmed too), states a
non-zero exit status (``exit code 2``, ``returned non-zero exit status 1``),
or is the last line of a Python traceback. A harness's own status tag
(mini-swe-agent's ``<returncode>1</returncode>``) is not a line the command
printed and does not count, nor does a field that says there was none
(qwen-code's ``Error: (none)``); neither do outputs that show a file
(``cat``, ``head``, ``sed -n``, a read tool), whose lines are source, not
failures.

**Typed messages.** A user message is a tool observation when it starts with
a harness tag (``<returncode>``, ``<output>``, ``<warning>``), is
mini-swe-agent's format complaint (``Please always provide EXACTLY ONE
action …``), is a patch (``diff --git``) or qwen-code's note of files read
before its own compaction; a client's ``<system-reminder>`` blocks are cut
from the text, and what is left (if anything) is what the user typed. A
summary of the proxy's is neither.

Pure functions; nothing here calls a model.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from compaction import (
    SUMMARY_MARKER,
    Message,
    call_name_and_arguments,
    message_text,
    tool_calls,
)

FactKind = Literal["path", "error", "typed"]
FACT_KINDS: tuple[FactKind, ...] = ("path", "error", "typed")

ERROR_COUNT = 5
#: A longer error line is kept when its first this many characters are.
ERROR_CHARS = 120
#: A longer typed message is kept when its first this many characters are.
TYPED_CHARS = 200

_SPACE = re.compile(r"\s+")

_FILE_KEYS = frozenset(
    {
        "path",
        "file",
        "file_path",
        "filepath",
        "filename",
        "absolute_path",
        "target_file",
        "notebook_path",
    }
)
_FILE_LIST_KEYS = frozenset({"paths", "files", "file_paths"})
_COMMAND_KEYS = ("command", "cmd", "script")
#: A word that names a file: no glob, no option, a last part with an extension.
_PATH_WORD = re.compile(r"(?:[\w.@+~-]*/)*[\w@+~-][\w.@+~-]*\.([A-Za-z][A-Za-z0-9_]{0,9})")
#: Without a ``/``, only these extensions make a word a file name; a dotted
#: word such as ``queries.tests`` is a module or test label.
_FILE_EXTENSIONS = frozenset(
    "py pyi pyx pxd txt md rst json jsonl yaml yml toml cfg ini conf env lock log csv tsv "
    "sql xml html htm css scss js mjs cjs ts tsx jsx vue c h cc cpp hpp go rs java kt rb "
    "php sh bash zsh ps1 swift scala tex ipynb patch diff in out".split()
)
#: A heredoc's body (code or text, not words); the rest of its first line stays.
_HEREDOC = re.compile(
    r"<<-?\s*(['\"]?)(\w+)\1([^\n]*)\n.*?(?:^\s*\2\s*$|\Z)", re.DOTALL | re.MULTILINE
)
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&", "(", ")", "\n"})
_CODE_OPTIONS = frozenset({"-c", "-m", "-e", "--eval", "--command"})
_PATTERN_FIRST = frozenset({"grep", "egrep", "fgrep", "rg", "ag", "ack", "git-grep"})
_SHOWS_FILE = frozenset({"cat", "head", "tail", "nl", "less", "more", "bat", "view"})
_READ_TOOL = re.compile(r"read|open|view|cat|show", re.IGNORECASE)

#: An exception's name that opens the line, then its message or nothing.
_EXCEPTION_START = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]*(?:Error|Exception)(?::|$)")
#: An exception of a package's ``exceptions``/``errors`` module, whatever its name.
_MODULE_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?:exceptions|errors)\.[A-Z]\w*:")
_ERROR_START = re.compile(r"^(?:FAILED\b|FAIL:|ERROR\b|[Ee]rror:|E {2,}\S)")
_FAILED_COUNT = re.compile(r"(?:^|[\s,(])\d+ failed(?:,|\s+in\s+\d|$)")
_EXIT_STATUS = re.compile(
    r"(?:exit(?:ed with)? (?:code|status)[:=]?\s*|non-zero exit status\s*)(-?\d+)", re.IGNORECASE
)
_TRACEBACK = "Traceback (most recent call last)"
#: What a traceback's last line says: an exception's name, then maybe its
#: message (not a harness's tag where the output was cut, nor "During handling…").
_RAISED = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::.*)?")
_RULE = re.compile(r"^[=\-_*#\s]+|[=\-_*#\s]+$")

_OBSERVATION_STARTS = (
    "<returncode>",
    "<output>",
    "<warning>",
    "Please always provide EXACTLY ONE action",
    "diff --git",
    "The following files were recently accessed before context was compacted",
)
#: Context a client adds to a user message; not what the user typed.
_REMINDER = re.compile(r"<system-reminder>.*?(?:</system-reminder>|\Z)", re.DOTALL)


@dataclass(frozen=True)
class Fact:
    """One fact of an original conversation and the text that shows it kept."""

    kind: FactKind
    text: str  #: the fact as drawn (the path, the trimmed line, the message)
    needle: str  #: what must be present: the text, or its first characters

    def kept_in(self, haystack: str) -> bool:
        """Whether the fact is in ``haystack`` (a :func:`evaluation.probes.request_text`)."""
        return self.needle in haystack


def collapse(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def draw_facts(messages: Sequence[Message]) -> list[Fact]:
    """The facts of one original conversation, in :data:`FACT_KINDS` order."""
    return [
        *(Fact("path", p, p) for p in touched_paths(messages)),
        *(Fact("error", line, line[:ERROR_CHARS].rstrip()) for line in last_errors(messages)),
        *(Fact("typed", text, text[:TYPED_CHARS].rstrip()) for text in typed_messages(messages)),
    ]


# -- calls ----------------------------------------------------------------------


def _arguments(call: dict[str, object]) -> tuple[str, dict[str, object]]:
    name, raw = call_name_and_arguments(call)
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        parsed = {}
    return name, parsed if isinstance(parsed, dict) else {}


def _calls_by_id(messages: Sequence[Message]) -> dict[str, dict[str, object]]:
    calls: dict[str, dict[str, object]] = {}
    for message in messages:
        for call in tool_calls(message):
            call_id = call.get("id")
            if isinstance(call_id, str):
                calls[call_id] = call
    return calls


def _command(arguments: dict[str, object]) -> str | None:
    for key in _COMMAND_KEYS:
        value = arguments.get(key)
        if isinstance(value, str):
            return value
    return None


def _simple_commands(command: str) -> list[list[str]]:
    """``command`` as a list of simple commands, each a list of words."""
    command = _unquoted_newlines_end_commands(_HEREDOC.sub(r"\3\n", command))
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    commands: list[list[str]] = [[]]
    try:
        for word in lexer:
            if word in _SEPARATORS or set(word) <= set(";&|()"):
                commands.append([])
            else:
                commands[-1].append(word)
    except ValueError:  # an unclosed quote: the words read so far
        pass
    return [words for words in commands if words]


def _unquoted_newlines_end_commands(command: str) -> str:
    """``command`` with each newline outside quotes made a ``;`` (a quoted one
    is part of a word, as in ``python -c '…'``)."""
    out, quote = [], ""
    for char in command:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "\n":
            char = ";"
        out.append(char)
    return "".join(out)


def _path_word(word: str) -> str | None:
    word = word.split("::", 1)[0]
    if word.startswith("./"):
        word = word[2:]
    match = _PATH_WORD.fullmatch(word)
    if "://" in word or match is None:
        return None
    if "/" not in word and match.group(1) not in _FILE_EXTENSIONS:
        return None
    return word


def _command_paths(command: str) -> Iterator[str]:
    for words in _simple_commands(command):
        program = words[0].rsplit("/", 1)[-1]
        pattern_pending = program in _PATTERN_FIRST
        skip_next = False
        for word in words[1:]:
            if skip_next:
                skip_next = False
                continue
            if word in _CODE_OPTIONS:
                skip_next = True
                continue
            if word.startswith("-"):
                if program in _PATTERN_FIRST and word in ("-e", "--regexp"):
                    pattern_pending = False
                continue
            if pattern_pending:
                pattern_pending = False
                continue
            word = word.lstrip("<>&0123456789") if word[:1] in "<>" else word
            path = _path_word(word)
            if path is not None:
                yield path


def _call_paths(call: dict[str, object]) -> Iterator[str]:
    _, arguments = _arguments(call)
    for key, value in arguments.items():
        if key in _FILE_KEYS and isinstance(value, str):
            path = value.strip()
            if path and "\n" not in path:
                yield path[2:] if path.startswith("./") else path
        elif key in _FILE_LIST_KEYS and isinstance(value, list):
            yield from (v.strip() for v in value if isinstance(v, str) and v.strip())
    command = _command(arguments)
    if command is not None:
        yield from _command_paths(command)


def touched_paths(messages: Sequence[Message]) -> list[str]:
    """Every distinct file the conversation's tool calls read or modified, in order."""
    seen: dict[str, None] = {}
    for message in messages:
        for call in tool_calls(message):
            for path in _call_paths(call):
                seen.setdefault(path, None)
    return list(seen)


# -- error lines ----------------------------------------------------------------


def _shows_file(call: dict[str, object] | None) -> bool:
    if call is None:
        return False
    name, arguments = _arguments(call)
    command = _command(arguments)
    if command is None:
        return bool(_READ_TOOL.search(name)) and any(k in _FILE_KEYS for k in arguments)
    commands = _simple_commands(command)
    return bool(commands) and all(_shows_one(words) for words in commands)


def _shows_one(words: list[str]) -> bool:
    program = words[0].rsplit("/", 1)[-1]
    return program in _SHOWS_FILE or (program == "sed" and "-n" in words and "-i" not in words)


def is_error_line(line: str) -> bool:
    """Whether one trimmed line of a tool's output states a failure (the rule above)."""
    if line.startswith("<returncode>") or line.endswith(": (none)"):
        return False  # a harness's status tag; a field saying there was no error
    if _EXCEPTION_START.match(line) or _MODULE_EXCEPTION.match(line) or _ERROR_START.match(line):
        return True
    if "SyntaxError" in line:
        return True
    if _FAILED_COUNT.search(line):
        return True
    status = _EXIT_STATUS.search(line)
    return status is not None and int(status.group(1)) != 0


def error_lines(output: str) -> list[str]:
    """The failure lines of one tool output, trimmed, in order."""
    found: list[str] = []
    lines = output.splitlines()
    in_traceback = False
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if line.startswith(_TRACEBACK):
            in_traceback = True
            continue
        if in_traceback and raw[:1] not in (" ", "\t"):
            in_traceback = False
            if _RAISED.fullmatch(line):
                found.append(line)  # a traceback's last line: what was raised
                continue
        if is_error_line(line):
            trimmed = _RULE.sub("", line) if _FAILED_COUNT.search(line) else line
            found.append(trimmed or line)
    return list(dict.fromkeys(found))


def _observation(message: Message) -> bool:
    return message_text(message).lstrip().startswith(_OBSERVATION_STARTS)


def last_errors(messages: Sequence[Message], count: int = ERROR_COUNT) -> list[str]:
    """The last ``count`` distinct failure lines of the conversation's tool outputs,
    oldest first (whitespace collapsed)."""
    calls = _calls_by_id(messages)
    lines: list[str] = []
    for message in messages:
        role = message.get("role")
        if role in ("tool", "function"):
            call_id = message.get("tool_call_id")
            call = calls.get(call_id) if isinstance(call_id, str) else None
            if _shows_file(call):
                continue
        elif not (role == "user" and _observation(message)):
            continue
        lines.extend(collapse(line) for line in error_lines(message_text(message)))
    last: list[str] = []
    for line in reversed(lines):
        if line not in last:
            last.append(line)
            if len(last) == count:
                break
    return last[::-1]


# -- typed messages ---------------------------------------------------------------


def typed_messages(messages: Sequence[Message]) -> list[str]:
    """Every message the user typed, in order (whitespace collapsed; empty ones left out)."""
    typed = []
    for message in messages:
        if message.get("role") != "user" or _observation(message):
            continue
        # A fixture is text: a summary in it is known by its marker, as the
        # proxy's own would be (the proxy itself trusts only what it stored).
        raw = message_text(message)
        if raw.startswith(SUMMARY_MARKER):
            continue
        text = collapse(_REMINDER.sub(" ", raw))
        if text:
            typed.append(text)
    return typed
