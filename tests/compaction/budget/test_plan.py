"""compaction.budget.plan: how deep a compaction goes, priced in the user's money; and what
decide and execute make of it."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from compaction import (
    SUMMARY_MARKER,
    Profile,
    TokenCounter,
    calibrated_budget,
    decide,
    execute,
    message_text,
    read_conversation,
)
from compaction.budget.plan import (
    FILL_FLOOR_SHARE,
    Pace,
    compacts_early,
    cost_per_turn,
    depth,
    growth_of,
    model_summary_pays,
)
from compaction.budget.pricing import PRESETS
from tests.synthetic import agent_session

COUNTER = TokenCounter("gpt-4o")
ANTHROPIC = PRESETS["anthropic"]


def test_a_turn_is_an_assistant_message_and_what_answers_it() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "t"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "c"},
    ]
    counts = [5, 5, 10, 100, 20, 30, 40]
    # Turns after the head: 10+100, 20+30, 40 → median 50.
    assert growth_of(messages, counts, 2) == 50
    assert growth_of(messages[:2], counts[:2], 2) == 0


def test_the_cost_per_turn_grows_with_the_fill() -> None:
    costs = [
        cost_per_turn(fill, trigger=10_000, head=1_000, growth=500, prices=ANTHROPIC)
        for fill in range(2_000, 9_000, 500)
    ]
    assert costs == sorted(costs) and costs[0] < costs[-1]


def test_the_slack_buys_a_fuller_compaction_within_the_floor_and_the_ceiling() -> None:
    def planned(slack: float) -> int:
        pace = Pace(growth=600)
        chosen = depth(
            trigger=10_000, head=1_000, pace=pace, prices=ANTHROPIC, ceiling=0.7, slack=slack
        )
        assert chosen.cost <= chosen.cheapest * (1 + slack) + 1e-9
        return chosen.fill

    fills = [planned(slack) for slack in (0.0, 0.1, 0.5, 10.0)]
    assert fills == sorted(fills)
    assert fills[0] == FILL_FLOOR_SHARE * 10_000
    assert fills[-1] == 0.7 * 10_000


def test_a_large_window_keeps_a_working_set_not_a_share_of_it() -> None:
    """On the replay benchmark at 32k a fill of 0.55 of the limit cost more than
    Claude Code-style's summary and kept no more of what the next turns used
    than a fill of a working set's tokens."""

    def planned(trigger: int) -> int:
        return depth(
            trigger=trigger,
            head=1_000,
            pace=Pace(600),
            prices=ANTHROPIC,
            ceiling=0.7,
            slack=0.5,
            working_set=Profile().plan_working_set,
        ).fill

    assert planned(11_000) > 0.5 * 11_000  # a small window: the slack's choice
    assert planned(24_000) <= Profile().plan_working_set == 8_000
    # Never below the floor: a share of the trigger and two turns beside the head.
    assert planned(180_000) == FILL_FLOOR_SHARE * 180_000


def test_the_floor_keeps_room_for_the_head_and_two_turns() -> None:
    chosen = depth(
        trigger=10_000, head=4_000, pace=Pace(1_000), prices=ANTHROPIC, ceiling=0.7, slack=0
    )
    assert chosen.fill == 6_000


def test_a_summary_that_costs_money_makes_compactions_rarer() -> None:
    def fill(summary_price: float) -> int:
        return depth(
            trigger=20_000,
            head=2_000,
            pace=Pace(600),
            prices=ANTHROPIC,
            ceiling=0.7,
            slack=0.5,
            summary_price=summary_price,
        ).fill

    # Dearer summaries are spread over more turns: the plan goes deeper.
    assert fill(40_000) <= fill(0)


def test_a_cold_cache_brings_a_compaction_due_soon_forward() -> None:
    plan = depth(
        trigger=10_000,
        head=1_000,
        pace=Pace(500, idle=ANTHROPIC.cache_lifetime + 1),
        prices=ANTHROPIC,
        ceiling=0.7,
        slack=0.5,
    )
    assert plan.cold
    assert compacts_early(plan, 9_200, 10_000)
    assert not compacts_early(plan, 7_000, 10_000)  # not due within two turns
    warm = dataclasses.replace(plan, cold=False)
    assert not compacts_early(warm, 9_200, 10_000)


def _session(steps: int = 40) -> tuple[dict[str, object], Profile]:
    messages = agent_session(seed=7, steps=steps, output_chars=3_000)
    return {"model": "gpt-4o", "messages": messages}, Profile(
        context_window=16_384, summarizer="extractive", recall=False
    )


def test_decide_compacts_early_only_when_the_cache_went_cold() -> None:
    request, profile = _session(steps=90)
    budget = calibrated_budget(profile)
    full = list(request["messages"])  # type: ignore[call-overload]
    # The longest prefix (two messages a step) still under the trigger.
    messages = full[:2]
    for end in range(4, len(full) + 1, 2):
        grown = read_conversation(request, full[:end], COUNTER, profile.head_count)
        if grown.tokens > budget.trigger:
            break
        messages = full[:end]
    conversation = read_conversation(request, messages, COUNTER, profile.head_count)
    assert budget.trigger * 0.9 < conversation.tokens <= budget.trigger
    prices = profile.prices()
    warm = decide(conversation, profile, budget, pace=Pace(0, idle=10.0), prices=prices)
    cold = decide(
        conversation, profile, budget, pace=Pace(0, idle=prices.cache_lifetime + 60), prices=prices
    )
    assert warm.action == "forward" and not warm.early
    assert cold.action == "compact" and cold.early
    assert any("went cold" in note for note in cold.notes)
    result = asyncio.run(execute(conversation, cold))
    assert result.stage != "none" and result.tokens_after < conversation.tokens


