"""What a compaction keeps of the span it replaces, measured over real sessions.

For every fixture in ``../shared/fixtures`` larger than a 16k window's input
limit, an oracle of this file's own (regexes written here, not the library's
error-line or file-list code) lists what the replaced middle held: the file
paths its tool calls touched and the last five distinct error lines its tool
results printed. Then it counts how many of those can still be found in the
compacted request, once with the extractive summary and once with plain
truncation at the same limit. The extractive summary must keep at least 95 %
of the paths and 90 % of the error lines over the corpus, and never less
than truncation does. ``pytest -s -m corpus tests/compaction/summary/test_summary_quality.py``
prints the figures.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compaction import CannotFitError, Profile, TokenCounter, compact, message_text

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures"
WINDOW = 16_384
COUNTER = TokenCounter("gpt-4o")
#: How many of the newest distinct error lines of the middle are looked for.
LAST_ERRORS = 5
#: An error line longer than this may be quoted cut (at a word, with "…"):
#: it counts as kept when this much of its start is found.
ERROR_QUOTE_CHARS = 300
ERROR_PREFIX_CHARS = 200

PATH_SHARE = 0.95
ERROR_SHARE = 0.90


def _requests() -> list[Path]:
    if not FIXTURES.is_dir():
        return []
    # qwen-code-tools.json is a bare list of tool schemas, not a request body.
    return [p for p in sorted(FIXTURES.glob("*/*.json")) if p.name != "qwen-code-tools.json"]


# --- the oracle ----------------------------------------------------------------

_PATH_KEYS = ("path", "file_path", "filepath", "file", "filename", "target_file", "notebook_path")
_COMMAND_KEYS = ("command", "cmd")
_EXTENSIONS = (
    "py|pyi|pyx|txt|cfg|toml|ini|json|yaml|yml|rst|md|js|jsx|ts|tsx|html|css|c|h|cc|cpp|"
    "hpp|rs|go|java|rb|sh|sql|xml|csv|lock|patch|diff"
)
_PATH_TOKEN = re.compile(
    r"(?<![\w/.:-])"  # not inside a longer word or a URL
    rf"((?:\.{{0,2}}/)?(?:[\w.-]+/)*[\w-][\w.-]*\.(?:{_EXTENSIONS}))"
    r"(?![\w/-])"
)
#: A heredoc's body (the lines after ``<<'EOF'`` up to ``EOF``): text written, not paths acted on.
_HEREDOC = re.compile(r"(<<-?\s*['\"]?(\w+)['\"]?[^\n]*\n).*?^\s*\2\s*$", re.DOTALL | re.MULTILINE)
_ERROR_PATTERNS = (
    # A Python exception line, as a traceback ends: "pkg.mod.SomeError: message".
    re.compile(r"^(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::\s.*)?$"),
    # The lower-case exception classes of the standard library (re.error).
    re.compile(r"^(?:[a-z_]\w*\.)+error:\s.+$"),
    # Test-runner summaries: "FAILED (failures=1)", "ERROR: test_x (mod.Case)".
    re.compile(r"^(?:FAILED|ERROR)\b.*$"),
    # Compilers, git, package managers: "error: …", "fatal: …", "Error: …".
    re.compile(r"^(?:error|fatal)(?:\[\w+\])?:\s.+$", re.IGNORECASE),
    # Shell tools: "sed: can't read x.py: No such file or directory".
    re.compile(r"^\S+: .*(?:No such file or directory|command not found)$"),
)


def _calls(message: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(id, name, arguments)`` of each tool call of an assistant message."""
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            continue
        if isinstance(arguments, dict):
            yield str(call.get("id")), str(function.get("name", "")), arguments


def touched_paths(middle: Iterable[dict[str, Any]]) -> list[str]:
    """File paths named by the tool calls of ``middle``: path arguments and
    paths in shell commands (outside heredoc bodies), in first-seen order."""
    found: dict[str, None] = {}
    for message in middle:
        for _, _, arguments in _calls(message):
            for key in _PATH_KEYS:
                value = arguments.get(key)
                if isinstance(value, str) and value.strip() and "\n" not in value:
                    found.setdefault(value.strip(), None)
            for key in _COMMAND_KEYS:
                command = arguments.get(key)
                if isinstance(command, str):
                    for match in _PATH_TOKEN.finditer(_HEREDOC.sub(r"\1", command)):
                        found.setdefault(match.group(1), None)
    return list(found)


def error_lines(text: str) -> Iterator[str]:
    for raw in text.splitlines():
        line = raw.strip()
        if line and any(p.match(line) for p in _ERROR_PATTERNS):
            yield " ".join(line.split())


