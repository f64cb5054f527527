from __future__ import annotations

import asyncio
from typing import Any

from compaction.budget.profile import Profile
from compaction.chat.messages import message_text
from compaction.stages.pipeline import compact
from compaction.summary.files import parse_file_lists
from compaction.tokens.counter import TokenCounter
from tests.conftest import assistant, system, tool_group, user

COUNTER = TokenCounter("gpt-4o")


def test_files_modified_by_a_long_command_survive_its_pruning() -> None:
    # The pruner cuts long arguments from the end, where sed -i names its file.
    command = "sed -i '" + "s/old_name/new_name/g;" * 20 + "' src/pkg/deep/module.py"
    messages: list[dict[str, Any]] = [system(), user("Rename old_name everywhere.")]
    messages += tool_group("bash", {"command": command}, "<returncode>0</returncode>")
    for i in range(30):  # results short enough to stay unpruned, so there is much to condense
        messages += tool_group("bash", {"command": f"cat src/m{i}.py"}, f"line {i}\n" * 50)
    messages += [user("Now run the tests."), assistant("Running them.")]
    profile = Profile(summarizer="extractive", keep_recent_tokens=100)
    request = {"model": "gpt-4o", "messages": messages}

    result = asyncio.run(compact(request, profile, reason="manual", counter=COUNTER))

    assert result.stage == "condensed"
    assert result.summary is not None
    lists = parse_file_lists(message_text(result.summary))
    assert lists.modified == ("src/pkg/deep/module.py",)
    assert "src/m0.py" in lists.read


def test_manual_compaction_condenses_even_when_everything_fits_the_tail() -> None:
    from tests.synthetic import agent_session

    messages = agent_session(seed=21, steps=30)
    profile = Profile(context_window=128_000, summarizer="extractive")
    result = asyncio.run(compact({"messages": messages}, profile, reason="manual"))
    assert result.stage == "condensed"
    assert result.tokens_after < result.tokens_before
    assert result.messages[-1] is messages[-1]
    unforced = asyncio.run(compact({"messages": messages}, profile, reason="threshold"))
    assert unforced.stage == "none"


def test_summary_budget_shrinks_to_the_room_a_small_window_leaves() -> None:
    from tests.synthetic import agent_session

    messages = agent_session(seed=22, steps=200, output_chars=6_000)
    profile = Profile(context_window=8_192, summarizer="extractive")
    result = asyncio.run(compact({"messages": messages}, profile))
    # A 20 % budget would be 4000 tokens here and push the tail out.
    assert result.stage == "condensed"
    assert result.tokens_after <= result.input_limit
    assert result.messages[-1] is messages[-1]
