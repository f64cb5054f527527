"""The conformance contract of every dialect: nothing the client sent is silently lost.

One conversation, drawn by hypothesis, is written in each API — text, images
and documents, tool calls with results of every size and with text and images
beside them, parallel calls with a user message between their outputs
(Responses), signed thinking and reasoning, system messages mid-conversation,
``cache_control`` markers anywhere, blocks, parts and items of types no API
has (in user messages, beside and inside tool results, in the model's turns,
as items of their own) and fields no API has at every level — and run
through the real dialect mapping and engine at small windows, so that
pruning, masking, condensing and truncation all happen.
:mod:`tests.proxy.dialects.conformance` then accounts for every block of the
request in what would be sent. The real client bodies
and conversations in ``../shared/fixtures`` go the same way, converted to
each API.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, example, given, settings
from hypothesis import strategies as st

from compaction import (
    REF_PATTERN,
    CannotFitError,
    Profile,
    TokenCounter,
    calibrated_budget,
    compact,
    decide,
    execute,
    find_original,
    new_checkpoint,
    read_conversation,
    validate_tool_pairing,
)
from compaction.chat.messages import is_truncation_note
from proxy.dialects.anthropic import ANTHROPIC, pairing_problems
from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT
from proxy.dialects.responses import RESPONSES
from tests.proxy.dialects.anthropic.sessions import (
    SEEDS,
    claude_code_request,
    from_chat,
    random_request,
    thinking_block,
)
from tests.proxy.dialects.conformance import Accounting, DialectName, account, blocks
from tests.proxy.dialects.responses.shapes import chat_to_responses, codex_request
from tests.proxy.dialects.responses.upstream import pairing_errors

COUNTER = TokenCounter("gpt-4o")
FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures"
DIALECTS: dict[DialectName, Dialect] = {
    "chat": CHAT,
    "anthropic": ANTHROPIC,
    "responses": RESPONSES,
}
CACHE = {"type": "ephemeral"}
_WORDS = "token window tool result file path error module test proxy stream cache".split()
_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
_PDF = "JVBERi0xLjQKJcfsj6IKMSAwIG9iago8PC9UeXBlL0NhdGFsb2c+PgplbmRvYmoK"
_TOOLS = ("Read", "Bash", "Grep", "Edit")
#: Block, part and item types the proxy does not know (one a real client sends).
_INVENTED = ("tool_reference", "hologram_20990101", "x-vendor.cache_edits")


# --- one conversation, three APIs ----------------------------------------------------
#
# A conversation is a list of steps, each a plain tuple drawn below:
#   ("user", parts)                      parts: [(kind, size, marked)], kind text|image|document
#   ("tools", thinking, text, calls, beside, between)
#       calls: [(name, path, output size, image in output, marked)]; beside: parts after the
#       results; between: Responses puts the beside message between the first two outputs
#   ("reply", size, marked)              an assistant text, then the user's "Go on."
#   ("system", size)                     a system message inserted mid-conversation
#   ("search", count)                    a tool call whose result holds ``count`` blocks of
#                                        a type no API has (a tool search's references)
#   ("item", kind)                       a block of a type no API has in the model's turn
#                                        (an item of its own in Responses)


def _text(size: int, seed: int) -> str:
    return " ".join(_WORDS[(seed + i * 7) % len(_WORDS)] for i in range(size))


_parts = st.lists(
    st.tuples(
        st.sampled_from(["text", "text", "text", "image", "document", "unknown"]),
        st.sampled_from([3, 40, 400, 1_500]),
        st.booleans(),
    ),
    min_size=1,
    max_size=3,
)
_calls = st.lists(
    st.tuples(
        st.sampled_from(_TOOLS),
        st.sampled_from(["src/app.py", "tests/test_app.py", "README.md"]),
        st.sampled_from([0, 30, 600, 3_000, 9_000]),
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=3,
)
_step = st.one_of(
    st.tuples(st.just("user"), _parts),
    st.tuples(
        st.just("tools"),
        st.booleans(),
        st.sampled_from([0, 0, 20, 900]),
        _calls,
        st.one_of(st.just([]), _parts),
        st.booleans(),
    ),
    st.tuples(st.just("reply"), st.sampled_from([5, 600]), st.booleans()),
    st.tuples(st.just("system"), st.sampled_from([8, 60])),
    st.tuples(st.just("search"), st.integers(1, 3)),
    st.tuples(st.just("item"), st.integers(0, len(_INVENTED) - 1)),
)
conversations = st.lists(_step, min_size=2, max_size=12)
#: The seed of the fields no API has, added at every level (``None``: none).
field_seeds = st.one_of(st.none(), st.integers(0, 2**16))


def _invented(seed: int) -> dict[str, Any]:
    """A block of a type no API has, with what such a block may carry."""
    return {"type": _INVENTED[seed % len(_INVENTED)], "ref": f"u{seed}", "data": {"n": seed}}


def invented(value: Any) -> bool:
    """Whether ``value`` holds a block of a type no API has."""
    if isinstance(value, dict):
        return value.get("type") in _INVENTED or any(invented(v) for v in value.values())
    if isinstance(value, list):
        return any(invented(v) for v in value)
    return False


#: Keys whose values are the API's own text or arguments, never given fields.
_NO_FIELDS = frozenset({"input", "cache_control", "arguments", "data"})


def with_fields(body: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """``body`` with fields no API has (``x_…``) added to the request, to each
    message or item and to the blocks, parts and calls in them."""
    if seed is None:
        return body
    rng = random.Random(seed)
    names = iter(range(1 << 30))  # each field its own name: merged messages keep them all

    def value(n: int) -> Any:
        return rng.choice([f"v{n}", {"n": n, "s": [n, "x"]}, n, [f"w{n}"]])

    def sprinkle(node: Any, depth: int) -> Any:
        if isinstance(node, list):
            return [sprinkle(v, depth) for v in node]
        if not isinstance(node, dict) or depth > 3:
            return node
        out = {k: v if k in _NO_FIELDS else sprinkle(v, depth + 1) for k, v in node.items()}
        owned = "type" in node or "role" in node or "function" in node or depth == 0
        if owned and rng.random() < 0.5:
            out[f"x_{next(names)}"] = value(rng.randrange(1_000))
        return out

    return dict(sprinkle(body, 0))


def _chat_part(kind: str, size: int, marked: bool, seed: int) -> dict[str, Any]:
    if kind == "image":
        part: dict[str, Any] = {
            "type": "image_url",
            "image_url": {"url": f"data:image/png;base64,{_PNG}{seed}"},
        }
    elif kind == "document":
        data = f"data:application/pdf;base64,{_PDF}{seed}"
        part = {"type": "file", "file": {"filename": f"doc{seed}.pdf", "file_data": data}}
    elif kind == "unknown":
        part = _invented(seed)
    else:
        part = {"type": "text", "text": f"[{seed}] " + _text(size, seed)}
    if marked:
        part["cache_control"] = CACHE
    return part


def _anthropic_part(kind: str, size: int, marked: bool, seed: int) -> dict[str, Any]:
    if kind == "image":
        source = {"type": "base64", "media_type": "image/png", "data": f"{_PNG}{seed}"}
        part: dict[str, Any] = {"type": "image", "source": source}
    elif kind == "document" and size > 100:  # a plain-text document the engine must not cut
        source = {"type": "text", "media_type": "text/plain", "data": _text(size, seed)}
        part = {"type": "document", "source": source, "title": f"notes {seed}"}
    elif kind == "document":
        source = {"type": "base64", "media_type": "application/pdf", "data": f"{_PDF}{seed}"}
        part = {"type": "document", "source": source}
    elif kind == "unknown":
        part = _invented(seed)
    else:
        part = {"type": "text", "text": f"[{seed}] " + _text(size, seed)}
    if marked:
        part["cache_control"] = CACHE
    return part


def _responses_part(kind: str, size: int, marked: bool, seed: int) -> dict[str, Any]:
    if kind == "image":
        return {"type": "input_image", "image_url": f"data:image/png;base64,{_PNG}{seed}"}
    if kind == "document":
        data = f"data:application/pdf;base64,{_PDF}{seed}"
        return {"type": "input_file", "filename": f"doc{seed}.pdf", "file_data": data}
    if kind == "unknown":
        return _invented(seed)
    return {"type": "input_text", "text": f"[{seed}] " + _text(size, seed)}


def _output(size: int, seed: int) -> str:
    return "\n".join(f"{i}: " + _text(8, seed + i) for i in range(size // 50)) or "ok"


def to_chat(steps: list[Any]) -> dict[str, Any]:
    system = {"role": "system", "content": [_chat_part("text", 60, True, 0)]}
    messages: list[dict[str, Any]] = [system, {"role": "user", "content": "Do the task."}]
    for n, step in enumerate(steps, 1):
        seed = n * 100
        if step[0] == "user":
            parts = [_chat_part(k, s, m, seed + i) for i, (k, s, m) in enumerate(step[1])]
            messages.append({"role": "user", "content": parts})
        elif step[0] == "tools":
            _, _, text, calls, beside, _ = step
            tool_calls = [
                {
                    "id": f"call_{seed}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps({"path": path})},
                }
                for i, (name, path, *_) in enumerate(calls)
            ]
            content = _text(text, seed) if text else None
            messages.append({"role": "assistant", "content": content, "tool_calls": tool_calls})
            for i, (_, _, size, _, marked) in enumerate(calls):
                output: Any = _output(size, seed + i)
                if marked:
                    output = [{"type": "text", "text": output, "cache_control": CACHE}]
                messages.append(
                    {"role": "tool", "tool_call_id": f"call_{seed}_{i}", "content": output}
                )
            if beside:
                parts = [_chat_part(k, s, m, seed + 50 + i) for i, (k, s, m) in enumerate(beside)]
                messages.append({"role": "user", "content": parts})
        elif step[0] == "reply":
            messages.append({"role": "assistant", "content": _text(step[1], seed)})
            messages.append({"role": "user", "content": [_chat_part("text", 2, step[2], seed)]})
        elif step[0] == "search":
            call = {"id": f"call_{seed}", "type": "function", "function": _search_call(seed)}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            found = [_invented(seed + i) for i in range(step[1])]
            listing = [_chat_part("text", 30, False, seed), *found]
            messages.append({"role": "tool", "tool_call_id": f"call_{seed}", "content": listing})
        elif step[0] == "item":
            parts = [_chat_part("text", 5, False, seed), _invented(seed + step[1])]
            messages.append({"role": "assistant", "content": parts})
            messages.append({"role": "user", "content": "Go on."})
        else:
            messages.append({"role": "system", "content": f"[{seed}] " + _text(step[1], seed)})
    return {"model": "gpt-4o", "max_tokens": 256, "messages": messages}


def _search_call(seed: int) -> dict[str, str]:
    """A tool search's call (its result loads the tools it names)."""
    return {"name": "ToolSearch", "arguments": json.dumps({"query": f"select:Tool{seed}"})}


