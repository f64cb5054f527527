"""Which files a stretch of conversation read and modified, found without an LLM.

The condenser appends these lists to every summary as ``<read-files>`` and
``<modified-files>`` blocks, so that after a compaction the model still knows
what it has looked at and changed. They are computed from the tool calls
alone (DESIGN.md §5.2), deterministically, and carried over from one summary
to the next:

* a tool whose name contains a "modify" word of the profile (``edit_file``,
  ``str_replace``) modifies the file named by its path argument; one with a
  "read" word (``read_file``, ``open``) reads it;
* an editor tool that takes a sub-command (``{"command": "view", "path": …}``)
  is classified by that sub-command;
* a shell tool (``bash``, ``execute``, … with a ``command`` argument) is
  classified by parsing the command line: ``cat``/``grep``/``sed -n`` read,
  ``sed -i``/``>``/``tee``/``mv``/``rm``/``patch`` modify. Best effort: only
  tokens that look like file paths are kept.

A file that was modified is never listed as read. Order is first-seen.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from compaction.messages import (
    call_name_and_arguments,
    is_summary,
    message_text,
    parse_arguments,
    tool_calls,
)
from compaction.profile import Profile
from compaction.types import Message

#: Beyond this many entries a list keeps its most recent ones: a session that
#: touched thousands of files must not turn the summary into a file index.
DEFAULT_MAX_FILES = 100

_PATH_ARGUMENTS = (
    "path",
    "file_path",
    "filepath",
    "file",
    "filename",
    "target_file",
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
_COMMAND_ARGUMENTS = ("command", "cmd", "script")

_BLOCK = re.compile(r"<(read|modified)-files>\n?(.*?)</(?:read|modified)-files>", re.DOTALL)
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9_+-]{0,9}$")
_UNSAFE = re.compile(r"[\s$*?{}\[\]<>|;&()'\"`\\=,]")
_NAME_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


@dataclass(frozen=True)
class FileLists:
    """Files read and files modified, each in first-seen order, never both."""

    read: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.read or self.modified)

    def merge(self, later: FileLists) -> FileLists:
        """This list followed by ``later``; a file modified in either is not read."""
        modified = _unique((*self.modified, *later.modified))
        done = set(modified)
        read = _unique(p for p in (*self.read, *later.read) if p not in done)
        return FileLists(read, modified)

    def limited(self, max_files: int = DEFAULT_MAX_FILES) -> FileLists:
        """At most ``max_files`` of each list, keeping the most recently seen."""
        return FileLists(self.read[-max_files:], self.modified[-max_files:])


def _unique(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(paths))


# --- summaries -------------------------------------------------------------


def parse_file_lists(text: str) -> FileLists:
    """The lists carried by an earlier summary's ``<read-files>`` / ``<modified-files>`` blocks."""
    found: dict[str, list[str]] = {"read": [], "modified": []}
    for match in _BLOCK.finditer(text):
        lines = (line.strip() for line in match.group(2).splitlines())
        found[match.group(1)].extend(line for line in lines if line)
    return FileLists().merge(FileLists(_unique(found["read"]), _unique(found["modified"])))


def render_file_lists(lists: FileLists) -> str:
    """The blocks appended to a summary; an empty list gets no block at all."""
    blocks = []
    for tag, paths in (("read-files", lists.read), ("modified-files", lists.modified)):
        if paths:
            blocks.append(f"<{tag}>\n" + "\n".join(paths) + f"\n</{tag}>")
    return "\n".join(blocks)


def strip_file_lists(text: str) -> str:
    """``text`` without its file blocks (they are recomputed, never summarized)."""
    return _BLOCK.sub("", text).strip()


# --- tool calls ------------------------------------------------------------


def collect_files(
    messages: Sequence[Message], profile: Profile, *, max_files: int = DEFAULT_MAX_FILES
) -> FileLists:
    """Files read and modified by the tool calls in ``messages``, merged in order with
    the lists of any earlier summary among them."""
    lists = FileLists()
    current: str | None = None
    for index, message in enumerate(messages):
        if is_summary(message):
            lists = lists.merge(parse_file_lists(message_text(message)))
            continue
        if message.get("role") != "assistant":
            continue
        results = results_after(messages, index)
        calls: list[dict[str, Any]] = list(tool_calls(message))
        function_call = message.get("function_call")
        if isinstance(function_call, dict):
            calls.append(function_call)
        for call in calls:
            action, paths, shell = _call_files(call, profile)
            if shell is not None:
                found = shell
            elif paths:
                found = _as(action, paths) if action else FileLists()
                current = paths[-1]
            elif action == "modified" and current:
                # Editors with an "open file" (SWE-agent's `edit`) name no path.
                found = FileLists(modified=(current,))
            else:
                found = FileLists()
            result = results.get(call.get("id"), "")
            lists = lists.merge(_drop_missing(found, result))
    return lists.limited(max_files)


