"""Lossless accounting of a compacted request, for any dialect (docs/clients.md).

Every content block of the request the client sent must be, in the request
the proxy sends:

* **forwarded** — a block with the same bytes, in the same order;
* **briefed** — the same call's result (or call) replaced by a text that names
  it: the pruner's brief (``[Read] src/app.py (3,000 chars)``, the tool and its
  key argument), a masking placeholder (the tool), or the Anthropic pairing
  safety net's ``[tool call …]`` / ``[tool result for …]`` text;
* **cut** — the same block with its text (or arguments) shortened in place,
  keeping its start (what truncation and the pruner do to long texts);
* **covered** — absent, where a summary (or a truncation note) stands in the
  sent request between the blocks kept before and after it.

Anything else is silently absent, and :func:`account` says so. A block the
proxy cannot read (``opaque``: a type it does not know, or a tool result
holding one) has no summary that can stand for it: it must be forwarded,
cut or briefed with those blocks still in it, and may be covered only by a
truncation note (hard truncation drops whole groups, after a summary too,
and says so). Blocks are
compared in order: the exact matches are aligned first (a longest common
subsequence of their bytes), then each stretch between two of them is
accounted for on its own. A pinned system message kept verbatim in the middle
of a summarized span does not split that span.

``cache_control`` markers are held too: a cut block keeps its marker and the
request never carries more markers than the client sent; with
``moves_markers`` (Anthropic), a briefed block keeps its marker too and a
covered block's marker is on the summary that covers it. (Chat has no
rebuild: the engine's brief is a tool message's whole content, and a marker
on its parts goes with them.)

:func:`blocks` flattens a request of each dialect into :class:`Block` s;
:func:`account` compares two flattened requests.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from compaction import SUMMARY_MARKER, key_argument, message_text
from compaction.chat.messages import is_truncation_note
from compaction.stages.strategies import PLACEHOLDER_PREFIX

DialectName = Literal["chat", "anthropic", "responses"]
#: Characters of a text's start that a cut keeps at least (the pruner keeps 800,
#: truncation at least 200 of a field's 2/3).
_CUT_KEEPS = 16
#: Characters of a tool name / key argument a brief is checked to show.
_NAME_CHARS = 20
_ARGUMENT_CHARS = 12


@dataclass(frozen=True)
class Block:
    """One content block of a request, with what accounting needs to know of it."""

    where: str  #: e.g. ``messages[3].content[1]``
    role: str  #: ``system``, ``user``, ``assistant`` or ``tool``
    kind: str  #: the block's type: ``text``, ``image``, ``tool_use``, ``function_call``, …
    value: Any = field(repr=False)
    key: str | None = None  #: the call id of a call or a result
    text: str = field(default="", repr=False)  #: what a brief or a cut is read from
    name: str = ""  #: a call's tool name
    arguments: str = field(default="", repr=False)  #: a call's arguments as JSON text

    @property
    def raw(self) -> bytes:
        return self.role.encode() + b"\0" + orjson.dumps(self.value, default=repr)

    def markers(self) -> int:
        """How many ``cache_control`` markers the block carries (its own and inside)."""
        return _count_markers(self.value)


def _count_markers(value: Any) -> int:
    if isinstance(value, dict):
        own = 1 if value.get("cache_control") is not None else 0
        return own + sum(_count_markers(v) for k, v in value.items() if k != "cache_control")
    if isinstance(value, list):
        return sum(_count_markers(v) for v in value)
    return 0


# --- flattening ------------------------------------------------------------------


def blocks(dialect: DialectName, body: dict[str, Any]) -> list[Block]:
    """The content blocks of ``body``, in order."""
    if dialect == "chat":
        return list(_chat(body))
    if dialect == "anthropic":
        return list(_anthropic(body))
    return list(_responses(body))


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    return message_text({"content": value}) if isinstance(value, list) else ""


def _parts(where: str, role: str, content: Any) -> Iterator[Block]:
    if isinstance(content, str):
        yield Block(where, role, "text", content, text=content)
    elif isinstance(content, list):
        for k, part in enumerate(content):
            kind = part.get("type", "?") if isinstance(part, dict) else "?"
            text = part.get("text") if isinstance(part, dict) else None
            yield Block(f"{where}[{k}]", role, str(kind), part, text=text or "")


def _chat(body: dict[str, Any]) -> Iterator[Block]:
    for i, message in enumerate(body.get("messages") or ()):
        role = message.get("role")
        where = f"messages[{i}]"
        if role in ("tool", "function"):
            content = message.get("content")
            key = message.get("tool_call_id") or message.get("name")
            yield Block(where, "tool", "tool_result", content, key, _text_of(content))
            continue
        role = "system" if role in ("system", "developer") else role
        yield from _parts(f"{where}.content", str(role), message.get("content"))
        for k, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") or {}
            yield Block(
                f"{where}.tool_calls[{k}]",
                "assistant",
                "tool_use",
                call,
                call.get("id"),
                name=str(function.get("name") or ""),
                arguments=str(function.get("arguments") or ""),
            )


def _anthropic(body: dict[str, Any]) -> Iterator[Block]:
    yield from _parts("system", "system", body.get("system"))
    for i, message in enumerate(body.get("messages") or ()):
        role = str(message.get("role"))
        content = message.get("content")
        where = f"messages[{i}].content"
        if not isinstance(content, list):
            yield from _parts(where, role, content)
            continue
        for k, block in enumerate(content):
            kind = block.get("type", "?") if isinstance(block, dict) else "?"
            at = f"{where}[{k}]"
            if kind == "tool_use":
                arguments = orjson.dumps(block.get("input", {})).decode()
                yield Block(
                    at,
                    role,
                    kind,
                    block,
                    block.get("id"),
                    name=block.get("name") or "",
                    arguments=arguments,
                )
            elif kind == "tool_result":
                text = _text_of(block.get("content"))
                yield Block(at, role, kind, block, block.get("tool_use_id"), text)
            else:
                text = block.get("text") if isinstance(block.get("text"), str) else ""
                yield Block(at, role, str(kind), block, text=text)


_SYSTEM_ROLES = ("system", "developer")


def _responses(body: dict[str, Any]) -> Iterator[Block]:
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        yield Block("instructions", "system", "text", instructions, text=instructions)
    items = body.get("input")
    if isinstance(items, str):
        yield Block("input", "user", "text", items, text=items)
        return
    for i, item in enumerate(items or ()):
        kind = item.get("type") or "message"
        where = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            role = "system" if role in _SYSTEM_ROLES else str(role)
            yield from _parts(f"{where}.content", role, item.get("content"))
            continue
        call_id = item.get("call_id")
        if call_id is None and kind == "local_shell_call_output":
            call_id = item.get("id")
        if kind.endswith("_output"):
            yield Block(where, "tool", kind, item, call_id, _text_of(item.get("output")))
        elif kind.endswith("_call"):
            arguments = item.get("arguments") if kind == "function_call" else item.get("input")
            yield Block(
                where,
                "assistant",
                kind,
                item,
                call_id,
                name=str(item.get("name") or kind),
                arguments=arguments if isinstance(arguments, str) else "",
            )
        else:
            yield Block(where, "assistant" if kind == "reasoning" else "user", kind, item)


# --- accounting ------------------------------------------------------------------


@dataclass(frozen=True)
class Accounting:
    """Where each block of the original went (its ``where`` in the original)."""

    forwarded: tuple[str, ...]
    briefed: tuple[str, ...]
    cut: tuple[str, ...]
    covered: tuple[str, ...]
    problems: tuple[str, ...]  #: blocks silently absent, markers lost or added
    #: ``(where in the original, where in what is sent, how)`` of every block
    #: that was forwarded, briefed or cut.
    placed: tuple[tuple[str, str, str], ...] = ()

    @property
    def total(self) -> int:
        return len(self.forwarded) + len(self.briefed) + len(self.cut) + len(self.covered)


def is_cover(block: Block) -> bool:
    """Whether a sent block is a summary or a truncation note (it covers a span)."""
    if block.kind not in ("text", "input_text") or block.role != "user":
        return False
    return block.text.startswith(SUMMARY_MARKER) or is_truncation_note(
        {"role": "user", "content": block.text}
    )


def account(
    original: Sequence[Block],
    sent: Sequence[Block],
    *,
    moves_markers: bool = False,
    opaque: Callable[[Any], bool] = lambda value: False,
) -> Accounting:
    """Account for every block of ``original`` in ``sent`` (see the module doc);
    ``opaque`` tells, of a block's value, whether it holds what no summary can
    stand for."""
    calls: dict[str | None, Block] = {
        b.key: b for b in original if b.role == "assistant" and b.key is not None
    }
    # Aligned from the end: what a compaction keeps is the newest, so of two
    # equal blocks ("Go on." twice) the later is the one a kept block matches.
    n, m = len(original), len(sent)
    matcher = difflib.SequenceMatcher(
        None, [b.raw for b in reversed(original)], [b.raw for b in reversed(sent)], autojunk=False
    )
    outcome: dict[int, tuple[str, int | None]] = {}  # original index → (how, sent index)
    pairs = [
        (n - 1 - (a + k), m - 1 - (b + k))
        for a, b, size in matcher.get_matching_blocks()
        for k in range(size)
    ]
    anchors: list[tuple[int, int]] = [(-1, -1), *sorted(pairs), (n, m)]
    for a, b in pairs:
        outcome[a] = ("forwarded", b)
    # A pinned system message is kept verbatim but may move (after the summary,
    # or where the API takes one) and be merged with its neighbours: its text is
    # forwarded wherever it went.
    placed = {b for _, b in pairs}
    for i, block in enumerate(original):
        if i in outcome or block.role != "system":
            continue
        j = next(
            (
                j
                for j, new in enumerate(sent)
                if j not in placed and new.role == "system" and new.text == block.text
            ),
            None,
        )
        if j is not None:
            outcome[i] = ("forwarded", j)
            placed.add(j)
    gaps = [
        (range(a0 + 1, a1), range(b0 + 1, b1)) for (a0, b0), (a1, b1) in itertools.pairwise(anchors)
    ]
    for lost, there in gaps:
        free = [j for j in there if j not in placed]
        for i in lost:
            if i in outcome:
                continue
            found = _replacement(original[i], [sent[j] for j in free], calls)
            if found is not None:
                how, at = found
                outcome[i] = (how, free[at])
                free = free[at + 1 :]
    # A stretch with no summary may be covered by one beyond a pinned system
    # message (kept verbatim in place while the span around it was condensed).
    covers = _covers_by_gap(gaps, anchors, original, sent, _riding(original, opaque))
    problems: list[str] = []
    covering: dict[int, list[int]] = {}
    for g, (lost, _) in enumerate(gaps):
        for i in lost:
            if i in outcome:
                continue
            if covers[g]:
                outcome[i] = ("covered", covers[g][-1])
                covering[i] = covers[g]
            else:
                block = original[i]
                problems.append(f"{block.where} ({block.role} {block.kind}) is silently absent")
    problems.extend(_opaque_problems(original, sent, outcome, covering, opaque))
    if moves_markers:
        problems.extend(_marker_problems(original, sent, outcome, covering))
    else:
        # Chat has no rebuild: the engine's brief is the message's whole content,
        # so a marker inside a briefed result goes with its parts.
        problems.extend(_kept_marker_problems(original, sent, outcome, ("cut",)))
    by: dict[str, list[str]] = {"forwarded": [], "briefed": [], "cut": [], "covered": []}
    for i in sorted(outcome):
        by[outcome[i][0]].append(original[i].where)
    where = tuple(
        (original[i].where, sent[j].where, how)
        for i, (how, j) in sorted(outcome.items())
        if how != "covered" and j is not None
    )
    return Accounting(
        tuple(by["forwarded"]),
        tuple(by["briefed"]),
        tuple(by["cut"]),
        tuple(by["covered"]),
        tuple(problems),
        where,
    )


def _opaque_problems(
    original: Sequence[Block],
    sent: Sequence[Block],
    outcome: dict[int, tuple[str, int | None]],
    covering: dict[int, list[int]],
    opaque: Callable[[Any], bool],
) -> list[str]:
    """What became of the blocks no summary can stand for (see the module doc)."""
    problems = []
    # Hard truncation drops whole groups after a summary is written, and its
    # note says so: in a truncated request, what covers a block is not told apart.
    truncated = any(is_cover(b) and not _is_summary(b) for b in sent)
    for i, (how, j) in outcome.items():
        block = original[i]
        if not opaque(block.value):
            continue
        if how == "covered" and not truncated:
            summaries = [sent[k].where for k in covering.get(i, ()) if _is_summary(sent[k])]
            if summaries:
                problems.append(f"{block.where} ({block.kind}) was condensed into {summaries}")
        elif how == "briefed" and j is not None and not opaque(sent[j].value):
            problems.append(f"{block.where} ({block.kind}) was briefed without what it held")
    return problems


def _is_summary(block: Block) -> bool:
    return is_cover(block) and block.text.startswith(SUMMARY_MARKER)


def _riding(original: Sequence[Block], opaque: Callable[[Any], bool]) -> set[int]:
    """The blocks that ride along after a summary with an opaque one: it, the call
    and results sharing its key, their messages, and the model's turn around them."""
    found = {i for i, b in enumerate(original) if opaque(b.value)}
    keys = {original[i].key for i in found} - {None}
    found |= {i for i, b in enumerate(original) if b.key in keys}
    messages = {_message_of(original[i]) for i in found}
    found |= {i for i, b in enumerate(original) if _message_of(b) in messages}
    for i in sorted(found):
        j = i
        while original[i].role == "assistant" and j > 0 and original[j - 1].role == "assistant":
            j -= 1
            found.add(j)
    return found


