"""Clipping a tool result while keeping the lines worth keeping.

A summarizer reads tool results clipped to a few thousand characters; the
start and end alone would lose the error in the middle of a test run. So
:func:`clip_keeping` gives up to half of the room to the lines that matter —
the exit status, the command, error lines (newest first) and lines naming a
new file path, each up to :data:`KEPT_LINE_CHARS` — and the rest to the start
and the end, with a marker at each gap saying how much was cut.
:func:`error_lines` is the one definition of an error line, shared by the
pruner's briefs and the extractive summary.
"""

from __future__ import annotations

import re

from compaction.text.cuts import TEXT_MARKER_ROOM, clip, text_marker, word_cut

#: An error line: a Python exception (``pkg.SomeError: …``, or its bare name as
#: a traceback ends with it), ``re.error: …``, a test runner's ``FAILED`` /
#: ``ERROR`` line or its tally of failures (``3 failed, 68 passed``),
#: ``error:`` / ``fatal:`` / ``panic:`` (compilers, git, Rust, Go),
#: ``file.c:3:5: error …``, ``npm ERR!``, and a shell tool's
#: ``No such file or directory`` / ``command not found`` / ``Permission denied``.
#: Matched against lines stripped of surrounding blanks and of pytest's ``E``
#: prefix; anchored, so a word "error" inside ordinary text is no match.
#: A test runner's tally with failures in it: "3 failed, 68 passed in 4.74s",
#: pytest's "=== 1 passed, 2 errors in 0.1s ===", sympy's "tests finished: 8
#: passed, 1 failed, in 0.09 seconds". An error line too. (unittest's own
#: "FAIL: test_x (pkg.Case)" is one by the FAILED/ERROR rule.)
_TALLY_PATTERN = r"=*\s*(?:[A-Za-z][\w ]*:\s*)?(?:\d+ \w+, )*\d+ (?:failed|errors?)\b.*"
_TALLY = re.compile(f"^{_TALLY_PATTERN}$")
_ERROR_LINE = re.compile(
    r"^(?:"
    r"(?:[A-Za-z_]\w*\.)*_?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?"
    # A class a module path of two names or more names, then its message: how
    # a traceback ends for exceptions not named ...Error (django's
    # ImproperlyConfigured, packaging's InvalidVersion); one name ("self.Name:
    # int") is code, not an error.
    r"|(?:[a-z_]\w*\.){2,}_?[A-Z]\w*:\s.*"
    r"|(?:[a-z_]\w*\.)+error:\s.*"
    r"|(?:FAILED|FAIL|ERROR)(?::|\s+[\w(./]).*"
    rf"|{_TALLY_PATTERN}"
    # qwen-code ends every command's result with "Error: (none)": no error.
    r"|(?i:error|fatal|panic)(?:\[\w+\])?:(?!\s*\(none\)\s*$).*"
    r"|\S+:\d+(?::\d+)?:\s*(?:fatal\s+)?error\b.*"
    r"|npm ERR!.*"
    # The first colon is the one to try (it leaves the most room for the
    # phrase), so the name before it is read possessively: "\S+:" tried every
    # colon of a long first word, each followed by a scan to the line's end.
    r"|\S[^\s:]*+:.*(?:No such file or directory|command not found|Permission denied)"
    r")$"
)
_PYTEST_E = re.compile(r"^E\s+")
#: pytest's failure report: every line of it starts "E" and a few blanks.
_PYTEST_REPORT = re.compile(r"^E {3,}\S")
#: A line that says how a command ended.
_STATUS_LINE = re.compile(
    r"(?i)<returncode>\s*-?\d+|\bexit(?:ed with)?[ _-]?(?:code|status)\b[\s:=]*-?\d+"
    r"|\breturn[ _-]?code\b[\s:=]*-?\d+"
)
#: A line that echoes the command that was run (shell prompts, agent wrappers).
_COMMAND_LINE = re.compile(r"^(?:\$ |(?i:command|running|cmd):\s)")
#: A path is tried only where a run of path characters starts: from inside a
#: run it could only find what the try at the run's start found or ruled out
#: (the same slashes, the same names after them), and trying from every
#: character of a run of slashes was quadratic in the run.
_PATH_TOKEN = re.compile(
    r"(?<![\w./-])(?:[\w.-]*/)+[\w-][\w.-]*\.[A-Za-z]\w{0,5}\b|\bFile \"[^\"]+\""
)
#: Lines longer than this are kept cut (between words) by :func:`clip_keeping`.
KEPT_LINE_CHARS = 300
#: Below this limit :func:`clip_keeping` keeps only the start and end: too
#: small to hold anything picked from the middle beside them.
_MIN_KEEPING_CHARS = 400


def error_lines(text: str) -> list[str]:
    """The lines of ``text`` that report an error, stripped, in order (repeats kept).

    Whole as printed, pytest's ``E`` prefix included: a line is quoted so that
    it can be searched for, and ``E   AssertionError: …`` is what the output said.
    """
    found = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and (_PYTEST_REPORT.match(line) or _ERROR_LINE.match(_PYTEST_E.sub("", line))):
            found.append(line)
    return found


