"""Which files a stretch of conversation read and modified, found without an LLM.

The condenser appends these lists to every summary as ``<read-files>`` and
``<modified-files>`` blocks, so that after a compaction the model still knows
what it has looked at and changed. They are computed from the tool calls
alone (docs/compaction.md, "The stages"), deterministically, and carried over from one summary
to the next:

* a tool whose name contains a "modify" word of the profile (``edit_file``,
  ``str_replace``) modifies the file named by its path argument; one with a
  "read" word (``read_file``, ``open``) reads it;
* an editor tool that takes a sub-command (``{"command": "view", "path": …}``)
  is classified by that sub-command;
* a shell tool (``bash``, ``execute``, … with a ``command`` argument) is
  classified by parsing the command line (:mod:`compaction.text.shell`):
  ``cat``/``grep``/``sed -n`` read, ``sed -i``/``>``/``tee``/``mv``/``rm``/
  ``patch`` modify. Best effort: only tokens that look like file paths are kept.

A file that was modified is never listed as read. Order is first-seen.

With recall on (a caller's salt given), a file read keeps the ref of the
newest output that showed it (:mod:`compaction.chat.recall`), rendered after its
path (``src/app.py [ref: r…]``) and parsed back apart from it: paths stay
paths for everything that compares them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction.budget.profile import Profile
from compaction.chat.calls import COMMAND_ARGUMENTS, PATH_ARGUMENTS, parse_arguments
from compaction.chat.messages import call_name_and_arguments, message_text, tool_calls
from compaction.chat.own import is_summary
from compaction.chat.recall import mark, output_ref, ref_suffix, trailing_ref
from compaction.summary.blocks import FILE_BLOCKS, block_lines
from compaction.text.shell import shell_files
from compaction.types import Message

#: Beyond this many entries a list keeps its most recent ones: a session that
#: touched thousands of files must not turn the summary into a file index.
DEFAULT_MAX_FILES = 100

_PATH_ARGUMENTS = (
    *PATH_ARGUMENTS,
    "target_path",
    "source_path",
    "old_path",
    "new_path",
    "notebook_path",
)
_LIST_ARGUMENTS = ("paths", "files", "file_paths")
_SHELL_WORDS = frozenset(
    {"bash", "shell", "sh", "zsh", "execute", "exec", "run", "terminal", "cmd", "powershell"}
)
_COMMAND_ARGUMENTS = (*COMMAND_ARGUMENTS, "script")

_BLOCK_OPEN = re.compile(r"<(read|modified)-files>")
_BLOCK_CLOSE = re.compile(r"</(?:read|modified)-files>")
_NAME_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


@dataclass(frozen=True)
class FileLists:
    """Files read and files modified, each in first-seen order, never both."""

    read: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    #: ``(path, ref)`` of read files whose output has a ref (recall): the newest
    #: few per path, oldest first (:func:`_refs_of`).
    refs: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.read or self.modified)

    def merge(self, later: FileLists) -> FileLists:
        """This list followed by ``later``; a file modified in either is not read."""
        modified = _unique((*self.modified, *later.modified))
        done = set(modified)
        read = _unique(p for p in (*self.read, *later.read) if p not in done)
        return FileLists(read, modified, _refs_of(read, (*self.refs, *later.refs)))

    def limited(self, max_files: int = DEFAULT_MAX_FILES) -> FileLists:
        """At most ``max_files`` of each list, keeping the most recently seen."""
        read = self.read[-max_files:]
        return FileLists(read, self.modified[-max_files:], _refs_of(read, self.refs))


#: Refs a summary's read-files list keeps: the newest few reads of each file
#: (an agent reads a long file in parts, and each part is an output of its
#: own), and of all files together the newest — a ref costs about a dozen
#: tokens in every request that carries the summary.
REFS_PER_FILE = 5
MAX_FILE_REFS = 30


def _refs_of(read: Sequence[str], refs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The newest refs given to the ``read`` paths (:data:`REFS_PER_FILE` each,
    :data:`MAX_FILE_REFS` in all), in the order of ``read``, oldest first per path."""
    given = list(refs)
    if not given:
        return ()
    listed = set(read)
    kept: list[tuple[str, str]] = []
    per_path: dict[str, int] = {}
    for pair in reversed(given):  # newest first
        path = pair[0]
        if path not in listed or pair in kept or per_path.get(path, 0) >= REFS_PER_FILE:
            continue
        per_path[path] = per_path.get(path, 0) + 1
        kept.append(pair)
        if len(kept) >= MAX_FILE_REFS:
            break
    order = {path: i for i, path in enumerate(read)}
    return tuple(sorted(reversed(kept), key=lambda pair: order[pair[0]]))