def _message_of(block: Block) -> str:
    """``messages[3]`` of ``messages[3].content[1]``."""
    return block.where.split(".", 1)[0]


def _covers_by_gap(
    gaps: list[tuple[range, range]],
    anchors: list[tuple[int, int]],
    original: Sequence[Block],
    sent: Sequence[Block],
    riding: set[int],
) -> list[list[int]]:
    """For each gap, the sent indices of the summaries and notes in it or, when it
    has none, in the gaps beyond the blocks the engine keeps out of order: pinned
    system messages and what rides along with an opaque block (both come right
    after the summary of the span they sat in), and one user message before it
    (the turn a truncation keeps goes after its note, ``[note][turn opener][newest
    groups]``)."""
    own = [[j for j in there if is_cover(sent[j])] for _, there in gaps]
    out = [list(c) for c in own]
    for g in range(len(gaps)):
        if out[g]:
            continue
        for step in (1, -1):
            h, opener = g, step == -1
            # anchors[h + 1] ends gap h, anchors[h] starts it.
            while 0 <= h + step < len(gaps):
                bound = anchors[h + 1] if step == 1 else anchors[h]
                role = original[bound[0]].role if 0 <= bound[0] < len(original) else None
                if role == "user" and opener:
                    opener = False
                elif role != "system" and bound[0] not in riding:
                    break
                h += step
                out[g] += own[h]
                if own[h]:
                    break
    return out


