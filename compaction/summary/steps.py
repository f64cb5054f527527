"""What each tool call in a stretch of conversation did, and how it went.

Read off the messages without an LLM, for the extractive summary: a call
becomes ``bash: `pytest -q` → exit 1, error: `AssertionError: …``` — its
tool and key argument, then the exit status, the error line or the size of
its output. Each step also keeps every distinct error line its result printed
(:func:`compaction.text.clipping.error_lines`), whole up to
:data:`~compaction.text.clipping.KEPT_LINE_CHARS`: the summary quotes the last ones
seen. A result the pruner already replaced by a one-line brief
(:func:`compaction.stages.pruner.tool_brief`) is read from that brief. Every regex
here runs in linear time: results can be megabytes long.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compaction.chat.calls import COMMAND_ARGUMENTS, PATH_ARGUMENTS, key_argument, shows_files
from compaction.chat.messages import call_name_and_arguments, message_text, tool_calls
from compaction.chat.recall import ref_suffix, trailing_ref
from compaction.summary.files import results_after
from compaction.text.clipping import KEPT_LINE_CHARS, error_lines
from compaction.text.cuts import one_line, output_body
from compaction.types import Message

_ARGUMENT_CHARS = 120
#: The error quoted in a Done line; the Blocked section quotes it whole.
_OUTCOME_ERROR_CHARS = 160
#: At most this many distinct error lines are kept per result, the newest.
_ERRORS_PER_RESULT = 8

_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_EXIT_CODE = re.compile(r"(?i)\bexit(?:\s+code|\s+status)?\s*[:=]?\s*(-?\d+)\b")
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::\s|$)")
# The pruner's briefs (pruner.tool_brief): ``→ 32 lines output (extras)`` for a
# command, ``(45,210 chars, extras)`` otherwise. The extras are ``exit code N``
# first, ``N images`` last and the error line between: that line may hold
# anything, commas and brackets included, so it is what is left over.
_BRIEF_COMMAND = re.compile(r" → (?P<size>[\d,]+ lines?) output(?: \((?P<extras>.*)\))?$")
_BRIEF_COMMAND_BARE = re.compile(r" → (?P<size>[\d,]+ lines?) output(?P<extras>)$")
_BRIEF_SIZED = re.compile(r" \((?P<size>[\d,]+ chars)(?:, (?P<extras>.*))?\)$")
_BRIEF_CODE = re.compile(r"^exit code (-?\d+)(?:, |$)")
_BRIEF_IMAGES = re.compile(r"(?:^|, )([\d,]+ images?)$")
#: How a brief joins its first and last error lines (pruner.LAST_ERROR_SEPARATOR).
_LAST_ERROR_SEPARATOR = "; last: "
_FAILED_START = re.compile(r"(?i)^\s*(error|traceback|fatal|failed|exception)\b")


@dataclass(frozen=True)
class Step:
    """One tool call: what it acted on, how it went (``None`` without a result), its error.

    ``errors`` are the distinct error lines its result printed, oldest first
    (from a pruned brief, the one it kept).
    """

    call: str
    outcome: str | None
    error: str | None
    errors: tuple[str, ...] = ()

    @property
    def line(self) -> str:
        """The call as a bullet line."""
        return f"- {self.call} → {self.outcome}" if self.outcome else f"- {self.call}"


def tool_steps(messages: Sequence[Message]) -> list[Step]:
    """One :class:`Step` per tool call in ``messages``, in order."""
    steps = []
    # Agents repeat calls (`git diff`, `pytest -q`): each is described once.
    described: dict[tuple[str, str], str] = {}
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        results = results_after(messages, i)
        for call in tool_calls(message):
            output = results.get(call.get("id"))
            text = message_text(output) if output is not None else None
            steps.append(_step(call, text, described))
        function_call = message.get("function_call")
        if isinstance(function_call, dict):
            following = messages[i + 1] if i + 1 < len(messages) else {}
            result = message_text(following) if following.get("role") == "function" else None
            steps.append(_step(function_call, result, described))
    return steps


def _step(call: dict[str, Any], result: str | None, described: dict[tuple[str, str], str]) -> Step:
    name, arguments = call_name_and_arguments(call)
    what = described.get((name, arguments))
    if what is None:
        what = described[(name, arguments)] = _describe(call, name)
    if result is None:
        return Step(what, None, None)
    brief = _pruned_brief(name, result)
    if brief:
        outcome, error = brief
        errors = tuple(error.split(_LAST_ERROR_SEPARATOR)) if error else ()
        return Step(what, outcome, error, errors)
    key, _ = key_argument(call)
    runs = key in COMMAND_ARGUMENTS and not shows_files(call)
    return Step(what, *_outcome(result, runs=runs))


def _describe(call: dict[str, Any], name: str) -> str:
    """The tool and its key argument: ``bash: `pytest -q```."""
    key, value = key_argument(call)
    if not value:
        what = name or "tool"
    elif key in COMMAND_ARGUMENTS:
        what = f"{name}: `{_first_line(value)}`"
    elif key in PATH_ARGUMENTS:
        what = f"{name} `{_first_line(value)}`"
    else:
        what = f"{name}({key}={_first_line(value)})"
    return what


def exit_code(result: str) -> int | None:
    """The exit status a tool result reports: a ``<returncode>`` tag anywhere, or
    "exit code N" near its start; ``None`` when it reports none."""
    found = _RETURNCODE.search(result) or _EXIT_CODE.search(result[:200])
    return int(found.group(1)) if found else None


def _outcome(result: str, *, runs: bool) -> tuple[str, str | None, tuple[str, ...]]:
    """How a tool call went: a few words, its error line if it failed, the error lines seen.

    ``runs`` says the call ran a command (rather than showed a file): its
    error lines count even when it exited 0, as scripts that catch an
    exception and print it do.
    """
    code = exit_code(result)
    body = _output_body(result)
    found = _distinct(error_lines(body))
    # Without an exit code, a result failed when it starts with an error, or
    # when a command (not a file shown) printed error lines.
    failed = code != 0 if code is not None else bool(_FAILED_START.match(body) or (runs and found))
    error = _main_error(body, found) if failed else None
    errors = tuple(found) if failed or runs else ()
    lines = [line for line in body.splitlines() if line.strip()]
    if not lines:
        size = "no output"
    elif len(lines) == 1 and len(body) <= 80 and not error:
        size = f"`{lines[0].strip()}`"
    elif len(lines) == 1:
        size = f"{len(body.strip()):,} chars"
    else:
        size = f"{len(lines):,} lines"
    parts = [f"exit {code}"] if code is not None else []
    parts.append(f"error: `{one_line(error, _OUTCOME_ERROR_CHARS)}`" if error else size)
    return ", ".join(parts), error, errors


def _output_body(result: str) -> str:
    """What a ``<output>…</output>`` wrapper holds (up to its first closer), else ``result``."""
    return output_body(result, to_last=False)


def _pruned_brief(name: str, result: str) -> tuple[str, str | None] | None:
    """The outcome already written by the pruner into a one-line brief.

    ``[bash] "pytest" → 32 lines output (exit code 1, AssertionError: …)`` or
    ``[read_file] src/app.py (45,210 chars)``: in the pipeline the condenser
    sees the middle after pruning, so most long results arrive like this.
    The ``[ref: …]`` a brief may end with (recall) is not part of its outcome.
    """
    ref = trailing_ref(result)
    if ref is not None:
        result = result[: -len(ref_suffix(ref))]
    if "\n" in result or not result.startswith(f"[{name}] "):
        return None
    match = _brief_match(result)
    if not match:
        return None
    size, extras = match.group("size"), match.group("extras") or ""
    code_match = _BRIEF_CODE.match(extras)
    code = code_match.group(1) if code_match else None
    if code_match:
        extras = extras[code_match.end() :]
    images = _BRIEF_IMAGES.search(extras)
    if images:
        extras = extras[: images.start()]
        if size.endswith("chars"):
            size = f"{size}, {images.group(1)}"
    details = extras.strip()
    error = details if details and code != "0" else None
    words = [f"exit {code}"] if code is not None else []
    words.append(f"error: `{error}`" if error else size)
    return ", ".join(words), error


def _brief_match(brief: str) -> re.Match[str] | None:
    """A brief's size and the extras in its closing parentheses, if it has them."""
    # Extras close with ")" at the end of the line. Without it their ".*"
    # could only fail, after scanning to the end from every " → ", which is
    # quadratic in a result repeating that arrow.
    if brief.endswith(")"):
        return _BRIEF_COMMAND.search(brief) or _BRIEF_SIZED.search(brief)
    return _BRIEF_COMMAND_BARE.search(brief)


def _distinct(lines: Sequence[str]) -> list[str]:
    """The newest :data:`_ERRORS_PER_RESULT` distinct lines, oldest first, each quoted whole
    up to :data:`~compaction.text.clipping.KEPT_LINE_CHARS` (cut between words)."""
    seen: dict[str, None] = {}
    for line in reversed(lines):
        quoted = one_line(line, KEPT_LINE_CHARS)
        if quoted not in seen:
            seen[quoted] = None
            if len(seen) == _ERRORS_PER_RESULT:
                break
    return list(reversed(seen))


def _main_error(body: str, found: Sequence[str]) -> str | None:
    """The line that best says what went wrong: a traceback's exception line first."""
    for line in reversed(body.splitlines()):
        if _EXCEPTION_LINE.match(line):
            return one_line(line, KEPT_LINE_CHARS)
    if found:
        return found[-1]
    first = next((s.strip() for s in body.splitlines() if s.strip()), "")
    return one_line(first, KEPT_LINE_CHARS) if _FAILED_START.match(first) else None


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    first = one_line(lines[0], _ARGUMENT_CHARS) if lines else ""
    return first + (" …" if len(lines) > 1 and not first.endswith("…") else "")
