"""The tag, path, error-line and brief readers read ordinary text as their regexes did.

Each was once one regex that took quadratic time on text a client controls
(a result repeating an unclosed tag, a line of slashes or colons, a result
repeating a brief's arrow). The regexes are kept here, as they were, as the
reference: on random text built from the pieces they look for, small enough
for them, the linear readers give the same answers.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from compaction.stages import pruner
from compaction.summary import steps
from compaction.summary.files import FileLists, _unique, parse_file_lists, strip_file_lists
from compaction.summary.format import without_thinking
from compaction.text import clipping

_OLD_OUTPUT_GREEDY = re.compile(r"<output>\n?(.*)</output>", re.DOTALL)
_OLD_OUTPUT_LAZY = re.compile(r"<output>\n?(.*?)</output>", re.DOTALL)
_OLD_BLOCK = re.compile(r"<(read|modified)-files>\n?(.*?)</(?:read|modified)-files>", re.DOTALL)
_OLD_THINKING = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_OLD_PATH_TOKEN = re.compile(r"(?:[\w.-]*/)+[\w-][\w.-]*\.[A-Za-z]\w{0,5}\b|\bFile \"[^\"]+\"")
#: The error-line rule as it stands, with its one rewritten alternative in its
#: plain form: the shell-tool phrase after the first word's colon was
#: ``\S+:``, which tried every colon of a long first word. What the rule
#: matches may grow (new alternatives); the rewrite must not change it.
_LINEAR_SHELL = r"|\S[^\s:]*+:.*(?:No such file or directory"
assert _LINEAR_SHELL in clipping._ERROR_LINE.pattern
_OLD_ERROR_LINE = re.compile(
    clipping._ERROR_LINE.pattern.replace(_LINEAR_SHELL, r"|\S+:.*(?:No such file or directory")
)
_OLD_BRIEF_COMMAND = re.compile(r" → (?P<size>[\d,]+ lines?) output(?: \((?P<extras>.*)\))?$")
_OLD_BRIEF_SIZED = re.compile(r" \((?P<size>[\d,]+ chars)(?:, (?P<extras>.*))?\)$")

#: What the readers look for, and what sits around it in tool results.
_PIECES = [
    "<output>", "</output>", "<output>\n", "\n", " ", "x", "ok", "<returncode>0</returncode>",
    "<read-files>", "</read-files>", "<modified-files>", "</modified-files>", "a.py", "\n  b.md",
    "<think>", "</think>", "<THINK>", "</Think>", "<thinking>", "</thinking>", "<reasoning>",
    "</reasoning>", "<think", "a/", "/", "src", ".", "-", "_", "py", ".tar.gz", "File \"", '"',
    ":", "3", "12", ":4:", "Error", "ValueError", "pkg.mod.", "error", " error", "fatal", "E   ",
    "No such file or directory", "command not found", "Permission denied", "npm ERR!", "FAILED",
    " → ", "1,024", " lines", " line", " output", " (", ")", " chars", ", ", "exit code 1",
    "2 images", "K", "é",
]  # fmt: skip

_texts = st.lists(st.sampled_from(_PIECES), max_size=40).map("".join)


def _old_command_output(text: str) -> str:
    match = _OLD_OUTPUT_GREEDY.search(text)
    return match.group(1) if match else text


def _old_output_body(text: str) -> str:
    match = _OLD_OUTPUT_LAZY.search(text)
    return match.group(1) if match else text


def _old_file_lists(text: str) -> FileLists:
    found: dict[str, list[str]] = {"read": [], "modified": []}
    for match in _OLD_BLOCK.finditer(text):
        lines = (line.strip() for line in match.group(2).splitlines())
        found[match.group(1)].extend(line for line in lines if line)
    return FileLists().merge(FileLists(_unique(found["read"]), _unique(found["modified"])))


def _old_stripped(text: str) -> str:
    """``text`` without the regex's blocks, line by line: a line no block touches
    stays; of one a block covers in part, each stretch outside it stays a line."""
    covered = [False] * len(text)
    for match in _OLD_BLOCK.finditer(text):
        covered[match.start() : match.end()] = [True] * (match.end() - match.start())
    kept: list[str] = []
    start = 0
    for line in text.split("\n"):
        end = start + len(line)
        if not any(covered[start:end]):
            kept.append(line)
        else:
            run = ""
            for i in range(start, end):
                if covered[i] and run:
                    kept.append(run)
                    run = ""
                elif not covered[i]:
                    run += text[i]
            if run:
                kept.append(run)
        start = end + 1
    return "\n".join(kept).strip()


def _old_brief(brief: str) -> tuple[str, str] | None:
    match = _OLD_BRIEF_COMMAND.search(brief) or _OLD_BRIEF_SIZED.search(brief)
    return (match.group("size"), match.group("extras") or "") if match else None


def _new_brief(brief: str) -> tuple[str, str] | None:
    match = steps._brief_match(brief)
    return (match.group("size"), match.group("extras") or "") if match else None


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_a_commands_output_is_unwrapped_as_the_regex_did(text: str) -> None:
    assert pruner._command_output(text) == _old_command_output(text)
    assert steps._output_body(text) == _old_output_body(text)


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_file_blocks_are_read_and_stripped_as_the_regex_did(text: str) -> None:
    assert parse_file_lists(text) == _old_file_lists(text)
    assert strip_file_lists(text) == _old_stripped(text)


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_thinking_is_removed_as_the_regex_did(text: str) -> None:
    assert without_thinking(text) == _OLD_THINKING.sub("", text).strip()


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_paths_are_found_in_a_line_as_the_regex_did(text: str) -> None:
    for line in text.splitlines() or [text]:
        assert clipping._PATH_TOKEN.findall(line) == _OLD_PATH_TOKEN.findall(line)


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_error_lines_are_recognized_as_the_regex_did(text: str) -> None:
    for line in text.splitlines() or [text]:
        new, old = clipping._ERROR_LINE.match(line), _OLD_ERROR_LINE.match(line)
        assert (new and new.span()) == (old and old.span()), line


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_a_briefs_size_and_extras_are_read_as_the_regex_did(text: str) -> None:
    brief = "[bash] " + text.replace("\n", " ")
    assert _new_brief(brief) == _old_brief(brief)
