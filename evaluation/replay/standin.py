"""The stand-in summary model: a deterministic reply to the proxy's summary prompts.

No model runs offline, so the loopback upstream answers the proxy's
``--summarizer llm`` calls with a summary built from the prompt itself, the
way a careful model would fill the requested headings from the transcript::

    Goal              the previous summary's goal, else the first user message's
                      first line, else the first assistant message's
    Progress / Done   the previous summary's Done items, then each tool call
                      of the transcript (its command or arguments)
    In Progress       the newest assistant line
    Blocked           the newest error line, or "None"
    Key Decisions     the newest assistant lines
    Next Steps        the newest assistant line
    Critical Context  the newest distinct error lines, and the previous ones

A turn-prefix prompt (its system prompt asks for ``## Done So Far``) gets that
note's two headings instead. Items enter by priority (goal, next step,
errors, newest calls first) while the reply stays within ``max_tokens``;
the reply is never longer. It is a stand-in for cost and for the proxy's
path, not for a model's judgement: what it keeps is what lines carry,
and the proxy's checks may still refuse it (then the proxy uses its
extractive summary, and says so in its metrics).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from compaction import Message, message_text

#: Characters of one transcript line an item quotes.
ITEM_CHARS = 200
#: Newest error lines and assistant lines an item list takes from one transcript.
NEWEST_ERRORS = 6
NEWEST_THOUGHTS = 3

_BLOCK = r"<{tag}>\n(.*?)\n</{tag}>"
_ERROR = re.compile(
    r"(\w+(Error|Exception)\b|Traceback|\bFAILED\b|\bFAIL:|\bexit (code|status) [1-9]|"
    r"\b[1-9]\d* failed\b|^E\s{2,})"
)
_SECTION = re.compile(r"^## (.+)$", re.MULTILINE)


@dataclass
class _Transcript:
    users: list[str] = field(default_factory=list)
    thoughts: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def stand_in_reply(
    messages: Sequence[Message], max_tokens: int, count: Callable[[str], int]
) -> str:
    """The summary the stand-in model writes for the prompt ``messages``, within
    ``max_tokens`` as ``count`` counts."""
    prompt = "\n\n".join(message_text(m) for m in messages if m.get("role") != "system")
    previous = re.findall(_BLOCK.format(tag="previous-summary"), prompt, re.DOTALL)
    found = re.search(_BLOCK.format(tag="conversation"), prompt, re.DOTALL)
    transcript = _read(found.group(1) if found else prompt)
    if turn_prefix_prompt(messages):
        return _fit(_turn_note(transcript), max_tokens, count)
    return _fit(_summary(transcript, previous), max_tokens, count)


def turn_prefix_prompt(messages: Sequence[Message]) -> bool:
    """Whether the summary prompt ``messages`` asks for a turn prefix's note (its
    system prompt asks for ``## Done So Far``), not a span's summary."""
    system = next((message_text(m) for m in messages if m.get("role") == "system"), "")
    return "## Done So Far" in system


def _read(text: str) -> _Transcript:
    """The transcript as the prompt quotes it: a label line (``[User]:``), then
    the message's lines, each started by ``> `` (:func:`compaction.prompts.quoted`)."""
    read = _Transcript()
    label, first = "", False
    for raw in text.splitlines():
        if not raw.startswith(">"):
            label, first = raw.strip().rstrip(":"), True
            continue
        line = raw[1:].strip()
        if not line:
            continue
        if label == "[User]" and first:
            read.users.append(_quote(line))
        elif label == "[Assistant]" and first:
            read.thoughts.append(_quote(line))
        elif label == "[Assistant tool calls]":
            read.calls.append(_quote(line))
        elif _ERROR.search(line):
            error = _quote(line)
            if error in read.errors:
                read.errors.remove(error)
            read.errors.append(error)
        first = False
    return read


def _quote(text: str) -> str:
    return " ".join(text.replace("`", "'").split())[:ITEM_CHARS]


