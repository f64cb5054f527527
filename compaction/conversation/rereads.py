"""Re-reads: tool calls the model made again because a compaction took their output away.

A compaction that prunes or summarizes a tool output saves tokens, unless the
model then fetches the same thing again: the saving is paid back, with a
round trip. Counting those calls shows what a compaction cost.

Given a request's messages and the stored checkpoint applied to it (it covers
``covered`` messages after the head; their originals were pruned or
summarized away), two sets of calls are compared:

* the **fetches removed**: the tool calls inside the covered span whose result
  the checkpoint's replacement does not carry as it was (a result short enough
  for the pruner to keep is still in front of the model), each known by its
  name with its canonical arguments (JSON with sorted keys) and by the files
  it read (:func:`compaction.summary.files.files_of_call`);
* the **new calls**: those of the conversation's last assistant message, when
  the request ends with that message's tool results — the request right after
  the model made them.

A new call with the name and arguments of a removed fetch, or one that reads
a file a removed fetch read (``read_file`` with another line range, ``cat`` of
the same path), is a re-read.

A compaction prepared ahead (``precomputed``) is applied first by the request
that crosses the trigger, whose newest calls were made before the model saw
it: nothing is counted against it (the compaction that request makes from it
is counted from the next request on).

Stateless, with no memory per session: a call is "new" in exactly one
request, the first to carry its result; the next request has a user or
assistant message after it. A client that retries the same request (after a
timeout, say) shows the same new calls twice, and they count twice.

Cost: one pass over the covered span's calls (their arguments decoded, and
searched for the files the new calls read; only a call that names one is
parsed for its files) and the last assistant message; the tool outputs are
not read, unless the replacement carries some. Nothing at all for a request
with no checkpoint, or one that does not end with tool results.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from compaction.budget.profile import Profile
from compaction.chat.groups import group_messages
from compaction.chat.messages import RESULT_ROLES, call_name_and_arguments, message_text, tool_calls
from compaction.conversation.checkpoints import Checkpoint
from compaction.conversation.regions import head_end
from compaction.summary.files import files_of_call
from compaction.types import Message


@dataclass(frozen=True)
class Rereads:
    """The re-reads of one request: the tool name of each, in call order."""

    tools: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.tools)

    def __bool__(self) -> bool:
        return bool(self.tools)

    def by_tool(self) -> dict[str, int]:
        """How many re-reads each tool made, in first-seen order."""
        counts: dict[str, int] = {}
        for name in self.tools:
            counts[name] = counts.get(name, 0) + 1
        return counts


NO_REREADS = Rereads()


def count_rereads(
    messages: Sequence[Message],
    checkpoint: Checkpoint | None,
    profile: Profile,
    *,
    head: int | None = None,
) -> Rereads:
    """The calls of the request's newest tool round that fetch again what
    ``checkpoint`` removed from ``messages`` (the client's own messages).

    ``head`` is the index one past the head (:attr:`compaction.Conversation.head`);
    found from ``profile.head_count`` when not given.
    """
    if checkpoint is None or checkpoint.covered <= 0 or checkpoint.precomputed:
        return NO_REREADS
    last = _last_tool_round(messages)
    if last is None:
        return NO_REREADS
    if head is None:
        head = head_end(messages, group_messages(messages), profile.head_count)
    end = min(head + checkpoint.covered, len(messages))
    if last < end:  # the newest calls are covered themselves: not the request after them
        return NO_REREADS
    new = [_new_call(call, profile) for call in _calls(messages[last])]
    wanted = {path for call in new for path in call.reads}
    removed_calls, removed_paths = _removed_fetches(
        messages, head, end, checkpoint, profile, wanted
    )
    found = tuple(
        call.name
        for call in new
        if call.key in removed_calls or not removed_paths.isdisjoint(call.reads)
    )
    return Rereads(found) if found else NO_REREADS


@dataclass(frozen=True)
class _NewCall:
    """One call of the newest round: its name, canonical key and the files it reads."""

    name: str
    key: tuple[str, str]
    reads: frozenset[str]


def _new_call(call: dict[str, Any], profile: Profile) -> _NewCall:
    name, arguments = call_name_and_arguments(call)
    return _NewCall(
        name, (name, _canonical(arguments)), frozenset(files_of_call(call, profile).read)
    )


def _last_tool_round(messages: Sequence[Message]) -> int | None:
    """Index of the last assistant message when the request ends with its tool results."""
    index = len(messages) - 1
    while index >= 0 and messages[index].get("role") in RESULT_ROLES:
        index -= 1
    if index == len(messages) - 1 or index < 0:
        return None
    message = messages[index]
    if message.get("role") != "assistant" or not _calls(message):
        return None
    return index


def _removed_fetches(
    messages: Sequence[Message],
    head: int,
    end: int,
    checkpoint: Checkpoint,
    profile: Profile,
    wanted: set[str],
) -> tuple[set[tuple[str, str]], set[str]]:
    """``(name, canonical arguments)`` of the covered calls whose result the
    replacement does not carry unchanged, and which of the ``wanted`` paths they read.

    Reading a call's files means parsing its arguments (a shell command line):
    only a call whose arguments spell one of the wanted paths is read, so a
    span of thousands of calls costs a substring search each.
    """
    kept = {
        (m.get("tool_call_id"), message_text(m))
        for m in checkpoint.replacement
        if m.get("role") in RESULT_ROLES
    }
    results: dict[Any, str] = {}
    if kept:
        for i in range(head, end):
            message = messages[i]
            if message.get("role") in RESULT_ROLES:
                results.setdefault(message.get("tool_call_id"), message_text(message))
    # A path as it is, and as JSON writes it with non-ASCII letters escaped.
    spellings = [(path, (path, json.dumps(path)[1:-1])) for path in wanted]
    calls: set[tuple[str, str]] = set()
    paths: set[str] = set()
    for i in range(head, end):
        message = messages[i]
        if message.get("role") != "assistant":
            continue
        for call in _calls(message):
            call_id = call.get("id")
            if kept and call_id is not None and (call_id, results.get(call_id)) in kept:
                continue  # its output is still in front of the model
            name, arguments = call_name_and_arguments(call)
            key = (name, _canonical(arguments))
            if key in calls:
                continue  # the same call again: the same files
            calls.add(key)
            if any(s in arguments for path, forms in spellings if path not in paths for s in forms):
                paths.update(wanted.intersection(files_of_call(call, profile).read))
    return calls, paths


def _calls(message: Message) -> list[dict[str, Any]]:
    """An assistant message's tool calls and legacy function call."""
    calls = tool_calls(message)
    function_call = message.get("function_call")
    if isinstance(function_call, dict):
        calls = [*calls, function_call]
    return calls


def _canonical(arguments: str) -> str:
    """Arguments as JSON with sorted keys (the same call spelled in another key
    order is the same call); the text itself when it is not JSON."""
    try:
        parsed = orjson.loads(arguments) if arguments else None
    except orjson.JSONDecodeError:
        return arguments.strip()
    return orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