def to_anthropic(steps: list[Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Do the task."}]

    def user(blocks: list[dict[str, Any]]) -> None:
        # Consecutive user turns are one message for the API: written as one.
        if messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], list):
            messages[-1] = {**messages[-1], "content": [*messages[-1]["content"], *blocks]}
        else:
            messages.append({"role": "user", "content": blocks})

    for n, step in enumerate(steps, 1):
        seed = n * 100
        if step[0] == "user":
            user([_anthropic_part(k, s, m, seed + i) for i, (k, s, m) in enumerate(step[1])])
        elif step[0] == "tools":
            _, thinking, text, calls, beside, _ = step
            content: list[dict[str, Any]] = []
            if thinking:
                content.append(thinking_block(f"Step {seed}: " + _text(30, seed)))
            if text:
                content.append({"type": "text", "text": _text(text, seed)})
            for i, (name, path, *_) in enumerate(calls):
                content.append(
                    {
                        "type": "tool_use",
                        "id": f"toolu_{seed}_{i}",
                        "name": name,
                        "input": {"path": path},
                    }
                )
            messages.append({"role": "assistant", "content": content})
            answer: list[dict[str, Any]] = []
            for i, (_, _, size, image, marked) in enumerate(calls):
                output: Any = _output(size, seed + i)
                if image:
                    output = [
                        {"type": "text", "text": output},
                        _anthropic_part("image", 0, False, seed),
                    ]
                result = {
                    "type": "tool_result",
                    "tool_use_id": f"toolu_{seed}_{i}",
                    "content": output,
                }
                if marked:
                    result["cache_control"] = CACHE
                answer.append(result)
            answer += [
                _anthropic_part(k, s, m, seed + 50 + i) for i, (k, s, m) in enumerate(beside)
            ]
            messages.append({"role": "user", "content": answer})
        elif step[0] == "reply":
            messages.append({"role": "assistant", "content": _text(step[1], seed)})
            user([_anthropic_part("text", 2, step[2], seed)])
        elif step[0] == "search":
            search = _search_call(seed)
            use = {
                "type": "tool_use",
                "id": f"toolu_{seed}",
                "name": search["name"],
                "input": json.loads(search["arguments"]),
            }
            messages.append({"role": "assistant", "content": [use]})
            found = [_invented(seed + i) for i in range(step[1])]
            result = {
                "type": "tool_result",
                "tool_use_id": f"toolu_{seed}",
                "content": [_anthropic_part("text", 30, False, seed), *found],
            }
            messages.append({"role": "user", "content": [result]})
        elif step[0] == "item":
            blocks = [_anthropic_part("text", 5, False, seed), _invented(seed + step[1])]
            messages.append({"role": "assistant", "content": blocks})
            user([_anthropic_part("text", 2, False, seed)])
        else:
            messages.append({"role": "system", "content": f"[{seed}] " + _text(step[1], seed)})
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Go on."})
    system = [{"type": "text", "text": _text(60, 0), "cache_control": CACHE}]
    return {"model": "claude-sonnet-4-6", "max_tokens": 256, "system": system, "messages": messages}