def results_after(messages: Sequence[Message], index: int) -> dict[Any, str]:
    """The texts of the tool results right after the call at ``index``, by call id.

    Looked up within the group only: real sessions reuse call ids across turns.
    """
    results: dict[Any, str] = {}
    for message in messages[index + 1 :]:
        if message.get("role") != "tool":
            break
        results.setdefault(message.get("tool_call_id"), message_text(message))
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
    action, paths, shell = _call_files(call, profile)
    if shell is not None:
        return shell
    return _as(action, paths) if action and paths else FileLists()


def _call_files(
    call: dict[str, Any], profile: Profile
) -> tuple[str | None, list[str], FileLists | None]:
    """``(action, paths named in the arguments, files of a shell command or None)``."""
    name, arguments = call_name_and_arguments(call)
    parsed = parse_arguments(arguments)
    if not isinstance(parsed, dict):
        parsed = {}
    words = _name_words(name)
    command = next((parsed[k] for k in _COMMAND_ARGUMENTS if isinstance(parsed.get(k), str)), None)
    if command is not None and _SHELL_WORDS.intersection(words):
        return None, [], shell_files(command)
    paths = _argument_paths(parsed)
    # Editor tools take their action as a sub-command: {"command": "view", "path": …}.
    if command is not None and re.fullmatch(r"[A-Za-z_]+", command):
        action = _classify(_name_words(command), profile)
        if action is not None:
            return action, paths, None
    return _classify(words, profile), paths, None


def _as(action: str, paths: Sequence[str]) -> FileLists:
    paths = _unique(paths)
    return FileLists(modified=paths) if action == "modified" else FileLists(read=paths)


def _name_words(name: str) -> list[str]:
    return [w.lower() for w in _NAME_WORDS.findall(name)]


def _matches(words: Sequence[str], entry: str) -> bool:
    wanted = _name_words(entry)
    if not wanted:
        return False
    if len(wanted) > 1:
        return any(words[i : i + len(wanted)] == wanted for i in range(len(words)))
    # Short words must match whole ("ls" is not in "tools"); longer ones may
    # start a word ("editor", "reader").
    word = wanted[0]
    if len(word) < 4:
        return word in words
    return any(w.startswith(word) for w in words)


def _classify(words: Sequence[str], profile: Profile) -> str | None:
    if any(_matches(words, entry) for entry in profile.modify_tools):
        return "modified"
    if any(_matches(words, entry) for entry in profile.read_tools):
        return "read"
    return None


def _argument_paths(arguments: dict[str, Any]) -> list[str]:
    paths = [arguments[k] for k in _PATH_ARGUMENTS if isinstance(arguments.get(k), str)]
    for key in _LIST_ARGUMENTS:
        value = arguments.get(key)
        if isinstance(value, list):
            paths.extend(v for v in value if isinstance(v, str))
    return [p.strip() for p in paths if p.strip() and "\n" not in p]


def looks_like_path(token: str) -> bool:
    """A token that names a file: a ``/`` or an extension, and nothing a shell would expand."""
    if not token or token.startswith("-") or _UNSAFE.search(token) or "://" in token:
        return False
    if token in (".", "..", "/") or token.endswith("/") or token.startswith("/dev/"):
        return False
    return "/" in token or bool(_EXTENSION.search(token))


# --- shell commands --------------------------------------------------------

