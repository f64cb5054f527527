"""The figures of one answered chat request, for :class:`proxy.state.recorder.Recorder`.

Apart from the recorder, which the app's state holds: this reads the
handler's types, which the state must not import.

Besides sizes, a figure carries the session's label: the first words the user
typed (the task, without its client's boilerplate) and the client's ``User-Agent``. Its
owner typed the one and sent the other; the dashboard shows them to that owner
(and the admin) only, never to another caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from compaction import (
    NO_REREADS,
    Conversation,
    Message,
    Rereads,
    count_rereads,
    first_typed,
)
from proxy.flow.answered.bill import Bill, Spent
from proxy.flow.read import Call
from proxy.session.conversation import Resolved
from proxy.state.metrics import Metrics
from proxy.state.stores import RequestRecord
from proxy.upstream.usage import NO_USAGE

#: A label's task: at most this many characters of the first request, cut
#: between words. Enough to tell sessions apart, too little to be a transcript.
TASK_CHARS: Final = 60
#: A ``User-Agent`` is the client's to choose: kept to this many characters.
USER_AGENT_CHARS: Final = 80


def request_record(
    call: Call,
    resolved: Resolved,
    status: int,
    ms: float,
    spent: Spent,
    bill: Bill,
    *,
    error: str = "",
    rereads: Rereads = NO_REREADS,
    labelled: bool = False,
) -> RequestRecord:
    """The figures of one answered request (``status``: the upstream's, or the
    proxy's), with what its work beside the answer ``spent`` and what it
    cost (``bill``); its task only when its session is
    not ``labelled`` yet (a session keeps its first task)."""
    result = resolved.result
    usage = bill.usage or NO_USAGE  # unpriced: its parts stay 0, as the figures' defaults
    return RequestRecord(
        session=resolved.session,
        owner=call.owner,
        model=call.config.model,
        api=call.dialect.name,
        stage=result.stage,
        reason=result.reason,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        input_limit=result.input_limit,
        trigger=result.trigger,
        context_window=call.config.profile.context_window,
        window_source=call.config.window_source,
        status=status,
        error=error,
        upstream_errors=spent.upstream_errors,
        ms=ms,
        # The summarizer's own counts, over every compaction of the request (an
        # overflow retry compacts twice), as /metrics counts them.
        summarizer_calls=spent.summarizer_calls,
        summarizer_tokens=spent.summarizer_tokens,
        checkpoint_id=resolved.checkpoint.id if resolved.checkpoint is not None else None,
        rereads=len(rereads.tools),
        task="" if labelled else task_words(call.messages, call.identified),
        user_agent=call.user_agent[:USER_AGENT_CHARS],
        summarizer_prompt_tokens=bill.summarizer.prompt,
        summarizer_output_tokens=bill.summarizer.output,
        cost=bill.cost,
        cost_without=bill.without,
        cost_dollars=bill.cost_dollars,
        cost_without_dollars=bill.without_dollars,
        priced=bill.usage is not None,
        prompt_tokens=usage.prompt,
        cache_read_tokens=usage.cache_read,
        cache_write_tokens=usage.cache_write,
        output_tokens=usage.output,
    )


def rereads_of(call: Call, resolved: Resolved) -> Rereads:
    """The request's tool calls that fetch again what its applied compaction
    removed (:func:`compaction.count_rereads`); nothing is read for a request
    over no checkpoint.

    The compaction applied is the stored one the request started from: a
    compaction made by this request is not what the model saw when it made
    its calls.
    """
    applied = resolved.checkpoint if resolved.made is None else resolved.base
    if applied is None:
        return NO_REREADS
    profile, conversation = call.config.profile, call.identified
    head = None
    if (
        conversation is not None
        and conversation.messages is call.messages
        and conversation.head_count == profile.head_count
    ):
        head = conversation.head  # already found; otherwise found again from the profile
    return count_rereads(call.messages, applied, profile, head=head)


def empty_stream(metrics: Metrics, spent: Spent) -> None:
    """Count an upstream stream that ended before its first event: an error
    answer, in /metrics and in the request's figures alike."""
    spent.upstream_errors += 1
    metrics.record_empty_stream()


def cut_stream(metrics: Metrics, spent: Spent) -> None:
    """Count an upstream stream that closed before its API's end (a ``role``
    chunk and nothing after, say): an error answer, as an empty one is."""
    spent.upstream_errors += 1
    metrics.upstream_errors.labels("cut").inc()


def task_words(messages: Sequence[Message], reading: Conversation | None = None) -> str:
    """The first words the user typed in the conversation (:func:`compaction.first_typed`:
    not its client's reminders, context or canned examples), on one line.
    ``reading``: the request's conversation, read; when it read ``messages``,
    where their context ends is known, and not found again over every message."""
    if reading is not None and reading.messages is messages:
        task = first_typed(messages, reading.echoes, reading.context)
    else:
        task = first_typed(messages)
    # Only the start is kept: a first message of megabytes is read once, then dropped.
    words = " ".join(task[: TASK_CHARS * 4].split())
    if len(words) <= TASK_CHARS:
        return words
    cut = words[:TASK_CHARS].rsplit(" ", 1)[0] or words[:TASK_CHARS]
    return cut + "…"
