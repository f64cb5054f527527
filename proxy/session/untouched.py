"""A request that cannot need compaction, found without the engine's reading: :func:`as_sent`.

Most requests a proxy sees are far under their trigger: a chat turn, a
title, a sub-agent's first steps. For those, all that
:func:`proxy.session.conversation.compact_if_needed` does — keying, grouping
and chaining the messages, asking the store for the checkpoints on the chain,
the decision and its plan — ends in "forward it as it came". This module
gives that answer from what is cheap to know, and only when every input of
:func:`compaction.decide` that could change it says so:

* **its size** — the messages counted as the decision counts them (the token
  cache knows a resent history; a large growing body was read already, in
  proportion to what it added) plus the rest of the request;
* **its budget** — the calibrated trigger, less what the recall tool holds
  back (:func:`proxy.session.conversation.request_budget`, the same one);
* **what the decision may still do under the trigger** — compact early a
  session whose provider cache went cold, when its trigger is due within two
  turns; prepare the next compaction ahead, past ``precompute_share`` of the
  trigger or as many turns ahead as a summary takes. A turn adds at most what
  the conversation holds, so a request below :data:`EARLY_SHARE` of its
  trigger (and below those shares) is none of these;
* **no pairing problem** — a tool call without its result is repaired by
  compacting, whatever the size;
* **no checkpoint of its session** in the store
  (:meth:`~proxy.state.stores.CheckpointLookup.holds_checkpoints`): a ``/compact``
  made on a small conversation is applied to its later requests;
* **no "compact now"** waiting in this process, for any session.

The request path asks it first (``proxy.flow.exchange.Exchange.compact_for``), before
it builds a summarizer or prices a plan; a ``/compact`` command in the
request was found when it was read (a byte search first,
:func:`proxy.flow.manual.may_hold_command`). Anything else goes the full
way. What this returns is what that would have returned: the same
:class:`~proxy.session.request.Resolved`, so the headers, the log line, the
metrics, the bill and the dashboard say the same (docs/architecture.md,
"One request's trip").
"""

from __future__ import annotations

import math
from typing import Final

from compaction import CompactionResult, session_key, validate_tool_pairing
from proxy.session.naming import session_name
from proxy.session.request import ConversationRequest, Resolved, request_budget, usable_reading
from proxy.session.service import Conversations

#: The share of its trigger under which a request is too small for an early
#: compaction: one is made when the trigger is due within two turns, and a
#: turn adds at most what the conversation already holds (t + 2t ≤ trigger).
EARLY_SHARE: Final = 1 / 3


async def as_sent(
    conversations: Conversations, request: ConversationRequest, *, held_back: int = 0
) -> Resolved | None:
    """``request`` forwarded as it came, when nothing could change that (module
    doc); ``None`` when the full way must decide."""
    if conversations.compact_now:  # rare: a dashboard's click waits for its session
        return None
    config = request.config
    messages = request.messages
    read = usable_reading(conversations, request)
    if read is not None:
        tokens, key, problems = read.tokens, read.session, bool(read.problems)
    else:
        counter = conversations.counter(config)
        tokens = sum(counter.count_messages(messages)) + counter.request_overhead(request.body)
        # The conversation's own key names its session only where the client
        # named none (session_name): no hash of its first message otherwise.
        key = session_key(messages) if request.client_session is None else ""
        problems = False
    budget = request_budget(conversations, request, held_back)
    share = EARLY_SHARE
    session = session_name(request.client_session, key)
    profile = config.profile
    if profile.prepares_ahead:
        share = min(share, profile.precompute_share, _ahead_share(conversations, request, session))
    if tokens >= budget.trigger * share:
        return None
    if read is None:
        problems = bool(validate_tool_pairing(messages))
    if problems or await conversations.store.holds_checkpoints(request.owner, session):
        return None
    result = CompactionResult(
        messages=messages,
        stage="none",
        reason="threshold",
        tokens_before=tokens,
        tokens_after=tokens,
        input_limit=budget.input_limit,
        trigger=budget.trigger,
        messages_before=len(messages),
    )
    return Resolved(True, result, None, session)


def _ahead_share(conversations: Conversations, request: ConversationRequest, session: str) -> float:
    """Below this share of its trigger no compaction is prepared ahead for
    the turns a summary takes: ``lead`` turns of at most the conversation's
    size each (the lead is :func:`compaction.budget.plan.lead_turns`')."""
    summary = conversations.summary_pace(request.config).duration(0.9)
    idle = conversations.prompts.idle(request.owner, session)
    if summary is None or not idle or idle <= 0:
        return 1.0
    lead = math.ceil(summary / idle) + 1
    return 1 / (1 + lead)