def _replacement(
    block: Block, candidates: Sequence[Block], calls: dict[str | None, Block]
) -> tuple[str, int] | None:
    """``("briefed" | "cut", index)`` of the candidate standing for ``block``."""
    for k, new in enumerate(candidates):
        if new.role != block.role and not _pairing_text(block, new, calls):
            continue
        if _pairing_text(block, new, calls):
            return "briefed", k
        if new.kind != block.kind or new.key != block.key:
            continue
        if _is_result(block) and _names(new.text, block, calls):
            return "briefed", k
        if block.key is not None and block.role == "assistant":
            if new.name == block.name and len(new.arguments) < len(block.arguments):
                return "cut", k
            if _same_but_text(block.value, new.value):
                return "cut", k
        if _is_cut(block.text, new.text) and _same_but_text(block.value, new.value):
            return "cut", k
    return None


def _is_result(block: Block) -> bool:
    return block.kind == "tool_result" or block.kind.endswith("_output")


def _pairing_text(block: Block, new: Block, calls: dict[str | None, Block]) -> bool:
    """The Anthropic pairing safety net wrote ``block`` (a call or result) as ``new``."""
    if new.kind != "text":
        return False
    if block.kind == "tool_use":
        return new.text.startswith(f"[tool call {block.name}(")
    if block.kind == "tool_result":
        return new.text.startswith("[tool result for ")
    return False


