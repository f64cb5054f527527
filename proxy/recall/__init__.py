"""Recall: the model reads back what compaction removed, and the client never sees it.

A brief of a pruned tool output, and a summary's ledger entry of one, end
with ``[ref: …]`` (:mod:`compaction.recall`). When a request that declares
tools goes upstream over such a compaction, the proxy adds one tool of its
own, ``compaction_recall``, at the end of ``tools``. When the answer calls it,
the proxy answers the call from the request itself — the client sent the
original with its history — appends the exchange to what it sent, and asks
again; the client gets the last answer only. The exchange is remembered and
put back on the conversation's next request at the place it had, so the
model does not ask again and the bytes sent extend those sent before.

* ``plan.py`` — whether a request goes with the tool, and the room its rounds have;
* ``rounds.py`` — each call answered, the next round's request, the bounds;
* ``loop.py`` — the rounds of one answer as the relay reads them
  (:class:`proxy.flow.relay.Relay`);
* ``memory.py`` — the exchanges kept for the conversation's next turns.

What differs per API — the tool's shape, where its calls sit, how a stream is
continued over rounds — is each dialect's ``recall.py``
(:mod:`proxy.dialects.recall`). docs/recall.md is the user's account.
"""

from proxy.recall.loop import NextRounds, RecallLoop, Tap
from proxy.recall.memory import RecallMemory, Restored
from proxy.recall.plan import Plan, counted_tool, plan
from proxy.recall.rounds import PAST_LIMIT, RecallFailed, RecallLimit, Rounds

__all__ = [
    "PAST_LIMIT",
    "NextRounds",
    "Plan",
    "RecallFailed",
    "RecallLimit",
    "RecallLoop",
    "RecallMemory",
    "Restored",
    "Rounds",
    "Tap",
    "counted_tool",
    "plan",
]
