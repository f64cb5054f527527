"""``compaction-proxy inspect``: what a user needs to see why a conversation is large."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from compaction import (
    TokenCounter,
    calibrated_budget,
    call_name_and_arguments,
    group_messages,
    head_end,
    key_argument,
    requested_output_tokens,
    tail_start,
    tool_calls,
    validate_tool_pairing,
)
from config import ModelConfig

#: How each source of a context window is named where it is shown.
WINDOW_SOURCES = {
    "override": "set in the configuration",
    "client": "asked for by the client's anthropic-beta header",
    "learned": "learned from the upstream's overflow error",
    "server": "stated by the upstream server (llama.cpp /props, the /v1/models listing, "
    "LM Studio /api/v0/models, Ollama /api/show or /api/ps)",
    "table": "the built-in model table",
    "default": "[compaction].context_window: the table does not know this model",
    "empty-stream": "narrowed after the upstream answered a longer stream with nothing",
}


_API_NAMES = {
    "chat": "Chat Completions",
    "anthropic": "Anthropic Messages (read as the proxy maps it)",
    "responses": "OpenAI Responses (read as the proxy maps it)",
}


def _describe_group(messages: list[dict[str, Any]], start: int) -> str:
    opener = messages[start]
    calls = tool_calls(opener)
    if calls:
        described = []
        for call in calls[:3]:
            name, _ = call_name_and_arguments(call)
            _, value = key_argument(call)
            value = value.replace("\n", " ")
            described.append(f"{name}({value[:50]}{'…' if len(value) > 50 else ''})")
        more = f" +{len(calls) - 3}" if len(calls) > 3 else ""
        return "assistant → " + ", ".join(described) + more
    return str(opener.get("role"))


def render_inspection(
    body: dict[str, Any], config: ModelConfig, *, top: int = 10, api: str = "chat"
) -> str:
    """A plain-text report: budget, tokens by role and group, head/tail, pairing;
    ``body`` in the engine's view (another ``api``'s mapped as the proxy maps it)."""
    messages: list[dict[str, Any]] = body["messages"]
    profile = config.profile
    counter = TokenCounter(config.model, image_tokens=profile.image_tokens)
    # The figures compaction uses: W − R less the safety margin (ratio 1: no upstream here).
    budget = calibrated_budget(profile, requested_output_tokens(body))
    counts = counter.count_messages(messages)
    overhead = counter.request_overhead(body)
    total = sum(counts) + overhead
    groups = group_messages(messages)
    head = head_end(messages, groups, profile.head_count)
    tail = tail_start(groups, counts, budget.tail_budget, head)
    turns = sum(1 for m in messages if m.get("role") == "user")

    margin = (
        f", less the {profile.safety_margin:.0%} safety margin" if profile.safety_margin else ""
    )
    lines = [
        f"model            {config.model or '(none)'}  (tokenizer {counter.encoding_name})",
        f"api              {_API_NAMES.get(api, api)}",
        f"context window   {budget.context_window:,}   ({WINDOW_SOURCES[config.window_source]})",
        f"input limit      {budget.input_limit:,}   (the window less the reserve "
        f"{budget.reserve:,} for the reply{margin})",
        f"trigger          {budget.trigger:,}   (compaction starts above this)",
        f"request          {total:,} tokens ({sum(counts):,} in messages, "
        f"{overhead:,} in tools/schemas/priming)  → "
        + ("would compact" if total > budget.trigger else "forwarded unchanged"),
        f"structure        {len(messages)} messages, {len(groups)} groups, {turns} user turns",
        "",
        "by role          messages     tokens   share",
    ]
    by_role: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for message, count in zip(messages, counts, strict=True):
        entry = by_role[str(message.get("role"))]
        entry[0] += 1
        entry[1] += count
    for role, (n, tokens) in sorted(by_role.items(), key=lambda kv: -kv[1][1]):
        share = tokens / max(sum(counts), 1)
        lines.append(f"  {role:<14} {n:>8} {tokens:>10,} {share:>7.1%}")

    def span(a: int, b: int) -> str:
        return f"messages [{a}, {b})  {sum(counts[a:b]):>8,} tokens"

    lines += [
        "",
        f"head             {span(0, head)}",
        f"middle           {span(head, tail)}",
        f"tail             {span(tail, len(messages))}   (budget {budget.tail_budget:,})",
        "",
        f"largest groups (top {top})",
    ]
    ranked = sorted(groups, key=lambda g: -sum(counts[g.start : g.end]))[:top]
    for group in ranked:
        tokens = sum(counts[group.start : group.end])
        what = _describe_group(messages, group.start)
        lines.append(f"  [{group.start:>4}–{group.end - 1:>4}] {tokens:>8,}  {what}")
    problems = validate_tool_pairing(messages)
    lines.append("")
    if problems:
        lines.append(f"tool pairing     {len(problems)} problem(s); compaction repairs them:")
        lines += [f"  {p}" for p in problems[:20]]
    else:
        lines.append("tool pairing     ok")
    return "\n".join(lines)
