"""What recall gets back: removed facts a model reads again through ``compaction_recall``.

For each body and window, the conversation is compacted twice as the proxy
compacts it — with the caller's salt, once with ``Profile.recall`` on and
once off — and the facts of its tool outputs that the compacted request no
longer shows are looked for through recall:

    fact     drawn from (the original conversation)             removed when
    read     each output that shows a file (facts.py's rule):     the compacted request does
             its longest line in the middle third of the file     not hold it (whitespace
    error    facts.py's last five distinct error lines, each      collapsed, at most its first
             in the newest output that printed it                 ERROR_CHARS characters)

A **scripted model** then plays what an agent would do for each removed fact:
it takes the ref of the output the fact came from — only if that ref is
written somewhere in the compacted request (a brief, a ledger entry, a
summary's file list): a model can only ask for a ref it reads — and calls the
tool for the lines around the fact (:data:`AROUND` either side); when the
answer's note says more lines follow and the fact has not come back yet, it
calls again from there, up to the model's ``recall_rounds``. Each call is
answered by the proxy's own code (:class:`proxy.recall.Rounds`: the same
lookup in the request's originals, slice, and token budget per request), and
the fact counts as recovered when the answers hold it. The oracle is the one
thing a real model lacks: it knows which ref and which line it needs; so the
figures are what recall *can* give back, and a real model's share is at most
that.

Tokens are the proxy's counter's (:meth:`proxy.session.service.Conversations.counter`
builds it the same way): per call, the tool's answer; per request, the tool
definition as each API's surface appends it, and the refs' markers (tokens
after with recall on minus off). Pure computation, no network; run by
``compaction-proxy eval`` (:func:`evaluate_recall`), not by ``make test``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from compaction import (
    REF_PATTERN,
    CannotFitError,
    Message,
    Profile,
    TokenCounter,
    check_messages,
    compact,
    encoding_for_model,
    message_text,
    ref_of,
    splits_digits,
)
from evaluation.corpus import Body
from evaluation.facts import (
    ERROR_CHARS,
    _calls_by_id,
    _observation,
    _shows_file,
    collapse,
    last_errors,
)
from evaluation.probes import request_text
from proxy.dialects.anthropic.recall import ANTHROPIC_RECALL
from proxy.dialects.chat.recall import CHAT_RECALL
from proxy.dialects.recall import RecallCall, RecallSurface
from proxy.dialects.responses.recall import RESPONSES_RECALL
from proxy.recall import Plan, Rounds

#: The windows recall is measured at: the small ones, where compaction removes most.
RECALL_WINDOWS = (8_192, 16_384)
#: The caller's salt the refs are keyed with (the proxy uses the caller's scope).
SALT = "compaction-proxy-eval"
#: Lines either side of the fact's line the scripted model asks for.
AROUND = 20
#: A read line shorter than this (trimmed) says too little to be looked for.
MIN_LINE_CHARS = 12

RemovableKind = Literal["read", "error"]
REMOVABLE_KINDS: tuple[RemovableKind, ...] = ("read", "error")

_NEXT = re.compile(r"call again with start_line=([\d,]+)")

#: The recall tool each API's surface appends, with a tool of the client's before it.
_SURFACES: dict[str, tuple[RecallSurface, dict[str, Any]]] = {
    "chat": (CHAT_RECALL, {"type": "function", "function": {"name": "t", "parameters": {}}}),
    "anthropic": (ANTHROPIC_RECALL, {"name": "t", "input_schema": {"type": "object"}}),
    "responses": (RESPONSES_RECALL, {"type": "function", "name": "t", "parameters": {}}),
}


@dataclass(frozen=True)
class OutputFact:
    """A line of one tool output that a model may need again."""

    kind: RemovableKind
    needle: str  #: the line, whitespace collapsed, at most ERROR_CHARS characters
    output: str  #: the whole output, as the client sent it
    line: int  #: where the line is in the output (1-based)

    def kept_in(self, text: str) -> bool:
        return self.needle in text


@dataclass(frozen=True)
class Episode:
    """What the scripted model got for one removed fact."""

    recovered: bool
    ref_seen: bool  #: the output's ref is written in the compacted request
    calls: int  #: recall calls made (one a round: the model calls it alone)
    tokens: tuple[int, ...]  #: the proxy counter's tokens of each answer


@dataclass
class Side:
    """One window's figures for recall on, or off."""

    facts: dict[RemovableKind, int] = field(
        default_factory=lambda: dict.fromkeys(REMOVABLE_KINDS, 0)
    )
    removed: dict[RemovableKind, int] = field(
        default_factory=lambda: dict.fromkeys(REMOVABLE_KINDS, 0)
    )
    recovered: dict[RemovableKind, int] = field(
        default_factory=lambda: dict.fromkeys(REMOVABLE_KINDS, 0)
    )
    ref_seen: int = 0  #: removed facts whose output's ref the compacted request shows
    calls: list[int] = field(default_factory=list)  #: per recovered fact
    answer_tokens: list[int] = field(default_factory=list)  #: per call
    tokens_after: int = 0  #: summed over the compacted bodies

    def add(self, fact: OutputFact, kept: bool, episode: Episode | None) -> None:
        self.facts[fact.kind] += 1
        if kept or episode is None:
            return
        self.removed[fact.kind] += 1
        self.ref_seen += episode.ref_seen
        self.answer_tokens.extend(episode.tokens)
        if episode.recovered:
            self.recovered[fact.kind] += 1
            self.calls.append(episode.calls)