def test_a_compaction_summarizes_the_oldest_span_and_keeps_the_newer_turns_briefed() -> None:
    request, profile = _session(steps=90)
    messages = list(request["messages"])  # type: ignore[call-overload]
    conversation = read_conversation(request, messages, COUNTER, profile.head_count)
    decision = decide(conversation, profile, calibrated_budget(profile))
    assert decision.action == "compact" and decision.depth is not None
    result = asyncio.run(execute(conversation, decision))
    assert result.stage == "condensed"
    out = result.messages
    summary_at = next(i for i, m in enumerate(out) if message_text(m).startswith(SUMMARY_MARKER))
    after = out[summary_at + 1 :]
    # Briefs of older outputs stand between the summary and the verbatim tail ...
    briefed = [m for m in after if m.get("role") == "tool" and not any(m is o for o in messages)]
    assert briefed and all(message_text(m).startswith("[") for m in briefed)
    # ... and the agent's own turns there are the client's, whole.
    kept_calls = [m for m in after if m.get("role") == "assistant"]
    assert kept_calls and all(any(m is o for o in messages) for m in kept_calls)
    # The plan's fill, not the old share of the trigger.
    assert result.tokens_after <= decision.target
    assert decision.target < decision.budget.trigger * profile.prune_target


@pytest.mark.parametrize("slack", [0.0, 0.5])
def test_the_fill_follows_the_plan(slack: float) -> None:
    request, profile = _session(steps=90)
    profile = dataclasses.replace(profile, plan_slack=slack)
    messages = list(request["messages"])  # type: ignore[call-overload]
    conversation = read_conversation(request, messages, COUNTER, profile.head_count)
    decision = decide(conversation, profile, calibrated_budget(profile))
    result = asyncio.run(execute(conversation, decision))
    assert result.tokens_after <= decision.target


def test_a_model_summary_must_cost_less_than_the_reads_it_spares() -> None:
    plan = depth(
        trigger=100_000,
        head=2_000,
        pace=Pace(1_000),
        prices=ANTHROPIC,
        ceiling=0.7,
        slack=0.5,
        summary_price=60_000,
    )
    # 0.1 × (tokens − fill) × turns: a large removal read over many turns pays ...
    assert model_summary_pays(plan, 100_000, ANTHROPIC)
    # ... a small one does not.
    assert not model_summary_pays(plan, plan.fill + 1_000, ANTHROPIC)


def test_a_model_summary_must_leave_half_the_reads_it_spares_unspent() -> None:
    # The extractive summary saves the same reads for nothing, and a session
    # may end before the turns expected: a summary costing 60-100 % of them
    # is not asked for.
    plan = depth(
        trigger=100_000,
        head=2_000,
        pace=Pace(1_000),
        prices=ANTHROPIC,
        ceiling=0.7,
        slack=0.5,
        summary_price=1,
    )
    saved = ANTHROPIC.cache_read * (100_000 - plan.fill) * plan.turns
    for share, pays in ((0.4, True), (0.6, False), (0.9, False)):
        priced = dataclasses.replace(plan, summary_price=int(share * saved))
        assert model_summary_pays(priced, 100_000, ANTHROPIC) is pays, share


def test_decide_asks_no_model_for_a_summary_that_does_not_pay() -> None:
    request, profile = _session(steps=90)
    small = dataclasses.replace(profile, summarizer="llm")
    # Just past the trigger, as a growing session crosses it: the compaction
    # removes a few thousand tokens, read for a few turns.
    messages = _just_past_the_trigger(request, small)
    conversation = read_conversation(request, messages, COUNTER, small.head_count)
    decision = decide(conversation, small, calibrated_budget(small))
    assert decision.action == "compact" and decision.profile.summarizer == "extractive"
    assert any("a model's would cost more" in note for note in decision.notes)
    # A history far past the trigger (a long session resumed): the removal is
    # large, read on every turn until the next compaction, and the model pays.
    longer, _ = _session(steps=180)
    whole = list(longer["messages"])  # type: ignore[call-overload]
    resumed = read_conversation(longer, whole, COUNTER, small.head_count)
    decision = decide(resumed, small, calibrated_budget(small))
    assert decision.profile.summarizer == "llm"


def _just_past_the_trigger(request: dict[str, object], profile: Profile) -> list[dict[str, object]]:
    full = list(request["messages"])  # type: ignore[call-overload]
    trigger = calibrated_budget(profile).trigger
    for end in range(4, len(full) + 1, 2):
        if read_conversation(request, full[:end], COUNTER, profile.head_count).tokens > trigger:
            return full[:end]
    raise AssertionError("the session never crosses the trigger")


def test_the_verbatim_tail_takes_most_of_the_fill_beside_the_head() -> None:
    """The newest outputs, whole, are what an agent's next turns read from: on the
    replay benchmark a tail of 70 % of the fill beside the head kept more of the
    facts the next turns used than one of 60 % (here 52 % of it)."""
    request, profile = _session(steps=90)
    messages = list(request["messages"])  # type: ignore[call-overload]
    conversation = read_conversation(request, messages, COUNTER, profile.head_count)
    decision = decide(conversation, profile, calibrated_budget(profile))
    result = asyncio.run(execute(conversation, decision))
    out = result.messages
    kept = 0
    while kept < len(out) and out[-1 - kept] is messages[-1 - kept]:
        kept += 1
    tail = sum(COUNTER.count_messages(messages[len(messages) - kept :]))
    beside = decision.target - sum(COUNTER.count_messages(messages[: conversation.head]))
    assert tail > 0.55 * beside