def _unique(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(paths))


# --- summaries -------------------------------------------------------------


def parse_file_lists(text: str) -> FileLists:
    """The lists carried by an earlier summary's ``<read-files>`` / ``<modified-files>`` blocks."""
    found: dict[str, list[str]] = {"read": [], "modified": []}
    refs: list[tuple[str, str]] = []
    for block in _blocks(text):
        lines = (line.strip() for line in text[block.body_start : block.body_end].splitlines())
        for line in lines:
            marked: list[str] = []
            while (ref := trailing_ref(line)) is not None:
                line = line[: -len(ref_suffix(ref))].rstrip()
                marked.append(ref)
            refs.extend((line, ref) for ref in reversed(marked))
            if line:
                found[block.kind].append(line)
    return FileLists().merge(
        FileLists(_unique(found["read"]), _unique(found["modified"]), tuple(refs))
    )


def file_lists_in(text: str) -> FileLists:
    """The file lists of the ledger in ``text``: its own ``<read-files>`` and
    ``<modified-files>`` blocks only. A text quoted inside the ledger (a user
    message holding ``<modified-files>``) is an entry, not a block of it."""
    lines = [raw for block, raw, _ in block_lines(text) if block in FILE_BLOCKS]
    return parse_file_lists("\n".join(lines))


def render_file_lists(lists: FileLists) -> str:
    """The blocks appended to a summary; an empty list gets no block at all."""
    blocks = []
    refs: dict[str, list[str]] = {}
    for path, ref in lists.refs:
        refs.setdefault(path, []).append(ref)
    read = [functools.reduce(mark, refs.get(path, ()), path) for path in lists.read]
    for tag, paths in (("read-files", read), ("modified-files", lists.modified)):
        if paths:
            blocks.append(f"<{tag}>\n" + "\n".join(paths) + f"\n</{tag}>")
    return "\n".join(blocks)


def strip_file_lists(text: str) -> str:
    """``text`` without its file blocks (they are recomputed, never summarized),
    its other lines as they were.

    A block goes with its lines; where it sat inside a line, the text before
    its opener and the text after its closer each stay a line of their own.
    Joined, they could make a line that opens a block (``<err`` + ``ors>``)
    or hide one that did (``<errors>`` + ``x``), and the summary's sections
    would read differently (:func:`~compaction.summary.blocks.block_lines`).
    """
    kept: list[str] = []
    at = 0
    line_open = False  # whether the text kept so far ends inside a line
    for block in _blocks(text):
        line_open = _keep(kept, text[at : block.start], line_open, after_block=at > 0)
        at = block.end
    if at == 0:
        return text.strip()
    _keep(kept, text[at:], line_open, after_block=True)
    return "".join(kept).strip()


#: What :meth:`str.splitlines` ends a line at.
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _keep(kept: list[str], piece: str, line_open: bool, *, after_block: bool) -> bool:
    """Append ``piece``, the text between two blocks, to ``kept``; whether the
    text kept now ends inside a line.

    The line break that ends a block's last line stays only if it ends a
    kept line's text too; text that followed a closer on its line starts a
    line of its own.
    """
    if after_block and piece:
        if piece[0] in _LINE_BREAKS:
            if not line_open:
                piece = piece[2:] if piece.startswith("\r\n") else piece[1:]
        elif line_open:
            kept.append("\n")
    if not piece:
        return line_open
    kept.append(piece)
    return piece[-1] not in _LINE_BREAKS