def is_tally_line(line: str) -> bool:
    """Whether an error line is a test runner's tally (``3 failed, 68 passed``): it
    names no file or exception."""
    return bool(_TALLY.match(line.strip()))


def is_error_line(line: str) -> bool:
    """Whether one line reports an error, as :func:`error_lines` reads it."""
    line = line.strip()
    return bool(_PYTEST_REPORT.match(line) or _ERROR_LINE.match(_PYTEST_E.sub("", line)))


def clip_keeping(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, keeping what matters in it.

    For a tool result read by a summarizer: up to half of ``limit`` goes to
    lines picked from anywhere in the text — how the command ended (exit
    code), the command echoed, error lines (newest first), the innermost
    traceback frame and lines naming a file path not seen yet — each cut to
    :data:`KEPT_LINE_CHARS`; the rest to the start and the end. Every gap
    becomes a marker saying how many characters were cut, and cuts fall
    between lines or words. Returns ``text`` when it fits, so a clipped text
    is never clipped again.
    """
    if len(text) <= limit:
        return text
    if limit < _MIN_KEEPING_CHARS:
        return clip(text, limit)
    spans = _line_spans(text)
    picked: list[tuple[int, int]] = []
    used = 0
    for begin, end in _worth_keeping(text, spans):
        length = len(word_cut(text[begin:end], KEPT_LINE_CHARS))
        cost = length + TEXT_MARKER_ROOM
        if used + cost <= limit // 2:
            picked.append((begin, begin + length))
            used += cost
    # The markers are counted at their widest when picking; what they leave
    # over goes to the start and the end, which grow until the text is full.
    rest = limit - used - TEXT_MARKER_ROOM
    best = text[:0]
    for _ in range(3):
        start = _start_boundary(text, rest * 3 // 5)
        end = _end_boundary(text, rest - rest * 3 // 5)
        clipped = _render_kept(text, [(0, start), *picked, (end, len(text))])
        if len(clipped) > limit:
            break
        best = clipped
        if limit - len(clipped) < TEXT_MARKER_ROOM:
            break
        rest += limit - len(clipped)
    return best or clip(text, limit)


def _line_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each line of ``text``, without its line break."""
    spans = []
    position = 0
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip("\r\n")
        spans.append((position, position + len(stripped)))
        position += len(line)
    return spans


def _worth_keeping(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans of the lines :func:`clip_keeping` keeps first, most important first."""
    status: list[int] = []
    commands: list[int] = []
    errors: list[int] = []
    frames: list[int] = []
    paths: list[int] = []
    seen_paths: set[str] = set()
    for i, (begin, end) in enumerate(spans):
        line = text[begin:end]
        stripped = line.strip()
        if not stripped:
            continue
        if _STATUS_LINE.search(line):
            status.append(i)
        elif _COMMAND_LINE.match(stripped):
            commands.append(i)
        elif is_error_line(stripped):
            errors.append(i)
        else:
            new = [p for p in _PATH_TOKEN.findall(line) if p not in seen_paths]
            if new:
                seen_paths.update(new)
                (frames if stripped.startswith('File "') else paths).append(i)
    order = [*status[-1:], *commands[:1]]
    seen_lines: set[str] = set()
    for i in reversed(errors):  # newest first; a repeated line once
        line = text[spans[i][0] : spans[i][1]].strip()
        if line not in seen_lines:
            seen_lines.add(line)
            order.append(i)
    order.extend(reversed(frames))  # the innermost frame of the last traceback first
    order.extend(paths)
    return [spans[i] for i in order]


def _start_boundary(text: str, chars: int) -> int:
    """Where a start of about ``chars`` characters ends: after a line, or between words."""
    if chars <= 0:
        return 0
    newline = text.rfind("\n", 0, chars)
    if newline >= chars // 2:
        return newline + 1
    return len(word_cut(text[:chars], chars))


def _end_boundary(text: str, chars: int) -> int:
    """Where an end of about ``chars`` characters starts: at a line, or between words."""
    if chars <= 0:
        return len(text)
    first = len(text) - chars
    newline = text.find("\n", first, first + chars // 2)
    if newline >= 0:
        return newline + 1
    blank = text.find(" ", first, first + chars // 2)
    return blank + 1 if blank >= 0 else first


def _render_kept(text: str, kept: list[tuple[int, int]]) -> str:
    """The kept spans of ``text`` in order, each gap replaced by a cut marker."""
    merged: list[list[int]] = []
    for begin, end in sorted(kept):
        if end <= begin:
            continue
        # A gap no longer than its marker is kept instead.
        if merged and begin - merged[-1][1] <= len(text_marker(begin - merged[-1][1])):
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    out: list[str] = []
    position = 0
    for begin, end in merged:
        if begin > position:
            out.append(_gap_marker(text[position:begin], bool(out) and out[-1].endswith("\n")))
        out.append(text[begin:end])
        position = end
    if position < len(text):
        out.append(_gap_marker(text[position:], bool(out) and out[-1].endswith("\n")))
    return "".join(out)


def _gap_marker(gap: str, after_line: bool) -> str:
    """The marker for a cut ``gap``, on a line of its own."""
    marker = text_marker(len(gap))
    return marker[1:] if after_line else marker