#: Commands that show files: a docstring's "ValueError: …" they print is no error.
_SHOWS = re.compile(
    r"^(?:cd \S+ && )?(?:cat|head|tail|nl|grep|sed -n|less|find|ls|git (?:diff|show))\s"
)
_FILE_TOOLS = ("open", "view", "read_file", "str_replace_editor", "read", "cat")


def _shows_files(call: tuple[str, dict[str, Any]] | None) -> bool:
    if call is None:
        return False
    name, arguments = call
    command = arguments.get("command")
    if name in _FILE_TOOLS:
        return command in (None, "view")
    return isinstance(command, str) and bool(_SHOWS.match(command.strip()))


def last_errors(middle: Sequence[dict[str, Any]], count: int = LAST_ERRORS) -> list[str]:
    """The newest ``count`` distinct error lines printed by the tool results of
    ``middle``, leaving out what commands that only show files printed."""
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    for message in middle:
        for call_id, name, arguments in _calls(message):
            calls[call_id] = (name, arguments)
    seen: list[str] = []
    for message in reversed(middle):
        if message.get("role") not in ("tool", "function"):
            continue
        if _shows_files(calls.get(str(message.get("tool_call_id")))):
            continue
        for line in reversed(list(error_lines(message_text(message)))):
            if line not in seen:
                seen.append(line)
            if len(seen) == count:
                return seen
    return seen


def request_text(messages: Iterable[dict[str, Any]]) -> str:
    """Everything the model reads in ``messages``, whitespace made single spaces."""
    parts = []
    for message in messages:
        parts.append(message_text(message))
        for call in message.get("tool_calls") or []:
            parts.append(str((call.get("function") or {}).get("arguments", "")))
    return " ".join(" ".join(parts).split())


def error_kept(line: str, text: str) -> bool:
    if len(line) > ERROR_QUOTE_CHARS:
        line = line[:ERROR_PREFIX_CHARS]
    return line in text


def _identity(message: dict[str, Any]) -> tuple[Any, ...]:
    """What stays when a kept message is excerpted in place: who, which call, how it starts."""
    calls = tuple(str(call.get("id")) for call in message.get("tool_calls") or [])
    return (message.get("role"), message.get("tool_call_id"), calls, message_text(message)[:40])