def to_responses(steps: list[Any]) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Do it."}]}
    ]
    for n, step in enumerate(steps, 1):
        seed = n * 100
        if step[0] == "user":
            parts = [_responses_part(k, s, m, seed + i) for i, (k, s, m) in enumerate(step[1])]
            items.append({"type": "message", "role": "user", "content": parts})
        elif step[0] == "tools":
            _, thinking, text, calls, beside, between = step
            if thinking:
                items.append(
                    {
                        "type": "reasoning",
                        "id": f"rs_{seed}",
                        "summary": [{"type": "summary_text", "text": _text(30, seed)}],
                        "encrypted_content": f"gAAAAB{seed}" + "x" * 80,
                    }
                )
            if text:
                part = {"type": "output_text", "text": _text(text, seed), "annotations": []}
                items.append({"type": "message", "role": "assistant", "content": [part]})
            for i, (name, path, *_) in enumerate(calls):
                items.append(
                    {
                        "type": "function_call",
                        "call_id": f"call_{seed}_{i}",
                        "name": name,
                        "arguments": json.dumps({"path": path}),
                    }
                )
            outputs: list[dict[str, Any]] = []
            for i, (_, _, size, image, _) in enumerate(calls):
                output: Any = _output(size, seed + i)
                if image:
                    output = [
                        {"type": "input_text", "text": output},
                        _responses_part("image", 0, False, seed),
                    ]
                outputs.append(
                    {
                        "type": "function_call_output",
                        "call_id": f"call_{seed}_{i}",
                        "output": output,
                    }
                )
            message = None
            if beside:
                parts = [
                    _responses_part(k, s, m, seed + 50 + i) for i, (k, s, m) in enumerate(beside)
                ]
                message = {"type": "message", "role": "user", "content": parts}
            if message is not None and between and len(outputs) > 1:
                items += [outputs[0], message, *outputs[1:]]  # Codex's view_image
            else:
                items += outputs + ([message] if message else [])
        elif step[0] == "reply":
            part = {"type": "output_text", "text": _text(step[1], seed), "annotations": []}
            items.append({"type": "message", "role": "assistant", "content": [part]})
            items.append({"type": "message", "role": "user", "content": "Go on."})
        elif step[0] == "search":
            call = {"type": "function_call", "call_id": f"call_{seed}", **_search_call(seed)}
            found = [_invented(seed + i) for i in range(step[1])]
            output = [_responses_part("text", 30, False, seed), *found]
            answer = {"type": "function_call_output", "call_id": f"call_{seed}", "output": output}
            items += [call, answer]
        elif step[0] == "item":
            items.append({**_invented(seed + step[1]), "id": f"it_{seed}"})
        else:
            text = f"[{seed}] " + _text(step[1], seed)
            items.append({"type": "message", "role": "developer", "content": text})
    return {
        "model": "gpt-5",
        "instructions": _text(60, 0),
        "input": items,
        "max_output_tokens": 256,
        "store": False,
    }