_HEREDOC = re.compile(r"(?<!<)<<-?(?!<)\s*\\?(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_PY_OPEN_WRITE = re.compile(
    r"""open\(\s*[rbfu]?['"]([^'"\n]+)['"]\s*,\s*(?:mode\s*=\s*)?['"][rbt+]*[wax]"""
)
_PY_PATH_WRITE = re.compile(r"""Path\(\s*['"]([^'"\n]+)['"]\s*\)\.write_(?:text|bytes)\(""")
_DIFF_TARGET = re.compile(r"^\+\+\+ (?:[ab]/)?(\S+)", re.MULTILINE)
_FALLBACK_TOKENS = re.compile(r"[^\s;&|<>()]+|[;&|<>()]+")
_SEPARATOR_CHARS = frozenset(";&|()")
_PREFIX_COMMANDS = frozenset({"sudo", "env", "time", "nohup", "command", "builtin", "exec"})
_IN_PLACE = re.compile(r"-[a-zA-Z]*i|--in-place")
_READERS = frozenset({"cat", "less", "more", "nl", "wc", "file", "stat", "bat", "diff"})
_MODIFIERS = frozenset({"tee", "touch", "rm", "mv", "unlink", "truncate", "dos2unix"})
_VALUE_OPTIONS: dict[str, frozenset[str]] = {
    "head": frozenset({"-n", "-c", "--lines", "--bytes"}),
    "tail": frozenset({"-n", "-c", "--lines", "--bytes"}),
    "grep": frozenset({"-e", "-f", "-m", "-A", "-B", "-C", "--regexp", "--file"}),
    "rg": frozenset({"-e", "-f", "-m", "-A", "-B", "-C", "-g", "-t", "--glob", "--type"}),
    "sed": frozenset({"-e", "-f", "-l", "--expression", "--file"}),
    "awk": frozenset({"-f", "-v", "-F"}),
    "perl": frozenset({"-e", "-E", "-M", "-I"}),
    "touch": frozenset({"-d", "-t", "-r"}),
    "truncate": frozenset({"-s", "-r"}),
    "mv": frozenset({"-t", "-S"}),
    "cp": frozenset({"-t", "-S"}),
    "patch": frozenset({"-i", "-o", "-p", "-d", "-D", "-r", "-B", "-F", "-V", "--input"}),
    "git": frozenset({"-C", "-c", "--git-dir", "--work-tree", "-s", "--source", "-b", "-B"}),
    "python": frozenset({"-c", "-m", "-W", "-X"}),
}


@dataclass
class _Command:
    words: list[str]
    redirects: list[tuple[str, str]]
    heredocs: list[int]  # indices into the heredoc bodies, in order


@dataclass
class _Args:
    positional: list[str]
    options: dict[str, str | None]
    after_dashes: list[str]


def shell_files(command: str) -> FileLists:
    """Files a shell command line reads and modifies, as far as its text tells."""
    script, bodies = _split_heredocs(command)
    read: list[str] = []
    modified: list[str] = []
    for cmd in _simple_commands(script):
        for op, target in cmd.redirects:
            (modified if ">" in op else read).append(target)
        if cmd.words:
            _command_files(cmd, bodies, read, modified)
    keep_read = tuple(p for p in read if looks_like_path(p))
    keep_modified = tuple(p for p in modified if looks_like_path(p))
    return FileLists().merge(FileLists(_unique(keep_read), _unique(keep_modified)))


def _split_heredocs(command: str) -> tuple[str, list[str]]:
    """The command line without its here-document bodies, and the bodies in order."""
    lines: list[str] = []
    bodies: list[str] = []
    pending: list[str] = []
    body: list[str] = []
    for line in command.replace("\\\n", " ").split("\n"):
        if pending:
            if line.strip() == pending[0]:
                bodies.append("\n".join(body))
                body = []
                pending.pop(0)
            else:
                body.append(line)
            continue
        lines.append(line)
        pending.extend(m.group(2) for m in _HEREDOC.finditer(line))
    if pending:  # an unterminated here-document runs to the end
        bodies.append("\n".join(body))
    return _unquoted_newlines_to_semicolons("\n".join(lines)), bodies


def _unquoted_newlines_to_semicolons(script: str) -> str:
    # shlex treats newlines as blanks; in a shell they end a command. Comments
    # are dropped here too, since after joining they would swallow the rest.
    out: list[str] = []
    quote: str | None = None
    escaped = comment = False
    for ch in script:
        if comment:
            if ch == "\n":
                comment = False
                out.append(";")
            continue
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "\n":
            ch = ";"
        elif ch == "#" and (not out or out[-1] in " \t;|&("):
            comment = True
            continue
        out.append(ch)
    return "".join(out)


def _tokens(script: str) -> list[str]:
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: fall back to a rough split
        return _FALLBACK_TOKENS.findall(script)


