"""Which files a shell command line reads and modifies, as far as its text tells.

Pure functions over a command string, for the file lists of a summary
(:mod:`compaction.summary.files`): ``cat``/``grep``/``sed -n``/``head`` read;
``sed -i``/``>``/``tee``/``mv``/``rm``/``cp``'s target/``patch``/``git apply``
and ``open(…, "w")`` in an inline Python script modify. The line is split into
simple commands (here-documents, quotes, ``&&``, ``|``, newlines and comments
understood); only tokens that look like file paths are kept. Best effort: a
command built at run time (``$VAR``, globs, ``xargs``) names nothing.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9_+-]{0,9}$")
_UNSAFE = re.compile(r"[\s$*?{}\[\]<>|;&()'\"`\\=,]")
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


@dataclass(frozen=True)
class ShellFiles:
    """Paths a command line reads and modifies, first-seen order; a modified one is not read."""

    read: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()


def shell_files(command: str) -> ShellFiles:
    """Files a shell command line reads and modifies, as far as its text tells."""
    script, bodies = _split_heredocs(command)
    read: list[str] = []
    modified: list[str] = []
    for cmd in _simple_commands(script):
        for op, target in cmd.redirects:
            (modified if ">" in op else read).append(target)
        if cmd.words:
            _command_files(cmd, bodies, read, modified)
    kept_modified = _unique(p for p in modified if looks_like_path(p))
    kept_read = _unique(p for p in read if looks_like_path(p) and p not in kept_modified)
    return ShellFiles(kept_read, kept_modified)


def looks_like_path(token: str) -> bool:
    """A token that names a file: a ``/`` or an extension, and nothing a shell would expand."""
    if not token or token.startswith("-") or _UNSAFE.search(token) or "://" in token:
        return False
    if token in (".", "..", "/") or token.endswith("/") or token.startswith("/dev/"):
        return False
    return "/" in token or bool(_EXTENSION.search(token))


def _unique(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(paths))


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