WRITERS = {"chat": to_chat, "anthropic": to_anthropic, "responses": to_responses}
#: Whose conversation, as the proxy keys its refs (recall is on by default).
SALT = "conformance"


# --- running a request through the proxy's mapping and engine ---------------------


def _send(
    dialect: DialectName, body: dict[str, Any], profile: Profile, reason: Any = "threshold"
) -> tuple[Any, dict[str, Any]] | None:
    """What the proxy would send for ``body`` (``None``: it answers 400, sends nothing)."""
    mapped = DIALECTS[dialect].to_engine(body)
    try:
        result = asyncio.run(
            compact(mapped.request, profile, reason=reason, counter=COUNTER, recall_salt=SALT)
        )
    except CannotFitError:
        return None
    sent = DIALECTS[dialect].from_engine(body, mapped, result.messages)
    # Every ref in what is sent reads back an original of this request.
    refs = REF_PATTERN.findall(orjson.dumps(sent).decode())
    for ref in refs:
        assert find_original(mapped.messages, SALT, ref) is not None, (ref, result.notes)
    if refs and currently_in_test_context():  # a hypothesis example (not the corpus)
        event("refs sent")
    return result, sent


def _pairing(dialect: DialectName, sent: dict[str, Any]) -> list[Any]:
    if dialect == "chat":
        return list(validate_tool_pairing(sent["messages"]))
    if dialect == "anthropic":
        return pairing_problems(sent["messages"])
    return pairing_errors(sent["input"]) if isinstance(sent.get("input"), list) else []