def _simple_commands(script: str) -> list[_Command]:
    commands = [_Command([], [], [])]
    tokens = _tokens(script)
    heredoc_count = 0
    i = 0
    while i < len(tokens):
        token = tokens[i]
        current = commands[-1]
        is_punct = bool(token) and all(c in "();<>|&" for c in token)
        if is_punct and ("<" in token or ">" in token):
            target = tokens[i + 1] if i + 1 < len(tokens) else ""
            if current.words and current.words[-1].isdigit():
                current.words.pop()  # the "2" of "2>/dev/null"
            if "<<" in token:
                if token == "<<":
                    current.heredocs.append(heredoc_count)
                    heredoc_count += 1
            elif token not in (">&", "<&") and not target.startswith("&"):
                current.redirects.append((token, target))
            i += 2
            continue
        if is_punct and set(token) <= _SEPARATOR_CHARS:
            commands.append(_Command([], [], []))
        else:
            current.words.append(token)
        i += 1
    return [c for c in commands if c.words or c.redirects]


def _parse_args(args: Sequence[str], value_options: frozenset[str]) -> _Args:
    parsed = _Args([], {}, [])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            parsed.after_dashes = list(args[i + 1 :])
            parsed.positional.extend(parsed.after_dashes)
            break
        if arg.startswith("-") and len(arg) > 1:
            if arg in value_options:
                parsed.options[arg] = args[i + 1] if i + 1 < len(args) else None
                i += 1
            else:
                parsed.options[arg] = None
        else:
            parsed.positional.append(arg)
        i += 1
    return parsed


def _command_files(cmd: _Command, bodies: list[str], read: list[str], modified: list[str]) -> None:
    words = cmd.words
    while words and (words[0] in _PREFIX_COMMANDS or re.match(r"\w+=", words[0])):
        words = words[1:]
    if words and words[0] == "timeout":
        words = words[2:]
    if not words:
        return
    name = words[0].rsplit("/", 1)[-1]
    family = re.sub(r"[\d.]+$", "", name)  # python3.11 → python
    if family in ("egrep", "fgrep"):
        family = "grep"
    args = _parse_args(words[1:], _VALUE_OPTIONS.get(family, frozenset()))
    options = args.options
    positional = args.positional

    if family in _READERS or family in ("head", "tail"):
        read.extend(positional)
    elif family in ("grep", "rg"):
        if not {"-e", "-f", "--regexp", "--file"} & options.keys():
            positional = positional[1:]
        recursive = family == "rg" or any(
            o in ("--recursive", "-R") or re.fullmatch(r"-[a-zA-Z]*[rR][a-zA-Z]*", o)
            for o in options
        )
        read.extend(p for p in positional if not recursive or _EXTENSION.search(p))
    elif family in ("sed", "awk", "perl"):
        has_script = bool({"-e", "-f", "--expression", "--file", "-E"} & options.keys())
        files = positional if has_script else positional[1:]
        in_place = any(_IN_PLACE.match(o) for o in options) and family != "awk"
        if in_place:
            modified.extend(files)
        elif family != "perl":
            read.extend(files)
    elif family in _MODIFIERS:
        modified.extend(positional)
    elif family == "cp":
        if positional:
            read.extend(positional[:-1])
            modified.append(positional[-1])
    elif family == "patch":
        modified.extend(positional[:1])
        read.extend(p for p in (options.get("-i"), options.get("--input")) if p)
        _diff_targets(cmd, bodies, modified)
    elif family == "git" and positional:
        sub, rest = positional[0], positional[1:]
        if sub == "apply":
            _diff_targets(cmd, bodies, modified)
        elif sub == "checkout":
            modified.extend(args.after_dashes)
        elif sub in ("restore", "rm", "mv"):
            modified.extend(rest)
    elif family == "python":
        sources = [bodies[i] for i in cmd.heredocs if i < len(bodies)]
        code = options.get("-c")
        if code:
            sources.append(code)
        for source in sources:
            modified.extend(_PY_OPEN_WRITE.findall(source))
            modified.extend(_PY_PATH_WRITE.findall(source))


def _diff_targets(cmd: _Command, bodies: list[str], modified: list[str]) -> None:
    for i in cmd.heredocs:
        if i < len(bodies):
            modified.extend(_DIFF_TARGET.findall(bodies[i]))
