"""Next-step facts: what the next turns use of the compactable past, and whether the
model was sent it.

Defined from the conversation alone, independently of any summary's format.
At a cut point ``k`` (``messages[k]`` is the assistant turn the model is about
to write)::

    lookahead  = the next LOOKAHEAD assistant messages from k on (k's own first):
                 their text and their tool calls' argument values
    candidates = in the lookahead, every
                   identifier  snake_case, CamelCase or dotted name of ≥ 4 characters
                   path        a word with a "/" or a file extension (src/a.py, setup.cfg)
                   quoted      a string in "…" or '…' of ≥ 4 characters
                   line        a line number: ":123", "line 123", "-n 123,140p"
    facts      = candidates that appear in messages[head:k] (the past a
                 compaction may touch), and NOT in the head (kept by everyone),
                 and NOT in the newest KEEP_GROUPS groups before k (kept by
                 every method)
    kept       = facts present verbatim in what the model was sent at k
                 (every message's text and tool-call arguments)
    reachable  = facts not kept but present in an original tool result or
                 assistant message whose ``[ref: …]`` was sent (the model could
                 read it back)

"Appears" and "present" are the same test: a substring, except for line
numbers, which must stand as a whole number (``123`` is not in ``1234``). The
facts score what a compaction removed that the agent then used: a fact the
model wrote again from a kept summary counts as kept, one it could only guess
does not. Pure functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from compaction import (
    REF_PATTERN,
    Message,
    call_name_and_arguments,
    group_messages,
    message_text,
    ref_of,
    tool_calls,
)
from compaction.chat.recall import original_text
from evaluation.replay.prompts import sent_text
from evaluation.replay.records import FactScore

#: Assistant turns read ahead from the cut point.
LOOKAHEAD: Final = 3
#: Newest groups before the cut that every method keeps.
KEEP_GROUPS: Final = 2
#: Shortest identifier and quoted string counted.
MIN_CHARS: Final = 4
#: Longest quoted string counted (a longer one is a script, not a fact).
MAX_QUOTED_CHARS: Final = 200

_RECALLABLE = ("tool", "function", "assistant")
_NAME = re.compile(r"(?<![\w./-])[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+|(?<![\w./-])[A-Za-z_]\w*")
_PATH = re.compile(r"(?<![\w.-])(?:[\w.-]*/[\w./-]*\w|[\w-]+\.[A-Za-z][A-Za-z0-9]{0,4})(?![\w/])")
_SPAN = f"{{{MIN_CHARS},{MAX_QUOTED_CHARS}}}"
_QUOTED = re.compile(rf'"([^"\n]{_SPAN})"|\'([^\'\n]{_SPAN})\'')
_LINE = re.compile(r"(?::|\bline\s+|-n\s+)(\d+)(?:,(\d+)p?)?")
_CAMEL = re.compile(r"[a-z][A-Z]|[A-Z][a-z]+[A-Z]")


@dataclass(frozen=True)
class Fact:
    """One next-step fact: its text, and whether it is a line number."""

    text: str
    number: bool = False

    def found_in(self, text: str) -> bool:
        if not self.number:
            return self.text in text
        return re.search(rf"(?<!\d){re.escape(self.text)}(?!\d)", text) is not None


def turn_words(message: Message) -> str:
    """The text of ``message`` a next step is read from: its content and the
    string values of its tool calls' arguments (decoded, so JSON's quoting
    does not count as quoted strings)."""
    parts = [message_text(message)]
    for call in tool_calls(message):
        arguments = call_name_and_arguments(call)[1]
        try:
            parts.extend(_strings(json.loads(arguments)))
        except ValueError:
            parts.append(arguments)
    return "\n".join(parts)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def candidates(text: str) -> set[Fact]:
    """Every identifier, path, quoted string and line number in ``text``."""
    found: set[Fact] = set()
    for match in _NAME.finditer(text):
        name = match.group(0)
        if len(name) >= MIN_CHARS and ("_" in name or "." in name or _CAMEL.search(name)):
            found.add(Fact(name.strip("._")))
    for match in _PATH.finditer(text):
        path = match.group(0).rstrip(".")
        if len(path) >= MIN_CHARS and path.strip("./"):
            found.add(Fact(path))
    for match in _QUOTED.finditer(text):
        quoted = (match.group(1) or match.group(2)).strip()
        if len(quoted) >= MIN_CHARS:
            found.add(Fact(quoted))
    for match in _LINE.finditer(text):
        for number in match.groups():
            if number:
                found.add(Fact(number, number=True))
    return {fact for fact in found if len(fact.text) >= (1 if fact.number else MIN_CHARS)}


class SessionFacts:
    """The next-step facts of every cut point of one session (computed once, shared
    by every strategy), and the refs of its tool results for a caller's salt."""

    def __init__(self, messages: Sequence[Message], head: int) -> None:
        self._messages = messages
        self._head = head
        self._texts = [sent_text([m]) for m in messages]
        self._head_text = "\n".join(self._texts[:head])
        self._cache: dict[int, tuple[Fact, ...]] = {}

    def at(self, k: int) -> tuple[Fact, ...]:
        """The facts of cut point ``k``."""
        if k not in self._cache:
            self._cache[k] = self._facts(k)
        return self._cache[k]

    def _facts(self, k: int) -> tuple[Fact, ...]:
        messages = self._messages
        ahead = [i for i in range(k, len(messages)) if messages[i].get("role") == "assistant"]
        wanted: set[Fact] = set()
        for i in ahead[:LOOKAHEAD]:
            wanted |= candidates(turn_words(messages[i]))
        groups = [g for g in group_messages(messages[:k]) if g.start >= self._head]
        kept_from = groups[-KEEP_GROUPS].start if len(groups) >= KEEP_GROUPS else self._head
        past = "\n".join(self._texts[self._head : kept_from])
        newest = "\n".join(self._texts[kept_from:k])
        return tuple(
            sorted(
                (
                    fact
                    for fact in wanted
                    if fact.found_in(past)
                    and not fact.found_in(self._head_text)
                    and not fact.found_in(newest)
                ),
                key=lambda fact: fact.text,
            )
        )

    def refs(self, salt: str) -> dict[str, int]:
        """Each tool result's and assistant message's ref for the caller ``salt``, to
        its index (as the proxy computes it: :func:`compaction.ref_of` of its
        :func:`compaction.recall.original_text`)."""
        return {
            ref_of(salt, original_text(message)): i
            for i, message in enumerate(self._messages)
            if message.get("role") in _RECALLABLE
        }

    def score(
        self, k: int, sent: Sequence[Message], refs: Mapping[str, int] | None = None
    ) -> FactScore:
        """How many of cut ``k``'s facts the model was sent (and could read back by
        a ref it was sent, when ``refs`` maps this caller's refs)."""
        facts = self.at(k)
        text = sent_text(sent)
        missing = [fact for fact in facts if not fact.found_in(text)]
        reachable = 0
        if missing and refs:
            shown = {refs[ref] for ref in REF_PATTERN.findall(text) if ref in refs}
            originals = "\n".join(self._texts[i] for i in sorted(shown) if i < k)
            reachable = sum(1 for fact in missing if fact.found_in(originals))
        return FactScore(len(facts), len(facts) - len(missing), reachable)