@dataclass(frozen=True)
class _Block:
    """Where one file block sits in a text: all of it, and the lines inside."""

    kind: str
    start: int
    body_start: int
    body_end: int
    end: int


def _blocks(text: str) -> Iterator[_Block]:
    """The file blocks of ``text`` in order, each closed by the first closer after it."""
    # Opener and closer are found apart: one regex from opener to closer
    # retries every unclosed opener, scanning to the end each time, which is
    # quadratic in a text repeating the tag. Once an opener has no closer
    # after it, no later opener has one either.
    at = 0
    while opener := _BLOCK_OPEN.search(text, at):
        body_start = opener.end() + text.startswith("\n", opener.end())
        closer = _BLOCK_CLOSE.search(text, body_start)
        if closer is None:
            return
        yield _Block(opener.group(1), opener.start(), body_start, closer.start(), closer.end())
        at = closer.end()


# --- tool calls ------------------------------------------------------------


def collect_files(
    messages: Sequence[Message],
    profile: Profile,
    *,
    max_files: int = DEFAULT_MAX_FILES,
    salt: str = "",
    summaries: Mapping[int, FileLists] | None = None,
) -> FileLists:
    """Files read and modified by the tool calls in ``messages``, merged in order with
    the lists of any earlier summary among them; with a ``salt``, each file read
    with the ref of the output that showed it.

    ``summaries`` holds the lists of the earlier summaries by their index in
    ``messages``, when the caller has read them already; any other summary
    is read here (:func:`file_lists_in`)."""
    # Merging list after list in order comes to: every modified file once, and
    # every read file once unless it was modified; so the paths are gathered
    # first and merged once at the end.
    read: list[str] = []
    modified: list[str] = []
    refs: list[tuple[str, str]] = []
    reader = _CallReader(profile)
    current: str | None = None
    for index, message in enumerate(messages):
        if is_summary(message):
            earlier = summaries.get(index) if summaries else None
            if earlier is None:
                earlier = file_lists_in(message_text(message))
            read.extend(earlier.read)
            modified.extend(earlier.modified)
            refs.extend(earlier.refs)
            continue
        if message.get("role") != "assistant":
            continue
        results = results_after(messages, index)
        calls: list[dict[str, Any]] = list(tool_calls(message))
        function_call = message.get("function_call")
        if isinstance(function_call, dict):
            calls.append(function_call)
        for call in calls:
            action, paths, shell = reader.files(call)
            if shell is not None:
                found = shell
            elif paths:
                found = _as(action, paths) if action else FileLists()
                current = paths[-1]
            elif action == "modified" and current:
                # Editors with an "open file" (SWE-agent's `edit`) name no path.
                found = FileLists(modified=(current,))
            else:
                continue
            output = results.get(call.get("id"))
            found = _drop_missing(found, message_text(output) if output else "")
            read.extend(found.read)
            modified.extend(found.modified)
            ref = output_ref(salt, output, profile.tool_result_chars) if output else None
            if ref is not None and found.read:
                refs.extend((path, ref) for path in found.read)
    lists = FileLists(tuple(read), tuple(modified), tuple(refs))
    return FileLists().merge(lists).limited(max_files)


def results_after(messages: Sequence[Message], index: int) -> dict[Any, Message]:
    """The tool results right after the call at ``index``, by call id.

    Looked up within the group only: real sessions reuse call ids across turns.
    """
    results: dict[Any, Message] = {}
    for i in range(index + 1, len(messages)):  # not a slice: called for every call
        message = messages[i]
        if message.get("role") != "tool":
            break
        results.setdefault(message.get("tool_call_id"), message)
    return results