@dataclass
class RecallCell:
    """The recall figures of one window."""

    window: int
    bodies: int = 0
    compacted: int = 0
    on: Side = field(default_factory=Side)
    off: Side = field(default_factory=Side)


def proxy_counter(model: str | None, profile: Profile) -> TokenCounter:
    """A counter built as the proxy builds its own for ``model``."""
    return TokenCounter(
        encoding=encoding_for_model(model),
        image_tokens=profile.image_tokens,
        digits_apart=splits_digits(model),
    )


def tool_tokens(counter: TokenCounter) -> dict[str, int]:
    """Tokens the recall tool's definition adds to every request it is sent with, per API."""
    costs = {}
    for api, (surface, client_tool) in _SURFACES.items():
        body = {surface.items_key: [{"role": "user", "content": "hi"}], "tools": [client_tool]}
        tooled = surface.with_tool(body)
        assert tooled is not None
        costs[api] = counter.count_text(orjson.dumps(tooled["tools"][-1]).decode())
    return costs


# --- the facts ----------------------------------------------------------------------


def _outputs(messages: Sequence[Message]) -> list[tuple[str, bool]]:
    """Every tool output's text, oldest first, with whether it shows a file."""
    calls = _calls_by_id(messages)
    found = []
    for message in messages:
        role = message.get("role")
        if role in ("tool", "function"):
            call_id = message.get("tool_call_id")
            call = calls.get(call_id) if isinstance(call_id, str) else None
            found.append((message_text(message), _shows_file(call)))
        elif role == "user" and _observation(message):
            found.append((message_text(message), False))
    return found


def _read_line(output: str) -> tuple[int, str] | None:
    """The longest line of the output's middle third (the first of equals), if long enough."""
    lines = output.split("\n")
    third = len(lines) // 3
    best: tuple[int, str] | None = None
    for number in range(third, max(third + 1, len(lines) - third)):
        line = collapse(lines[number])
        if len(line) >= MIN_LINE_CHARS and (best is None or len(line) > len(best[1])):
            best = (number + 1, line)
    return best


