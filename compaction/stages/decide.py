"""Decide what one request needs: forward it, forward it over a stored
checkpoint, or compact it — and to which budget.

Pure and synchronous: plain data in, a frozen :class:`Decision` out. The
caller looks the checkpoints up, takes the single-flight lock and runs the
plan (:func:`compaction.stages.execute.execute`); the policy lives here:

* **the budget** — in estimated tokens, calibrated to the upstream's own
  count (:mod:`compaction.budget.calibrated`, with the retry's after an
  overflow);
* **the trigger** — a request within it is forwarded (over its checkpoint);
* **the plan** (:mod:`compaction.budget.plan`) — how deep a compaction goes (its
  fill, :attr:`Decision.target`), whether a model's summary pays for itself
  (else the extractive one), and whether a session whose cache went cold is
  compacted before its trigger;
* **the progress guard** — a span whose last compaction barely shrank the
  request (:func:`made_progress`) is not summarized again until new messages
  outgrow the tail;
* **the session's settings** (:class:`Steering`, set from the dashboard or
  the JSON routes) — compaction switched off turns a compaction (and one
  prepared ahead) into a forward, a "compact now" makes the request a manual
  compaction, and the session's instructions join the request's own;
* **a manual compaction** (``/compact``, "compact now") is never held back by
  the guard, and folds the stored summary with what came after it — unless
  nothing but the newest group came after it (or less than the summary
  itself), in which case the summary is made afresh from the client's own
  messages, so the user's instructions have something to work on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from compaction.budget.calibrated import Budget
from compaction.budget.plan import (
    Depth,
    Pace,
    cold,
    compacts_early,
    depth,
    growth_of,
    lead_turns,
    model_summary_pays,
)
from compaction.budget.pricing import Prices
from compaction.budget.profile import Profile
from compaction.chat.groups import PairingProblem
from compaction.conversation.checkpoints import (
    Checkpoint,
    apply_checkpoint,
    find_checkpoint,
    replacement_digest,
)
from compaction.conversation.reading import Conversation
from compaction.conversation.regions import tail_start
from compaction.types import Message, Reason

#: A compaction that shrank the request by less than this share is not
#: summarized again for the same span until the tail has grown (progress guard).
DEFAULT_PROGRESS_MIN_RATIO = 0.1

Action = Literal["forward", "compact"]


@dataclass(frozen=True)
class Steering:
    """What the owner of a session set for it, as :func:`decide` takes it."""

    #: False: the session is never compacted automatically (``/compact`` and
    #: "compact now" still compact it).
    enabled: bool = True
    #: Added to the summarizer's instructions (before a ``/compact``'s own).
    instructions: str = ""
    #: A "compact now" is pending: this request is compacted as by ``/compact``.
    compact_now: bool = False


def steering_can_matter(
    conversation: Conversation,
    profile: Profile,
    budget: Budget,
    *,
    reason: Reason = "threshold",
    stored: Mapping[str, Checkpoint] | None = None,
) -> bool:
    """Whether the session's settings could change what :func:`decide` does
    with this request, so that the caller must read them from the store first.

    They cannot when :func:`decide` forwards the conversation as it stands
    whatever they say: a threshold request with no checkpoint among
    ``stored`` (the store's answer for its chain), no pairing problems, and
    too small for anything to be prepared ahead — switching compaction off
    forwards it all the same, and instructions are only a summary's. A
    pending "compact now" is the caller's to know; it always matters.
    """
    if reason != "threshold" or conversation.problems or stored:
        return True
    tokens = conversation.tokens
    ahead = profile.prepares_ahead and tokens > profile.precompute_share * budget.trigger
    return tokens > budget.trigger or ahead


def made_progress(
    tokens_before: int, tokens_after: int, min_ratio: float = DEFAULT_PROGRESS_MIN_RATIO
) -> bool:
    """Whether a compaction from ``tokens_before`` to ``tokens_after`` shrank the
    request by at least ``min_ratio``: when it did not, the progress guard holds
    the next summary of the same span back (:attr:`Checkpoint.progress_ok`)."""
    return 1 - tokens_after / max(tokens_before, 1) >= min_ratio


@dataclass(frozen=True)
class Decision:
    """What to do with one request.

    ``messages`` is the conversation as it stands: the client's, or with the
    stored ``checkpoint`` applied. With ``action == "forward"`` it is what to
    send; with ``"compact"`` it is what :func:`~compaction.stages.execute.execute`
    compacts to ``budget`` under ``profile`` (the progress guard may have
    turned its summarizer off).
    """

    action: Action
    reason: Reason
    messages: list[Message]
    counts: list[int]  #: of ``messages``
    checkpoint: Checkpoint | None  #: the stored compaction applied, if any
    budget: Budget
    profile: Profile
    tokens_before: int  #: the client's request, estimated
    tokens: int  #: ``messages`` with the rest of the request, estimated
    notes: tuple[str, ...] = ()
    #: A forward past ``precompute_share`` of the trigger with nothing prepared
    #: yet: time to prepare the next compaction in the background (:func:`ahead`).
    prepare: bool = False
    #: Messages after the head this compaction keeps as they are: the
    #: replacement of a ``precomputed`` checkpoint, topped up behind it.
    fixed: int = 0
    #: Tokens expected to arrive before the compaction this plan prepares
    #: (:func:`ahead`); 0 for a compaction needed now.
    growth: int = 0
    #: For the summarizer: the session's instructions and the request's own.
    instructions: str | None = None
    #: The progress guard's share, for the checkpoint this compaction makes
    #: (:func:`made_progress`).
    progress_min_ratio: float = DEFAULT_PROGRESS_MIN_RATIO
    #: How deep to compact (:mod:`compaction.budget.plan`); ``None`` for a forward
    #: that prepares nothing.
    depth: Depth | None = None
    #: Compacted under its trigger: the upstream's cache of the conversation
    #: went cold, so the rewrite costs nothing it would not have cost anyway.
    early: bool = False

    @property
    def target(self) -> int:
        """Tokens a threshold compaction aims to leave: the plan's fill, never
        above ``prune_target`` × the trigger."""
        ceiling = math.floor(self.budget.trigger * self.profile.prune_target)
        return ceiling if self.depth is None else min(self.depth.fill, ceiling)

    @property
    def untouched(self) -> bool:
        return self.checkpoint is None


def decide(
    conversation: Conversation,
    profile: Profile,
    budget: Budget,
    *,
    reason: Reason = "threshold",
    stored: Mapping[str, Checkpoint] | None = None,
    progress_min_ratio: float = DEFAULT_PROGRESS_MIN_RATIO,
    steering: Steering | None = None,
    instructions: str | None = None,
    pace: Pace | None = None,
    prices: Prices | None = None,
) -> Decision:
    """Apply the newest of ``stored`` (the store's answer for the chain) and
    choose: forward, or compact to ``budget`` — as the session's ``steering``
    has it (module doc); ``instructions`` are the request's own (``/compact``'s).
    How deep a compaction goes is the plan's (:func:`compaction.budget.plan.depth`),
    from the session's ``pace`` (its growth read from the conversation when
    not given) and the upstream's ``prices`` (the profile's preset when not
    given); a session idle past the cache's lifetime may be compacted before
    its trigger (:func:`compaction.budget.plan.compacts_early`).

    A checkpoint that would split a tool group is not applied (a note says
    so) and the conversation is compacted afresh. Past the trigger, a
    compaction prepared in the background for this conversation (newer than
    the checkpoint in use) is applied instead, and what arrived since it was
    prepared is compacted behind it without waiting for a model.
    """
    notes: list[str] = []
    steering = steering or Steering()
    if steering.compact_now:
        reason = "manual"
    state, prepared = _starting_point(conversation, stored or {}, budget, reason, notes)
    tokens = sum(state.counts) + conversation.overhead
    fixed, prepare = 0, False
    prices = prices or profile.prices()
    under = reason == "threshold" and tokens <= budget.trigger and not state.problems
    may_prepare = profile.prepares_ahead and prepared is None
    near = may_prepare and _near(conversation, tokens, profile, budget, pace)
    # Planned only where it can matter: a compaction now or prepared ahead, or
    # a session whose cache went cold (most requests are none of these, and
    # the plan reads every turn).
    plan, declined = None, False
    if (pace is not None and cold(pace, prices)) or near or not under:
        plan = _depth(conversation, state, profile, budget, pace, prices)
        if reason == "threshold" and _summary_declined(plan, profile, tokens, prices):
            profile = dataclasses.replace(profile, summarizer="extractive")
            near = False  # nothing to prepare: the extractive summary waits for no one
            declined = True
    early = under and steering.enabled and _early(plan, tokens, budget, notes)
    action: Action = "forward" if under and not early else "compact"
    if action == "forward":
        prepare = near
    else:
        state, tokens, fixed, profile = _compacting(
            conversation, state, prepared, profile, budget, reason, notes, progress_min_ratio
        )
    if declined and action == "compact":
        notes.append(DECLINED_NOTE)
    if not steering.enabled and reason != "manual":
        # Switched off: forwarded as it stands, and nothing prepared ahead either.
        action, prepare = "forward", False
    return Decision(
        action=action,
        reason=reason,
        messages=state.messages,
        counts=state.counts,
        checkpoint=state.checkpoint,
        budget=budget,
        profile=profile,
        tokens_before=conversation.tokens,
        tokens=tokens,
        notes=tuple(notes),
        prepare=prepare,
        fixed=fixed,
        instructions="\n".join(p for p in (steering.instructions, instructions) if p) or None,
        progress_min_ratio=progress_min_ratio,
        depth=plan if action == "compact" or prepare else None,
        early=early,
    )


def _starting_point(
    conversation: Conversation,
    stored: Mapping[str, Checkpoint],
    budget: Budget,
    reason: Reason,
    notes: list[str],
) -> tuple[_State, Checkpoint | None]:
    """The conversation with its newest usable checkpoint applied, and the
    compaction prepared ahead beyond it, if one was and it still fits."""
    state = _State(conversation.messages, conversation.counts, conversation.problems, None)
    found = _usable(find_checkpoint(conversation.chain, stored), budget, notes)
    if found is not None and reason == "manual" and _nothing_after(conversation, found, budget):
        notes.append(
            f"manual compaction: only the newest messages follow checkpoint {found.id}; "
            "summarizing the messages it covered again"
        )
        found = None
    if found is not None:
        state = _applied(conversation, found, notes) or state
    covered = state.checkpoint.covered if state.checkpoint is not None else 0
    prepared = _usable(
        find_checkpoint(conversation.chain, stored, precomputed=True, beyond=covered),
        budget,
        notes,
    )
    if prepared is not None and prepared.prepared_over != replacement_digest(state.checkpoint):
        notes.append(f"checkpoint {prepared.id} was prepared over an earlier version")
        prepared = None
    return state, prepared


def _summary_declined(plan: Depth, profile: Profile, tokens: int, prices: Prices) -> bool:
    """Whether a model's summary is declined for the extractive one: it would
    cost more than the cache reads the compaction saves (``summary_must_pay``)."""
    return bool(
        profile.summarizer == "llm"
        and profile.summary_must_pay
        and plan.summary_price
        and not model_summary_pays(plan, tokens, prices)
    )


#: The note of a compaction whose model summary the plan declined.
DECLINED_NOTE = (
    "summary by extractive: a model's would cost more than the reads this compaction saves"
)


def _early(plan: Depth | None, tokens: int, budget: Budget, notes: list[str]) -> bool:
    """Whether a session under its trigger is compacted now, its cache gone
    cold (:func:`compaction.budget.plan.compacts_early`); the note says so."""
    if plan is None or not compacts_early(plan, tokens, budget.trigger):
        return False
    notes.append("compacted early: the upstream's cache of the conversation went cold")
    return True


def _compacting(
    conversation: Conversation,
    state: _State,
    prepared: Checkpoint | None,
    profile: Profile,
    budget: Budget,
    reason: Reason,
    notes: list[str],
    progress_min_ratio: float,
) -> tuple[_State, int, int, Profile]:
    """What a compaction starts from — the compaction prepared ahead, applied
    past the trigger where it fits, else the checkpoint in use with the
    progress guard — as the state, its tokens, the messages fixed in front and
    the profile to compact with."""
    tokens = sum(state.counts) + conversation.overhead
    ready = None
    if reason == "threshold" and tokens > budget.trigger:
        ready = _applied(conversation, prepared, notes)
    if ready is not None and ready.fits_under(conversation, budget):
        tokens = sum(ready.counts) + conversation.overhead
        fixed = len(ready.replacement) if tokens > budget.trigger else 0
        if profile.summarizer == "llm":
            # The model's summary is ready; what arrived since it was
            # prepared is compacted without waiting for another one.
            profile = dataclasses.replace(profile, summarizer="extractive")
        return ready, tokens, fixed, profile
    if state.checkpoint is not None and reason != "manual":
        # The user asked for this one: the guard does not stand in the way.
        profile = _guarded(profile, budget, state.checkpoint, conversation, progress_min_ratio)
    return state, tokens, 0, profile


def _depth(
    conversation: Conversation,
    state: _State,
    profile: Profile,
    budget: Budget,
    pace: Pace | None,
    prices: Prices,
) -> Depth:
    """The plan for this conversation (:func:`compaction.budget.plan.depth`)."""
    head = conversation.head
    if pace is None or pace.growth <= 0:
        growth = growth_of(conversation.messages, conversation.counts, head)
        pace = Pace(growth) if pace is None else dataclasses.replace(pace, growth=growth)
    kept = sum(state.counts[:head]) + conversation.overhead
    summary = 0.0
    if profile.summarizer == "llm" and profile.strategy != "mask":
        # A model summary is paid for: its prompt (the span, at the input
        # price) and its answer (at the output price).
        span = max(budget.trigger - kept, 0)
        answer = min(profile.summary_max_tokens, span * profile.summary_ratio)
        summary = span + answer * prices.output
    return depth(
        trigger=budget.trigger,
        head=kept,
        pace=pace,
        prices=prices,
        ceiling=profile.prune_target,
        slack=profile.plan_slack,
        summary_price=summary,
        working_set=profile.plan_working_set,
    )


def _near(
    conversation: Conversation, tokens: int, profile: Profile, budget: Budget, pace: Pace | None
) -> bool:
    """Whether the compaction the trigger will need is to be prepared now.

    Where the time a summary takes and the session's pace are known, once the
    trigger is no more turns away than the summary needs
    (:func:`compaction.budget.plan.lead_turns`), and not before: a preparation
    is a bet that the session reaches the trigger with this span, and one made
    earlier than needed is lost whenever the session ends first. A fixed share
    of the trigger is too late for a slow summarizer and a fast agent, and at a
    large window many turns too early (past 80 % of a 200k trigger, some 40k
    tokens of turns are still to come). Until both are measured, past
    ``precompute_share`` of the trigger."""
    lead = lead_turns(pace)
    growth = 0 if lead is None or pace is None else pace.growth
    if lead is not None and growth <= 0:
        growth = growth_of(conversation.messages, conversation.counts, conversation.head)
    if lead is None or growth <= 0:
        return tokens > profile.precompute_share * budget.trigger
    return tokens + lead * growth >= budget.trigger


def ahead(conversation: Conversation, decision: Decision) -> Decision:
    """The plan of the compaction that ``decision`` (a forward with ``prepare``)
    will need once ``conversation`` crosses its trigger, to run now.

    It compacts the conversation as it stands, expecting ``growth`` more
    tokens before that compaction: what is left below the trigger, or, when
    more, the size of the newest message group (the request that crosses the
    trigger overshoots it by about a turn). The verbatim tail is planned that
    much shorter, so that when the prepared compaction is applied, the tail
    it left plus what arrived meanwhile is about the tail a compaction at the
    trigger would have kept.
    """
    groups, counts = conversation.groups, conversation.counts
    newest = sum(counts[groups[-1].start : groups[-1].end]) if groups else 0
    growth = max(decision.budget.trigger - decision.tokens, newest, 0)
    return dataclasses.replace(decision, action="compact", prepare=False, growth=growth)


@dataclass(frozen=True)
class _State:
    """The conversation with a stored compaction applied (or none)."""

    messages: list[Message]
    counts: list[int]
    problems: tuple[PairingProblem, ...]
    checkpoint: Checkpoint | None

    @property
    def replacement(self) -> tuple[Message, ...]:
        return self.checkpoint.replacement if self.checkpoint is not None else ()

    def fits_under(self, conversation: Conversation, budget: Budget) -> bool:
        """Whether the head and the replacement leave room for a tail (a quarter
        of its budget, the least a compaction prepared ahead keeps)."""
        kept = conversation.head + len(self.replacement)
        used = sum(self.counts[:kept]) + conversation.overhead
        return used <= budget.input_limit - budget.tail_budget // 4


def _nothing_after(conversation: Conversation, found: Checkpoint, budget: Budget) -> bool:
    """Whether a manual compaction over ``found`` would keep every message after
    it as its tail, leaving only the earlier summary to condense.

    Judged with the largest tail a manual compaction keeps (half of what
    follows the head, see :func:`compaction.stages.execute.execute`): a room plan
    that shortens the tail only ever leaves more to condense.
    """
    cut = conversation.head + found.covered
    if cut > len(conversation.messages):
        return False  # not on this chain: not applied anyway
    counts = conversation.counts
    replacement = sum(conversation.counter.count_messages(list(found.replacement)))
    after = replacement + sum(counts[cut:])
    messages = conversation.messages
    tail = tail_start(conversation.groups, counts, min(budget.tail_budget, after // 2), cut)
    if tail <= cut:
        return True
    # A tail that starts inside a turn keeps the user message opening it
    # verbatim: when that message is all that lies between, nothing is left.
    opens_turn = messages[cut].get("role") == "user" and messages[tail].get("role") != "user"
    return tail - cut == 1 and opens_turn


def _usable(found: Checkpoint | None, budget: Budget, notes: list[str]) -> Checkpoint | None:
    if found is not None and found.window not in (0, budget.context_window):
        # Made for another window: its summary was sized for another budget.
        notes.append(f"checkpoint {found.id} was made for another context window")
        return None
    return found


def _applied(
    conversation: Conversation, found: Checkpoint | None, notes: list[str]
) -> _State | None:
    """The client's conversation with ``found`` applied, or ``None`` when it
    would split a group."""
    if found is None:
        return None
    applied = apply_checkpoint(conversation.messages, conversation.head, found, conversation.groups)
    if applied is None:
        notes.append(f"replay error: checkpoint {found.id} would split a message group")
        return None
    head, cut = conversation.head, conversation.head + found.covered
    counts = conversation.counts
    return _State(
        applied.messages,
        [
            *counts[:head],
            *conversation.counter.count_messages(list(found.replacement)),
            *counts[cut:],
        ],
        # Pairing problems inside the replaced span are gone with it.
        tuple(p for p in conversation.problems if not head <= p.index < cut),
        found,
    )


def _guarded(
    profile: Profile,
    budget: Budget,
    used: Checkpoint,
    conversation: Conversation,
    progress_min_ratio: float,
) -> Profile:
    """The progress guard: after a compaction that barely shrank the request,
    summarize again only once enough new material arrived to make progress.

    Right after that compaction the messages after its span were the verbatim
    tail; summarizing again is worth a call only when they have outgrown the
    tail by ``progress_min_ratio`` of the input limit. Until then pruning and
    truncation keep the request within the limit at no cost.
    """
    if used.progress_ok or profile.summarizer == "off":
        return profile
    newer = conversation.counts[conversation.head + used.covered :]
    needed = budget.tail_budget + progress_min_ratio * budget.input_limit
    if sum(newer) > needed:
        return profile
    return dataclasses.replace(profile, summarizer="off")
