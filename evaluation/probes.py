"""Probes: what a compacted request must still tell a model, drawn from the original.

Each probe is generated from the **original** conversation, deterministically,
and checked against the **compacted** request by presence of its needles
(whitespace collapsed on both sides)::

    kind          probe     needles                                 question (with --judge)
    recall        error     the line, first 60 chars                what did `cmd` report?
                  value     the identifier or value                 what is `v`?
    artifacts     modified  the path                                read or modified?
                  read      the path (the 5 most recently read)     read or modified?
    continuation  task      the task's first line, first 80 chars   what is the task?
                  plan      the last stated plan, first 80 chars    what next?
                  command   the last command and its outcome line   what ran last, and how?
    decisions     decision  ≥ 60 % of the sentence's longer words   what was decided?

*recall* takes the last :data:`RECALL_COUNT` distinct error lines of tool
outputs (not of files being shown) and the last :data:`RECALL_COUNT` distinct
identifiers and values (with a digit, ``_``, ``.`` or ``/``) that the user or
the assistant wrote — what the conversation talked about, not every token of
a listing. *artifacts* come from :func:`compaction.files.collect_files`, the
same reading of the tool calls the summaries use. *decisions* are the last
:data:`DECISION_COUNT` assistant sentences that state a conclusion or a
choice; a summary may reword them, so most (not all) of their longer words
must survive.

Pure functions; nothing here calls a model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from compaction import Message, Profile, key_argument, message_text, tool_calls
from compaction.chat.calls import call_for_result, parse_arguments, shows_files
from compaction.chat.messages import RESULT_ROLES, call_name_and_arguments
from compaction.summary.files import collect_files
from compaction.text.clipping import error_lines

Kind = Literal["recall", "artifacts", "continuation", "decisions"]
KINDS: tuple[Kind, ...] = ("recall", "artifacts", "continuation", "decisions")

RECALL_COUNT = 5
READ_COUNT = 5
DECISION_COUNT = 5
#: Share of a decision's longer words that must be present.
DECISION_SHARE = 0.6
_ERROR_CHARS = 60
_LINE_CHARS = 80
_DECISION_WORDS = 8

_TOKEN = re.compile(r"(?<![\w./-])[A-Za-z0-9][\w./-]{3,59}")
#: A value or identifier: a digit, an underscore, or a dot or slash inside.
_VALUE = re.compile(r"[\d_]|\w[./]\w")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_DECIDES = re.compile(
    r"\b(?:decided|decide|instead|the fix|root cause|the (?:issue|problem|bug) is|"
    r"because|so I|I'll use|we should|should be|the solution)\b",
    re.IGNORECASE,
)
_PLANS = re.compile(
    r"\b(?:I will|I'll|I need to|let me|let's|next,? I|now I|my plan|plan:)\b", re.IGNORECASE
)
_WORD = re.compile(r"[A-Za-z_][\w]{4,}")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Probe:
    """One fact of the original conversation and how to look for it."""

    kind: Kind
    name: str
    needles: tuple[str, ...]
    question: str
    answer: str
    #: Share of ``needles`` that must be present (1.0: all of them).
    share: float = 1.0

    def found_in(self, haystack: str) -> bool:
        """Whether enough needles are in ``haystack`` (from :func:`request_text`)."""
        found = sum(normalize(needle) in haystack for needle in self.needles)
        return found >= self.share * len(self.needles)


def normalize(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def request_text(messages: Sequence[Message]) -> str:
    """Everything a model reads in ``messages``: texts and tool-call arguments
    (their string values decoded), whitespace collapsed."""
    parts: list[str] = []
    for message in messages:
        parts.append(message_text(message))
        for call in tool_calls(message):
            name, arguments = call_name_and_arguments(call)
            parts.append(name)
            parts.extend(_strings(parse_arguments(arguments)) or [arguments])
    return normalize("\n".join(parts))


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


def generate_probes(messages: Sequence[Message], profile: Profile | None = None) -> list[Probe]:
    """The probes of one original conversation, in :data:`KINDS` order."""
    profile = profile or Profile()
    return [
        *_recall(messages),
        *_artifacts(messages, profile),
        *_continuation(messages),
        *_decisions(messages),
    ]


def _last_distinct(items: Iterable[str], count: int) -> list[str]:
    seen: list[str] = []
    for item in reversed(list(items)):
        if item not in seen:
            seen.append(item)
        if len(seen) == count:
            break
    return seen[::-1]


def _command_of(call: dict[str, object] | None) -> str:
    if call is None:
        return "a tool"
    name, _ = call_name_and_arguments(call)
    _, value = key_argument(call)
    return normalize(f"{name} {value}")[:_LINE_CHARS]


def _recall(messages: Sequence[Message]) -> list[Probe]:
    errors: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        if message.get("role") not in RESULT_ROLES:
            continue
        call = call_for_result(messages, i)
        if shows_files(call):
            continue
        command = _command_of(call)
        errors.extend(
            (normalize(line)[:_ERROR_CHARS], command) for line in error_lines(message_text(message))
        )
    probes = []
    by_line = dict(errors)
    for line in _last_distinct((line for line, _ in errors), RECALL_COUNT):
        probes.append(
            Probe("recall", "error", (line,), f"What error did `{by_line[line]}` report?", line)
        )
    tokens = (
        match.group(0).rstrip(".-/")
        for message in messages
        if message.get("role") in ("user", "assistant")
        for match in _TOKEN.finditer(message_text(message))
    )
    said = (token for token in tokens if len(token) >= 4 and _VALUE.search(token))
    for value in _last_distinct(said, RECALL_COUNT):
        probes.append(
            Probe(
                "recall",
                "value",
                (value,),
                f"The conversation mentions `{value}`: what is it, and in what connection?",
                value,
            )
        )
    return probes


def _artifacts(messages: Sequence[Message], profile: Profile) -> list[Probe]:
    lists = collect_files(messages, profile)
    question = "Was the file `{}` read or modified during the session, and which?"
    return [
        *(
            Probe("artifacts", "modified", (p,), question.format(p), "modified")
            for p in lists.modified
        ),
        *(
            Probe("artifacts", "read", (p,), question.format(p), "read")
            for p in lists.read[-READ_COUNT:]
        ),
    ]


def _first_line(text: str) -> str:
    line = next((line for line in text.splitlines() if line.strip()), "")
    return normalize(line)[:_LINE_CHARS]


def _continuation(messages: Sequence[Message]) -> list[Probe]:
    probes = []
    task = next((m for m in messages if m.get("role") == "user"), None)
    if task is not None and _first_line(message_text(task)):
        line = _first_line(message_text(task))
        probes.append(Probe("continuation", "task", (line,), "What is the task?", line))
    plans = [
        sentence
        for message in messages
        if message.get("role") == "assistant"
        for sentence in _sentences(message_text(message))
        if _PLANS.search(sentence)
    ]
    if plans:
        plan = normalize(plans[-1])[:_LINE_CHARS]
        probes.append(
            Probe(
                "continuation",
                "plan",
                (plan,),
                "What did the assistant most recently say it would do next?",
                plan,
            )
        )
    last = _last_result(messages)
    if last is not None:
        call, result = last
        outcome = _first_line(result)
        needles = tuple(n for n in (_command_of(call), outcome) if n)
        probes.append(
            Probe(
                "continuation",
                "command",
                needles,
                "What was the last command or tool call, and what was its outcome?",
                " → ".join(needles),
            )
        )
    return probes


def _last_result(messages: Sequence[Message]) -> tuple[dict[str, object], str] | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") in RESULT_ROLES:
            call = call_for_result(messages, i)
            if call is not None:
                return call, message_text(messages[i])
    return None


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if len(s.strip()) > 20]


def _decisions(messages: Sequence[Message]) -> list[Probe]:
    said = [
        sentence
        for message in messages
        if message.get("role") == "assistant"
        for sentence in _sentences(message_text(message))
        if _DECIDES.search(sentence)
    ]
    probes = []
    for sentence in _last_distinct(said, DECISION_COUNT):
        words = tuple(dict.fromkeys(_WORD.findall(sentence)))[:_DECISION_WORDS]
        if len(words) < 3:
            continue
        topic = " ".join(words[:3])
        probes.append(
            Probe(
                "decisions",
                "decision",
                words,
                f"What did the assistant decide or conclude about {topic}?",
                normalize(sentence),
                DECISION_SHARE,
            )
        )
    return probes