def draw_output_facts(messages: Sequence[Message]) -> list[OutputFact]:
    """The read lines and last error lines of one original conversation's tool outputs."""
    outputs = _outputs(messages)
    facts = []
    for output, shows_file in outputs:
        found = _read_line(output) if shows_file else None
        if found is not None:
            facts.append(OutputFact("read", found[1][:ERROR_CHARS].rstrip(), output, found[0]))
    for error in last_errors(messages):
        located = _newest_holding(outputs, error)
        if located is not None:
            output, number = located
            facts.append(OutputFact("error", error[:ERROR_CHARS].rstrip(), output, number))
    return facts


def _newest_holding(outputs: Sequence[tuple[str, bool]], line: str) -> tuple[str, int] | None:
    for output, shows_file in reversed(outputs):
        if shows_file:
            continue  # facts.py draws no error line from a file being shown
        for number, raw in enumerate(output.split("\n"), start=1):
            if line in collapse(raw):
                return output, number
    return None


# --- the scripted model ---------------------------------------------------------------


def play(
    fact: OutputFact,
    compacted_text: str,
    originals: list[Message],
    room: int,
    profile: Profile,
    counter: TokenCounter,
) -> Episode:
    """The scripted model's calls for one removed fact, answered by the proxy's code."""
    ref = ref_of(SALT, fact.output)
    seen = ref in {match.group(1) for match in REF_PATTERN.finditer(compacted_text)}
    if not seen:
        return Episode(recovered=False, ref_seen=False, calls=0, tokens=())
    plan = Plan(
        surface=CHAT_RECALL,
        body={},
        messages=originals,
        salt=SALT,
        owner="",
        extra_tokens=0,
        room=room,
        rounds=profile.recall_rounds,
        slice_chars=profile.recall_slice_chars,
        restored=0,
    )
    rounds = Rounds(plan, counter, body={})
    start, end = max(1, fact.line - AROUND), fact.line + AROUND
    tokens: list[int] = []
    for call in range(1, profile.recall_rounds + 1):
        arguments = json.dumps({"ref": ref, "start_line": start, "end_line": end})
        [(_, answer)] = rounds.answer([RecallCall(f"call{call}", arguments)])
        tokens.append(counter.count_text(answer))
        if fact.needle in collapse(answer):
            return Episode(recovered=True, ref_seen=True, calls=call, tokens=tuple(tokens))
        more = _NEXT.search(answer)
        if more is None:
            break
        start = int(more.group(1).replace(",", ""))
    return Episode(recovered=False, ref_seen=True, calls=len(tokens), tokens=tuple(tokens))


# --- the run ----------------------------------------------------------------------------


async def evaluate_recall(
    bodies: Iterable[Body],
    windows: Sequence[int],
    profile_for: Callable[[str | None], Profile],
) -> list[RecallCell]:
    """One :class:`RecallCell` per window, for the model's own profile (its strategy)."""
    cells = [RecallCell(window) for window in windows]
    for body in bodies:
        request = body.request
        messages = check_messages(request.get("messages"))
        model = request.get("model")
        base = profile_for(model if isinstance(model, str) else None)
        counter = proxy_counter(model if isinstance(model, str) else None, base)
        facts = draw_output_facts(messages)
        for cell in cells:
            cell.bodies += 1
            profile = dataclasses.replace(base, context_window=cell.window)
            sides = []
            for recall, side in ((True, cell.on), (False, cell.off)):
                try:
                    result = await compact(
                        request,
                        dataclasses.replace(profile, recall=recall),
                        counter=counter,
                        recall_salt=SALT,
                    )
                except CannotFitError:
                    break
                if result.stage == "none":
                    break
                sides.append((side, result, dataclasses.replace(profile, recall=recall)))
            if len(sides) < 2:
                continue
            cell.compacted += 1
            for side, result, side_profile in sides:
                _score(side, result, side_profile, messages, facts, counter)
    return cells