def _drop_missing(lists: FileLists, result: str) -> FileLists:
    # `cat wrong/path.py` fails with "No such file"; listing it would mislead.
    if "No such file" not in result:
        return lists
    gone = {p for p in (*lists.read, *lists.modified) if f"{p}: No such file" in result}
    if not gone:
        return lists
    return FileLists(
        tuple(p for p in lists.read if p not in gone),
        tuple(p for p in lists.modified if p not in gone),
    )


def files_of_call(call: dict[str, Any], profile: Profile) -> FileLists:
    """What one tool call read and modified."""
    action, paths, shell = _CallReader(profile).files(call)
    if shell is not None:
        return shell
    return _as(action, paths) if action and paths else FileLists()


_CallFiles = tuple[str | None, tuple[str, ...], FileLists | None]


class _CallReader:
    """Reads tool calls with one profile, remembering what it read.

    Agents repeat calls (``git diff``, ``pytest -q``, the same file read
    again) and tool names: each distinct call is parsed once, each distinct
    name classified once.
    """

    def __init__(self, profile: Profile) -> None:
        self._modify = [w for w in map(_name_words, profile.modify_tools) if w]
        self._read = [w for w in map(_name_words, profile.read_tools) if w]
        self._calls: dict[tuple[str, str], _CallFiles] = {}
        self._classes: dict[tuple[str, ...], str | None] = {}

    def files(self, call: dict[str, Any]) -> _CallFiles:
        """``(action, paths named in the arguments, files of a shell command or None)``."""
        name, arguments = call_name_and_arguments(call)
        found = self._calls.get((name, arguments))
        if found is None:
            found = self._calls[(name, arguments)] = self._read_call(name, arguments)
        return found

    def _read_call(self, name: str, arguments: str) -> _CallFiles:
        parsed = parse_arguments(arguments)
        if not isinstance(parsed, dict):
            parsed = {}
        words = _name_words(name)
        command = next(
            (parsed[k] for k in _COMMAND_ARGUMENTS if isinstance(parsed.get(k), str)), None
        )
        if command is not None and _SHELL_WORDS.intersection(words):
            shell = shell_files(command)
            return None, (), FileLists(shell.read, shell.modified)
        paths = _argument_paths(parsed)
        # Editor tools take their action as a sub-command: {"command": "view", "path": …}.
        if command is not None and re.fullmatch(r"[A-Za-z_]+", command):
            action = self._classify(_name_words(command))
            if action is not None:
                return action, paths, None
        return self._classify(words), paths, None

    def _classify(self, words: list[str]) -> str | None:
        key = tuple(words)
        if key not in self._classes:
            self._classes[key] = _classify(words, self._modify, self._read)
        return self._classes[key]


def _as(action: str, paths: Sequence[str]) -> FileLists:
    paths = _unique(paths)
    return FileLists(modified=paths) if action == "modified" else FileLists(read=paths)


def _name_words(name: str) -> list[str]:
    return [w.lower() for w in _NAME_WORDS.findall(name)]


def _matches(words: list[str], wanted: list[str]) -> bool:
    """Whether a tool named ``words`` matches a profile entry of ``wanted`` words."""
    if len(wanted) > 1:
        return any(words[i : i + len(wanted)] == wanted for i in range(len(words)))
    # Short words must match whole ("ls" is not in "tools"); longer ones may
    # start a word ("editor", "reader").
    word = wanted[0]
    if len(word) < 4:
        return word in words
    return any(w.startswith(word) for w in words)


def _classify(words: list[str], modify: list[list[str]], read: list[list[str]]) -> str | None:
    if any(_matches(words, entry) for entry in modify):
        return "modified"
    if any(_matches(words, entry) for entry in read):
        return "read"
    return None


def _argument_paths(arguments: dict[str, Any]) -> tuple[str, ...]:
    paths = [arguments[k] for k in _PATH_ARGUMENTS if isinstance(arguments.get(k), str)]
    for key in _LIST_ARGUMENTS:
        value = arguments.get(key)
        if isinstance(value, list):
            paths.extend(v for v in value if isinstance(v, str))
    return tuple(p.strip() for p in paths if p.strip() and "\n" not in p)