def assert_conforms(
    dialect: DialectName, body: dict[str, Any], profile: Profile, reason: Any = "threshold"
) -> tuple[Any, Accounting] | None:
    """Send ``body`` and assert the accounting and the API's pairing rule on it."""
    before = copy.deepcopy(body)
    done = _send(dialect, body, profile, reason)
    assert body == before, "the request was mutated"
    if done is None:
        return None
    result, sent = done
    original = blocks(dialect, body)
    accounting = account(
        original, blocks(dialect, sent), moves_markers=dialect == "anthropic", opaque=invented
    )
    assert accounting.problems == (), (result.stage, result.notes, accounting.problems)
    assert accounting.total == len(original)
    assert _lost_fields(dialect, body, sent, accounting) == [], result.notes
    # The client's own breaks (tau-bench reuses call ids) are the client's.
    known = {str(p) for p in _pairing(dialect, body)}
    assert [p for p in _pairing(dialect, sent) if str(p) not in known] == [], result.notes
    return result, accounting


def _lost_fields(
    dialect: DialectName, body: dict[str, Any], sent: dict[str, Any], accounting: Accounting
) -> list[str]:
    """The fields no API has that did not reach the upstream: the request's own,
    and those of each message or item a block of which was forwarded, briefed
    or cut in place (on the message that block is in now). A text truncation
    cut to an excerpt is a message of the proxy's own."""
    lost = [k for k in body if k.startswith("x_") and sent.get(k) != body[k]]
    key = "input" if dialect == "responses" else "messages"
    excerpted = any(
        b.role == "user" and is_truncation_note({"role": "user", "content": b.text})
        for b in blocks(dialect, sent)
    )
    for was, now, how in accounting.placed:
        if not (was.startswith(key) and now.startswith(key)) or (how == "cut" and excerpted):
            continue
        before = body[key][int(was[len(key) + 1 : was.index("]")])]
        after = sent[key][int(now[len(key) + 1 : now.index("]")])]
        lost += [
            f"{was} {k} (now {now})"
            for k in before
            if k.startswith("x_") and after.get(k) != before[k]
        ]
    return lost


profiles = st.one_of(
    st.builds(
        Profile,
        context_window=st.sampled_from([2_048, 4_096, 8_192]),
        keep_recent_tokens=st.sampled_from([300, 1_500, 6_000]),
        head_count=st.integers(0, 2),
        summarizer=st.just("extractive"),
        strategy=st.sampled_from(["summary", "summary", "mask", "hybrid"]),
        threshold=st.one_of(st.none(), st.just(1_500)),
    ),
    # A large window with a threshold: pruning or masking alone is often enough.
    st.builds(
        Profile,
        context_window=st.just(200_000),
        keep_recent_tokens=st.sampled_from([300, 1_500]),
        head_count=st.integers(0, 2),
        summarizer=st.just("extractive"),
        strategy=st.sampled_from(["summary", "mask"]),
        threshold=st.sampled_from([3_000, 6_000, 12_000]),
    ),
)
reasons = st.sampled_from(["threshold", "threshold", "overflow", "manual"])
_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("dialect", list(DIALECTS))
@_SETTINGS
@given(steps=conversations, profile=profiles, reason=reasons, fields=field_seeds)
def test_every_block_of_a_request_is_accounted_for_in_what_is_sent(
    dialect: DialectName, steps: list[Any], profile: Profile, reason: str, fields: int | None
) -> None:
    body = with_fields(WRITERS[dialect](steps), fields)
    done = assert_conforms(dialect, body, profile, reason)
    event(f"stage {done[0].stage}" if done else "refused: cannot fit")
    if done and invented(body):
        event(f"unknown types, stage {done[0].stage}")