def replaced_middle(
    before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The messages of ``before`` that ``after`` does not keep at its start or its end.

    A message kept at the end but excerpted to fit still counts as kept: what
    it lost is the tail's doing, not the summary's.
    """
    start = 0
    while start < min(len(before), len(after)) and before[start] == after[start]:
        start += 1
    end = 0
    while end < min(len(before), len(after)) - start and _identity(before[-1 - end]) == (
        _identity(after[-1 - end])
    ):
        end += 1
    return list(before[start : len(before) - end])


# --- measuring -------------------------------------------------------------------


@dataclass
class Tally:
    kept: int = 0
    total: int = 0

    def add(self, kept: int, total: int) -> None:
        self.kept += kept
        self.total += total

    @property
    def share(self) -> float:
        return self.kept / self.total if self.total else 1.0


@dataclass
class Figures:
    fixtures: int = 0
    paths: Tally | None = None
    errors: Tally | None = None
    truncated_paths: Tally | None = None
    truncated_errors: Tally | None = None


def _compact(body: dict[str, Any], summarizer: str) -> Any:
    profile = Profile(context_window=WINDOW, summarizer=summarizer)  # type: ignore[arg-type]
    return asyncio.run(compact(body, profile, counter=COUNTER))


def measure(paths: Sequence[Path]) -> tuple[Figures, list[str]]:
    figures = Figures(0, Tally(), Tally(), Tally(), Tally())
    assert figures.paths and figures.errors and figures.truncated_paths
    assert figures.truncated_errors
    lines = []
    for path in paths:
        body = json.loads(path.read_text())
        try:
            extractive = _compact(body, "extractive")
            truncated = _compact(body, "off")
        except CannotFitError:  # the head alone is too large: nothing to compare
            continue
        if extractive.tokens_before <= extractive.input_limit:
            continue
        middle = replaced_middle(body["messages"], extractive.messages)
        wanted_paths, wanted_errors = touched_paths(middle), last_errors(middle)
        figures.fixtures += 1
        row = [f"{path.parent.name}/{path.stem}"]
        for messages, paths_tally, errors_tally in (
            (extractive.messages, figures.paths, figures.errors),
            (truncated.messages, figures.truncated_paths, figures.truncated_errors),
        ):
            text = request_text(messages)
            kept_paths = sum(p in text for p in wanted_paths)
            kept_errors = sum(error_kept(e, text) for e in wanted_errors)
            paths_tally.add(kept_paths, len(wanted_paths))
            errors_tally.add(kept_errors, len(wanted_errors))
            row.append(
                f"paths {kept_paths}/{len(wanted_paths)} errors {kept_errors}/{len(wanted_errors)}"
            )
        lines.append("  ".join(row))
    return figures, lines


@pytest.mark.corpus
def test_extractive_summary_keeps_paths_and_errors_of_what_it_replaces() -> None:
    paths = _requests()
    if not paths:
        pytest.skip(f"summary quality corpus test skipped: no fixtures at {FIXTURES}")
    figures, lines = measure(paths)
    assert figures.paths and figures.errors and figures.truncated_paths
    assert figures.truncated_errors
    print()
    print("\n".join(lines))
    print(
        f"{figures.fixtures} fixtures over a {WINDOW:,}-token window's limit\n"
        f"  extractive: paths {figures.paths.kept}/{figures.paths.total} "
        f"= {figures.paths.share:.1%}, last errors {figures.errors.kept}/"
        f"{figures.errors.total} = {figures.errors.share:.1%}\n"
        f"  truncation: paths {figures.truncated_paths.kept}/{figures.truncated_paths.total} "
        f"= {figures.truncated_paths.share:.1%}, last errors "
        f"{figures.truncated_errors.kept}/{figures.truncated_errors.total} "
        f"= {figures.truncated_errors.share:.1%}"
    )
    assert figures.fixtures >= 10, "too few fixtures over the limit to measure anything"
    assert figures.paths.total and figures.errors.total
    assert figures.paths.share >= PATH_SHARE
    assert figures.errors.share >= ERROR_SHARE
    assert figures.paths.share >= figures.truncated_paths.share
    assert figures.errors.share >= figures.truncated_errors.share


# --- the oracle itself -------------------------------------------------------------


def test_oracle_reads_paths_from_arguments_and_commands() -> None:
    middle = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": json.dumps(
                            {
                                "command": "cd /testbed && sed -n '1,9p' django/db/query.py "
                                "&& cat <<'EOF' > repro.py\nimport inner/ignored.py\nEOF\n"
                                "curl https://example.com/x.json"
                            }
                        ),
                    },
                },
                {
                    "id": "2",
                    "type": "function",
                    "function": {"name": "edit", "arguments": '{"path": "src/a b.txt"}'},
                },
            ],
        }
    ]
    assert touched_paths(middle) == ["django/db/query.py", "repro.py", "src/a b.txt"]


def test_oracle_finds_the_newest_distinct_error_lines() -> None:
    tool = "tool"
    middle = [
        {"role": tool, "content": "fatal: not a git repository\nok"},
        {"role": "user", "content": "ValueError: said by the user, not printed"},
        {
            "role": tool,
            "content": "Traceback (most recent call last):\n  File 'x.py'\n"
            "    raise KeyError('a')\nKeyError: 'a'\n\nAssertionError raised as expected\n"
            "FAILED (failures=1)\nre.error: bad escape \\g at position 4",
        },
        {"role": tool, "content": "KeyError: 'a'\nsed: can't read a.py: No such file or directory"},
    ]
    assert last_errors(middle) == [
        "sed: can't read a.py: No such file or directory",
        "KeyError: 'a'",
        "re.error: bad escape \\g at position 4",
        "FAILED (failures=1)",
        "fatal: not a git repository",
    ]
    assert last_errors(middle, 2) == [
        "sed: can't read a.py: No such file or directory",
        "KeyError: 'a'",
    ]


def test_oracle_middle_is_what_neither_end_keeps() -> None:
    before = [{"role": "user", "content": f"message {i} " + "word " * 20} for i in range(6)]
    summary = {"role": "user", "content": "[summary]"}
    after = [before[0], before[1], summary, before[5]]
    assert replaced_middle(before, after) == before[2:5]
    # A kept message excerpted in place is still kept; one rewritten is not.
    excerpted = {"role": "user", "content": before[5]["content"][:50] + "[… 50 characters cut …]"}
    assert replaced_middle(before, [*after[:3], excerpted]) == before[2:5]
    rewritten = {"role": "user", "content": "[bash] brief"}
    assert replaced_middle(before, [*after[:3], rewritten]) == before[2:6]
    text = request_text([{"content": "x  y\nERROR: z"}])
    assert error_kept("ERROR: z", text)
    long = "E" + "x" * 400
    assert error_kept(long, "…" + long[:250] + "…") and not error_kept(long, long[:150])
