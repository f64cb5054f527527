"""What the user typed, against the bodies real clients send (``tests.client_bodies``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction import Profile, first_typed, group_messages, head_end, system_texts, typed_text
from compaction.chat.typed import context_end, typed_messages, typed_part
from compaction.summary.contradictions import task_of
from compaction.summary.extractive import extractive_summary
from compaction.summary.ledger import ledger_of
from compaction.tokens.counter import TokenCounter
from tests.client_bodies import (
    AIDER_EXAMPLE,
    AIDER_FILES,
    AIDER_REPO_MAP,
    AIDER_SWITCHED,
    CLAUDE_CODE_CONTEXT,
    CODEX_AGENTS,
    CODEX_ENVIRONMENT,
    QWEN_REQUEST,
    aider_messages,
    aider_recorded,
    claude_code_body,
    codex_body,
    qwen_code_body,
    qwen_code_recorded,
)

TASK = "Rename parse to read_input across the package and update the tests"
COUNTER = TokenCounter("o200k_base")

needs_qwen = pytest.mark.skipif(
    not QWEN_REQUEST.exists(), reason=f"the recorded qwen-code body is not here: {QWEN_REQUEST}"
)


def _call(name: str) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}


def _head(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return messages[: head_end(messages, group_messages(messages), Profile().head_count)]


# --- one message ------------------------------------------------------------------


def test_claude_codes_reminders_around_the_typed_text_are_not_typed() -> None:
    (first,) = claude_code_body(TASK)["messages"]
    assert typed_text(first) == TASK


@needs_qwen
def test_qwen_codes_reminder_parts_before_the_typed_text_are_not_typed() -> None:
    first = qwen_code_body(TASK)["messages"][1]
    assert len(first["content"]) == 4
    assert typed_text(first) == TASK


@needs_qwen
def test_the_recorded_qwen_body_types_only_its_summary_and_lists_files_as_context() -> None:
    messages = qwen_code_recorded()["messages"]
    assert typed_text(messages[1]).startswith("## Goal\nInvestigate the repository as asked.")
    assert "<system-reminder>" not in typed_text(messages[1])
    assert typed_text(messages[3]) == ""  # "The following files were recently accessed…"


def test_codexs_agents_md_and_environment_messages_are_not_typed() -> None:
    items = codex_body(TASK)["input"]
    assert [typed_text(item) for item in items] == ["", "", "", TASK]


@pytest.mark.parametrize(
    "text",
    [
        AIDER_REPO_MAP,
        AIDER_FILES,
        CODEX_AGENTS,
        CODEX_ENVIRONMENT,
        CLAUDE_CODE_CONTEXT,
        "I didn't see any properly formatted edits in your reply?!",
        "Please always provide EXACTLY ONE action in triple backticks, found 2 actions.",
        "<local-command-stdout>Compacted</local-command-stdout>",
        "<command-message>init is analyzing</command-message>\n<command-name>/init</command-name>",
        "<command-name>/model</command-name>\n<command-args>opus</command-args>",
        "Tool loaded.",
    ],
)
def test_client_boilerplate_is_not_typed(text: str) -> None:
    assert typed_part(text) == ""
    assert typed_text({"role": "user", "content": text}) == ""


def test_words_a_harness_sends_whole_are_typed_when_they_open_a_longer_message() -> None:
    text = "Tool loaded. Now use it to fetch the changelog."
    assert typed_text({"role": "user", "content": text}) == text


def test_claude_codes_tool_loaded_note_beside_a_tool_search_result_is_no_request() -> None:
    # As the Anthropic dialect hands it to the engine: the result, then the
    # text block that rode beside it as a user message of its own.
    span: list[dict[str, Any]] = [
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "", "tool_calls": [_call("ToolSearch")]},
        {"role": "tool", "tool_call_id": "c1", "content": "WebFetch"},
        {"role": "user", "content": [{"type": "text", "text": "Tool loaded."}]},
        {"role": "assistant", "content": "Fetching it now."},
    ]
    assert ledger_of(span, Profile()).user_messages == (TASK,)
    assert typed_messages(span) == [TASK]


def test_a_fragment_tag_inside_typed_words_keeps_the_words() -> None:
    text = "Why does <environment_context> appear in the prompt?"
    assert typed_text({"role": "user", "content": text}) == text


def test_other_roles_tool_results_and_observations_are_not_typed() -> None:
    assert typed_text({"role": "assistant", "content": TASK}) == ""
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
    }
    assert typed_text(result) == ""
    observation = {"role": "user", "content": "<returncode>0</returncode>\n<output>ok</output>"}
    assert typed_text(observation) == ""


def test_typed_text_leaves_the_message_as_it_was() -> None:
    body = claude_code_body(TASK)
    before = copy.deepcopy(body)
    typed_text(body["messages"][0])
    assert body == before


@given(st.lists(st.sampled_from(["<system-reminder>", "</system-reminder>", "x", "\n", " "])))
def test_no_reminder_tag_survives_in_typed_text(parts: list[str]) -> None:
    assert "<system-reminder>" not in typed_text({"role": "user", "content": "".join(parts)})


# --- the task: the first typed words after the client's context ---------------------


def test_aiders_example_exchange_and_file_messages_are_context_not_the_task() -> None:
    messages = aider_messages(TASK)
    assert messages[1]["content"] == AIDER_EXAMPLE
    assert messages[3]["content"] == AIDER_SWITCHED
    assert context_end(messages) == len(messages) - 2  # up to the typed message
    assert first_typed(messages) == TASK


def test_aiders_task_is_the_first_message_of_its_history() -> None:
    history = [
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "Done: src/app.py renamed."},
    ]
    messages = aider_messages("Now add a changelog entry.", history)
    assert first_typed(messages) == TASK
    assert typed_messages(messages) == [TASK, "Now add a changelog entry."]


def test_a_typed_message_answered_ok_is_not_taken_for_context() -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "Ok."},
    ]
    assert context_end(messages) == 1
    assert first_typed(messages) == TASK


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param(aider_messages(TASK), id="aider"),
        pytest.param(
            [
                {"role": item["role"], "content": item["content"]}
                for item in codex_body(TASK)["input"]
            ],
            id="codex",
        ),
    ],
)
def test_the_head_runs_through_the_clients_context_to_the_typed_task(
    messages: list[dict[str, Any]],
) -> None:
    head = _head(messages)
    assert first_typed(head) == TASK
    assert task_of(head, []) == TASK


def test_the_head_of_an_ordinary_conversation_is_unchanged() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "b"},
    ]
    assert len(_head(messages)) == Profile().head_count


def test_an_aider_summary_states_the_typed_task_not_the_example() -> None:
    history: list[dict[str, Any]] = []
    for turn in range(6):
        history += [
            {"role": "user", "content": f"{TASK} (step {turn})" if turn else TASK},
            {"role": "assistant", "content": f"Changed src/app.py for step {turn}."},
        ]
    messages = aider_messages("Now add a changelog entry.", history)
    head = _head(messages)
    middle = messages[len(head) : -4]
    text = extractive_summary(middle, head=head, budget=2_000, counter=COUNTER)
    goal = text.split("## Goal")[1].split("## Constraints")[0]
    assert f"Task: {TASK}" in goal or TASK in goal
    assert "casual" not in text
    assert "I switched" not in text


def test_the_ledgers_user_messages_hold_no_client_boilerplate() -> None:
    span: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": CLAUDE_CODE_CONTEXT},
                {"type": "text", "text": TASK},
            ],
        },
        {"role": "assistant", "content": "On it."},
        {"role": "user", "content": AIDER_FILES},
        {"role": "assistant", "content": "Ok, any changes I propose will be to those files."},
        {"role": "user", "content": CODEX_ENVIRONMENT},
    ]
    ledger = ledger_of(span, Profile())
    assert ledger.user_messages == (TASK,)


def test_the_end_of_aiders_system_prompt_appended_to_the_typed_text_is_not_typed() -> None:
    # aider, for a model it has no settings for, appends the end of its system
    # prompt to the current message; the task is only the question typed.
    for body in aider_recorded():
        messages = body["messages"]
        assert first_typed(messages) == "Check case 0: what does main return when the input is 0?"
        typed = typed_text(messages[-1], system_texts(messages))
        assert typed.startswith("Check case ")
        assert typed.endswith("?")
        assert "\n" not in typed
        # Told nothing of the system texts, the message's own words are all kept.
        assert "file listing" in typed_text(messages[-1])


def test_typed_words_that_quote_a_little_of_the_system_prompt_are_kept() -> None:
    system = "You are a careful agent. " * 20 + "Never run rm -rf on the workspace."
    typed = "Why did you say 'Never run rm -rf on the workspace.'?\n\nPlease explain."
    messages = [{"role": "system", "content": system}, {"role": "user", "content": typed}]
    assert first_typed(messages) == typed


def test_a_closing_paragraph_run_repeating_the_system_prompt_is_dropped_wherever_it_ends() -> None:
    system = "Rules.\n\n" + "\n".join(f"Rule {i}: keep the tests green." for i in range(30))
    middle = system[8:600]
    typed = "Fix the parser."
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"{typed}\n\n{middle}"},
    ]
    assert len(middle) >= 200 and not system.endswith(middle)
    assert first_typed(messages) == typed