def _next_turn(dialect: DialectName, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the model's answer and one more user message after it."""
    if dialect == "responses":
        answer = {"type": "message", "role": "assistant", "content": "Done."}
        ask = {"type": "message", "role": "user", "content": "And then?"}
        return {**body, "input": [*body["input"], answer, ask]}
    turn = [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "And then?"}]
    return {**body, "messages": [*body["messages"], *turn]}


def _through_a_checkpoint(
    dialect: DialectName, body: dict[str, Any], profile: Profile, stored: dict[str, Any]
) -> tuple[Any, Any, dict[str, Any]]:
    mapped = DIALECTS[dialect].to_engine(body)
    conversation = read_conversation(mapped.request, mapped.messages, COUNTER, profile.head_count)
    budget = calibrated_budget(profile, mapped.request.get("max_tokens") or 0)
    decision = decide(conversation, profile, budget, stored=stored)
    result = asyncio.run(execute(conversation, decision))
    if stored:
        event("checkpoint applied" if decision.checkpoint is not None else "not applied")
    return conversation, result, DIALECTS[dialect].from_engine(body, mapped, result.messages)


@pytest.mark.parametrize("dialect", list(DIALECTS))
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(steps=conversations, profile=profiles)
# The first request truncates, dropping a tool search result (opaque) with a
# note; the next one, built from that checkpoint, condenses: the note rides
# along rather than being summarized as if the summary stood for what it dropped.
@example(
    steps=[
        ("user", [("text", 3, False)]),
        ("search", 1),
        ("user", [("text", 1500, False), ("unknown", 3, False)]),
        ("reply", 600, False),
    ],
    profile=Profile(
        context_window=2048,
        keep_recent_tokens=300,
        head_count=0,
        summarizer="extractive",
        strategy="summary",
        threshold=None,
    ),
)
def test_the_next_request_over_a_stored_checkpoint_is_accounted_for_too(
    dialect: DialectName, steps: list[Any], profile: Profile
) -> None:
    """The compaction a request leaves, read back from a store (equal copies) and
    applied to the next request, loses nothing of that request either: the
    newest message of the first (mapped differently once it is not the newest)
    is never inside the span the checkpoint covers."""
    body = WRITERS[dialect](steps)
    try:
        conversation, result, _ = _through_a_checkpoint(dialect, body, profile, {})
    except CannotFitError:
        return
    made = new_checkpoint(conversation, result, id="c", created_at=0.0, progress_ok=True)
    if made is None:
        return
    made = dataclasses.replace(
        made, replacement=tuple(orjson.loads(orjson.dumps(made.replacement)))
    )
    later = _next_turn(dialect, body)
    try:
        _, again, sent = _through_a_checkpoint(dialect, later, profile, {made.end_hash: made})
    except CannotFitError:
        return
    accounting = account(
        blocks(dialect, later),
        blocks(dialect, sent),
        moves_markers=dialect == "anthropic",
        opaque=invented,
    )
    assert accounting.problems == (), (again.stage, again.notes, accounting.problems)


# --- every stage, for certain ----------------------------------------------------------

_LONG = [
    ("user", [("text", 40, True), ("image", 0, False)]),
    *[
        (
            "tools",
            True,
            20,
            [
                ("Read", "src/app.py", 6_000, k % 3 == 0, k % 4 == 1),
                ("Bash", "tests", 900, False, False),
            ],
            [("text", 12, k % 2 == 0), ("image", 0, False)] if k % 2 else [],
            True,
        )
        for k in range(12)
    ],
    ("system", 20),
    ("reply", 600, True),
    ("tools", False, 0, [("Grep", "README.md", 3_000, True, True)], [("text", 5, True)], False),
]