def _names(text: str, result: Block, calls: dict[str | None, Block]) -> bool:
    """Whether ``text`` is a brief or placeholder naming the call ``result`` answers."""
    call = calls.get(result.key)
    name = " ".join((call.name if call else "").split())[:_NAME_CHARS] or "tool"
    if text.startswith(PLACEHOLDER_PREFIX):
        return text[len(PLACEHOLDER_PREFIX) :].startswith(name)
    if not text.startswith(f"[{name}"):
        return False
    if call is None:
        return True
    _, value = key_argument({"function": {"name": call.name, "arguments": call.arguments}})
    shown = " ".join(value.split())[:_ARGUMENT_CHARS]
    return shown in text


def _is_cut(before: str, after: str) -> bool:
    keep = min(_CUT_KEEPS, len(after))
    return len(after) < len(before) and after[:keep] == before[:keep]


def _same_but_text(before: Any, after: Any) -> bool:
    """The same block but for the texts (arguments, input, output) it carries."""
    return bool(_shape(before) == _shape(after))


_TEXTS = frozenset({"text", "arguments", "content", "output"})


def _shape(value: Any) -> Any:
    """``value`` with every text a cut may shorten blanked out."""
    if isinstance(value, str):
        return ""
    if isinstance(value, list):
        return [_shape(v) for v in value]
    if isinstance(value, dict):
        return {
            k: "" if k == "input" or (k in _TEXTS and isinstance(v, str)) else _shape(v)
            for k, v in value.items()
        }
    return value