def _sections(summary: str) -> dict[str, list[str]]:
    """A previous summary's bullet lines by the heading they sit under."""
    out: dict[str, list[str]] = {}
    heading = ""
    for line in summary.splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        elif line.startswith("- ") and heading:
            out.setdefault(heading, []).append(line[2:].strip())
    return out


# An item is (priority, section, text); lower priority numbers enter first.
_Item = tuple[int, str, str]
_ORDER = (
    "Goal",
    "Constraints & Preferences",
    "Progress",
    "Done",
    "In Progress",
    "Blocked",
    "Key Decisions",
    "Next Steps",
    "Critical Context",
)


def _summary(read: _Transcript, previous: Sequence[str]) -> list[_Item]:
    earlier: dict[str, list[str]] = {}
    for text in previous:
        for heading, lines in _sections(text).items():
            earlier.setdefault(heading, []).extend(lines)
    goal = earlier.get("Goal") or (read.users[:1] or read.thoughts[:1] or ["Continue the task."])
    newest = read.thoughts[-1] if read.thoughts else "Continue from the last tool result."
    items: list[_Item] = [(0, "Goal", line) for line in goal[:3]]
    items.append((0, "Constraints & Preferences", "None stated"))
    items.append((1, "Next Steps", newest))
    items.append((1, "In Progress", newest))
    items.append((2, "Blocked", read.errors[-1] if read.errors else "None"))
    for rank, error in enumerate(reversed(read.errors[-NEWEST_ERRORS:])):
        items.append((3 + rank, "Critical Context", f"'{error}'"))
    for rank, call in enumerate(reversed(read.calls)):
        items.append((4 + rank, "Done", f"Ran '{call}'"))
    for rank, thought in enumerate(reversed(read.thoughts[-NEWEST_THOUGHTS:])):
        items.append((5 + rank, "Key Decisions", thought))
    for rank, line in enumerate(reversed(earlier.get("Done", []))):
        items.append((10 + len(read.calls) + rank, "Done", line))
    for rank, line in enumerate(earlier.get("Critical Context", [])):
        items.append((20 + len(read.calls) + rank, "Critical Context", line))
    return items


def _turn_note(read: _Transcript) -> list[_Item]:
    items: list[_Item] = []
    for rank, call in enumerate(reversed(read.calls)):
        items.append((rank, "Done So Far", f"Ran '{call}'"))
    for rank, error in enumerate(reversed(read.errors[-NEWEST_ERRORS:])):
        items.append((rank, "Context Needed Next", f"'{error}'"))
    if read.thoughts:
        items.append((0, "Context Needed Next", read.thoughts[-1]))
    return items or [(0, "Done So Far", "Nothing of note.")]


def _render(items: Sequence[_Item]) -> str:
    headings = [h for h in _ORDER if any(s == h for _, s, _ in items) or h == "Progress"]
    if any(s == "Done So Far" for _, s, _ in items):
        headings = ["Done So Far", "Context Needed Next"]
    lines: list[str] = []
    for heading in headings:
        level = "###" if heading in ("Done", "In Progress", "Blocked") else "##"
        lines.append(f"{level} {heading}")
        bullets = [text for _, section, text in items if section == heading]
        if heading == "Next Steps":
            lines.extend(f"{n}. {text}" for n, text in enumerate(bullets, 1))
        elif heading != "Progress":
            lines.extend(f"- {text}" for text in bullets or ["None"])
        lines.append("")
    return "\n".join(lines).strip()


def _fit(items: list[_Item], max_tokens: int, count: Callable[[str], int]) -> str:
    """The items that fit ``max_tokens``, highest priority first, in heading order."""
    ranked = sorted(range(len(items)), key=lambda i: items[i][0])
    chosen: list[int] = []
    for i in ranked:
        trial = sorted([*chosen, i])
        if count(_render([items[j] for j in trial])) <= max_tokens:
            chosen = trial
    text = _render([items[j] for j in chosen])
    return text if count(text) <= max_tokens else ""