@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest.mark.parametrize(
    ("stage", "profile"),
    [
        # A plan free to fill up to prune_target (no slack, no working-set
        # bound): pruning alone is enough.
        (
            "pruned",
            Profile(
                context_window=200_000,
                threshold=28_000,
                keep_recent_tokens=1_500,
                plan_slack=10,
                plan_working_set=0,
            ),
        ),
        ("masked", Profile(context_window=200_000, threshold=18_000, strategy="mask")),
        ("condensed", Profile(context_window=16_000, summarizer="extractive")),
        ("truncated", Profile(context_window=4_096, summarizer="off")),
    ],
)
def test_each_stage_accounts_for_every_block(
    dialect: DialectName, stage: str, profile: Profile
) -> None:
    done = assert_conforms(dialect, WRITERS[dialect](_LONG), profile)
    assert done is not None
    result, accounting = done
    assert result.stage == stage, result.notes
    changed = {"pruned": accounting.briefed, "masked": accounting.briefed}
    assert changed.get(stage, accounting.covered), accounting


def test_a_user_message_between_parallel_outputs_never_leaves_an_output_without_its_call() -> None:
    steps: list[Any] = [
        (
            "tools",
            True,
            0,
            [("Read", "a.py", 3_000, False, False), ("Read", "b.py", 3_000, True, False)],
            [("image", 0, False), ("text", 5, False)],
            True,
        )
        for _ in range(8)
    ]
    body = to_responses(steps)
    assert any(
        item.get("role") == "user" and body["input"][i + 1].get("type") == "function_call_output"
        for i, item in enumerate(body["input"][:-1])
    )
    for window in (4_096, 8_192, 16_000):
        assert_conforms("responses", body, Profile(context_window=window, summarizer="extractive"))


@pytest.mark.parametrize("window", [8_192, 16_384, 32_768])
@pytest.mark.parametrize("dialect", ["anthropic", "responses"])
def test_claude_code_and_codex_sessions_are_accounted_for(
    dialect: DialectName, window: int
) -> None:
    """The shapes those clients send (tests.proxy.dialects.anthropic.sessions and
    tests.proxy.dialects.responses.shapes): Claude Code's reminders beside
    results, markers on the system and the last block, signed thinking;
    Codex's reasoning and patches."""
    if dialect == "anthropic":
        body = claude_code_request(40, output_chars=6_000)
        body["max_tokens"] = 2_048
    else:
        body = codex_request(40)
    done = assert_conforms(dialect, body, Profile(context_window=window, summarizer="extractive"))
    assert done is not None and done[0].stage != "none"


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(seed=SEEDS, window=st.sampled_from([4_096, 8_192, 16_384]))
def test_random_anthropic_requests_are_accounted_for(seed: int, window: int) -> None:
    """Server tool blocks, redacted thinking, results with images, markers on results."""
    assert_conforms(
        "anthropic", random_request(seed), Profile(context_window=window, summarizer="extractive")
    )


# --- the real clients and conversations ------------------------------------------------


def _fixtures(folder: str) -> list[Path]:
    if not FIXTURES.is_dir():
        return []
    return [
        p
        for p in sorted((FIXTURES / folder).glob("*.json"))
        if isinstance(orjson.loads(p.read_bytes()), dict)
    ]


def _in(dialect: DialectName, chat: dict[str, Any]) -> dict[str, Any]:
    if dialect == "chat":
        return chat
    if dialect == "anthropic":
        return from_chat(chat, thinking=True)
    return chat_to_responses(chat)


#: Every client body, and every sixth conversation of each corpus folder (time).
CASES = [
    *_fixtures("clients"),
    *(p for folder in ("mini-swe-agent", "swe-agent", "tau-bench") for p in _fixtures(folder)[::6]),
]


@pytest.mark.corpus
@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_real_conversations_are_accounted_for_in_every_dialect(
    dialect: DialectName, path: Path
) -> None:
    body = _in(dialect, orjson.loads(path.read_bytes()))
    for window in (4_096, 16_000):
        assert_conforms(dialect, body, Profile(context_window=window, summarizer="extractive"))


def test_the_fixtures_are_there() -> None:
    if not FIXTURES.is_dir():
        pytest.skip(f"no fixtures at {FIXTURES} (standalone clone)")
    assert _fixtures("clients") and len(CASES) > 10