# --- cache_control markers --------------------------------------------------------


def _kept_marker_problems(
    original: Sequence[Block],
    sent: Sequence[Block],
    outcome: dict[int, tuple[str, int | None]],
    kinds: tuple[str, ...] = ("briefed", "cut"),
) -> list[str]:
    problems = []
    for i, (how, j) in outcome.items():
        block = original[i]
        if how in kinds and j is not None and block.markers() and sent[j].markers() == 0:
            problems.append(f"{block.where}: its cache_control did not stay with it")
    before = sum(b.markers() for b in original)
    after = sum(b.markers() for b in sent)
    if after > before:
        problems.append(f"{after} cache_control markers sent, the client sent {before}")
    return problems


def _marker_problems(
    original: Sequence[Block],
    sent: Sequence[Block],
    outcome: dict[int, tuple[str, int | None]],
    covering: dict[int, list[int]],
) -> list[str]:
    problems = _kept_marker_problems(original, sent, outcome)
    for i, candidates in covering.items():
        block = original[i]
        if block.markers() and not any(sent[j].markers() for j in candidates):
            where = ", ".join(sent[j].where for j in candidates)
            problems.append(
                f"{block.where}: condensed, but its cache_control is not on what covers it "
                f"({where})"
            )
    return problems


__all__ = ["Accounting", "Block", "DialectName", "account", "blocks", "is_cover"]