def _score(
    side: Side,
    result: Any,
    profile: Profile,
    originals: list[Message],
    facts: Sequence[OutputFact],
    counter: TokenCounter,
) -> None:
    side.tokens_after += result.tokens_after
    text = request_text(result.messages)
    # As the proxy plans it: what the request has left under its input limit
    # once the tool is added, within the model's recall budget.
    left = result.input_limit - result.tokens_after - tool_tokens(counter)["chat"]
    room = min(left, profile.recall_max_tokens)
    for fact in facts:
        kept = fact.kept_in(text)
        episode = None if kept else play(fact, text, originals, room, profile, counter)
        side.add(fact, kept, episode)


# --- the report -------------------------------------------------------------------------


def _p90(values: Sequence[int]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))])


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def side_json(side: Side, compacted: int) -> dict[str, Any]:
    removed = sum(side.removed.values())
    recovered = sum(side.recovered.values())
    return {
        "facts": dict(side.facts),
        "removed": dict(side.removed),
        "recovered": dict(side.recovered),
        "recovered_share": _share(recovered, removed),
        "ref_seen": side.ref_seen,
        "calls_per_recovered_mean": (round(statistics.mean(side.calls), 2) if side.calls else None),
        "calls_per_recovered_max": max(side.calls) if side.calls else None,
        "calls": len(side.answer_tokens),
        "tokens_per_call_median": (
            statistics.median(side.answer_tokens) if side.answer_tokens else None
        ),
        "tokens_per_call_p90": _p90(side.answer_tokens),
        "tokens_after_mean": round(side.tokens_after / compacted) if compacted else None,
    }


def recall_json(cells: Sequence[RecallCell], tool: dict[str, int]) -> dict[str, Any]:
    return {
        "tool_tokens": tool,
        "windows": [
            {
                "window": cell.window,
                "bodies": cell.bodies,
                "compacted": cell.compacted,
                "on": side_json(cell.on, cell.compacted),
                "off": side_json(cell.off, cell.compacted),
            }
            for cell in cells
        ],
    }


def _show(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "—"
    return f"{100 * value:.1f}" if percent else f"{value:,.0f}" if value >= 10 else f"{value:g}"


def recall_table(cells: Sequence[RecallCell], tool: dict[str, int]) -> str:
    """Per window and recall on/off: removed tool-output facts, and what recall got back."""
    rows = [
        "Recall (evaluation/recall.py): lines of tool outputs — a file's line, the last "
        "error lines — the compacted request no longer shows, and the share a scripted "
        "model gets back by calling compaction_recall with the ref it reads (answered by "
        "the proxy's code). Calls are per recovered fact (one a round); tokens are the "
        "proxy counter's, per answer.",
        "",
        "| window | recall | compacted | facts | removed (read + error) | ref shown | "
        "recovered % | calls per fact (mean, max) | tokens per answer (median, p90) | "
        "tokens after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        for name, side in (("on", cell.on), ("off", cell.off)):
            data = side_json(side, cell.compacted)
            removed = data["removed"]
            calls = (
                "—"
                if data["calls_per_recovered_mean"] is None
                else f"{data['calls_per_recovered_mean']:g}, {data['calls_per_recovered_max']}"
            )
            tokens = (
                "—"
                if data["tokens_per_call_median"] is None
                else f"{_show(data['tokens_per_call_median'])}, "
                f"{_show(data['tokens_per_call_p90'])}"
            )
            rows.append(
                f"| {cell.window:,} | {name} | {cell.compacted}/{cell.bodies} | "
                f"{sum(data['facts'].values())} | "
                f"{sum(removed.values())} ({removed['read']} + {removed['error']}) | "
                f"{data['ref_seen']} | {_show(data['recovered_share'], percent=True)} | "
                f"{calls} | {tokens} | {_show(data['tokens_after_mean'])} |"
            )
    costs = ", ".join(f"{api} {tokens}" for api, tokens in tool.items())
    rows += [
        "",
        f"The recall tool's definition adds to each request it is sent with: {costs} tokens.",
    ]
    return "\n".join(rows)
