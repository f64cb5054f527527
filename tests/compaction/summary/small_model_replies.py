"""Replies small local summarizers (0.5B–1.5B, 4-bit) give for one short span.

The span is a coding agent fixing a failing test: it runs the test, reads the
loader, edits it and runs the test again. Each bad reply has the headings a
summary needs and would pass a check of form alone; each is worse than the
extractive summary of the same span. The good ones are what such a model
gives on a good day, terse or in bold ``Name:`` lines, and must be taken.
"""

from __future__ import annotations

import asyncio
from typing import Any

from compaction import Profile
from compaction.stages.condenser import CondenseResult, condense, find_middle
from compaction.tokens.counter import TokenCounter
from tests.conftest import RecordingSummarizer, assistant, system, tool_group, user

Message = dict[str, Any]

_FAILING_RUN = (
    "<returncode>1</returncode>\n<output>\n"
    "============================= test session starts ==============================\n"
    "collected 14 items\n\n"
    + "".join(f"tests/test_config.py::test_case_{i} PASSED\n" for i in range(13))
    + "tests/test_config.py::test_load_defaults FAILED\n\n"
    "=================================== FAILURES ===================================\n"
    "______________________________ test_load_defaults ______________________________\n\n"
    "    def test_load_defaults():\n"
    "        settings = load({})\n"
    ">       assert settings['timeout'] == 30\n"
    "E       KeyError: 'timeout'\n\n"
    "tests/test_config.py:41: KeyError\n"
    "=========================== short test summary info ============================\n"
    "FAILED tests/test_config.py::test_load_defaults - KeyError: 'timeout'\n"
    "========================= 1 failed, 13 passed in 0.31s =========================\n"
    "</output>"
)
_LOADER = "\n".join(
    [
        '"""Loading the settings file."""',
        "",
        "DEFAULTS = {",
        *(f"    'option_{i}': {i},  # the default of option {i}" for i in range(60)),
        "}",
        "",
        "def load(raw):",
        "    merged = dict(DEFAULTS)",
        "    merged.update(raw)",
        "    return merged",
    ]
)
_PASSING_RUN = (
    "<returncode>0</returncode>\n<output>\n"
    + "".join(f"tests/test_config.py::test_case_{i} PASSED\n" for i in range(13))
    + "tests/test_config.py::test_load_defaults PASSED\n"
    "============================== 14 passed in 0.29s ==============================\n"
    "</output>"
)


def span() -> list[Message]:
    """System prompt and task (the head), the agent's steps (the middle), a follow-up (the tail)."""
    return [
        system("You are a coding agent. Use the tools to do the task."),
        user("The test `tests/test_config.py::test_load_defaults` fails. Fix it."),
        assistant("Let me run the failing test first."),
        *tool_group("bash", {"command": "python -m pytest -x tests/test_config.py"}, _FAILING_RUN),
        assistant("The defaults have no timeout. I'll look at the loader."),
        *tool_group("read_file", {"path": "config/loader.py"}, _LOADER),
        assistant("I'll add the timeout default to DEFAULTS instead of changing the test."),
        *tool_group(
            "edit_file",
            {
                "path": "config/loader.py",
                "old": "DEFAULTS = {",
                "new": "DEFAULTS = {'timeout': 30,",
            },
            "Edited config/loader.py.",
        ),
        *tool_group("bash", {"command": "python -m pytest -x tests/test_config.py"}, _PASSING_RUN),
        assistant("The test passes now. Next I would run the whole suite."),
        user("Thanks, now run the whole suite."),
        assistant("Running it."),
    ]


#: A 0.5B model copying the sample lines an earlier prompt showed, word for word.
ECHOED_TEMPLATE = """\
## Goal
- Fix the failing test.

## Constraints & Preferences
- Requirements, restrictions and preferences the user stated ("- None stated" if none).

## Progress
### Done
- Completed steps and their outcomes.
### In Progress
- Work started but not finished.
### Blocked
- Open problems, each with the exact error message ("- None" if none).

## Key Decisions
- Decisions taken, and why.

## Next Steps
- What should happen next, in order.

## Critical Context
- Facts needed to continue: values, identifiers, findings, outputs that matter.
"""

#: The same habit on the prose prompt: each section's description turned into
#: its bullet. It names the test, so only the echo gives it away.
ECHOED_DESCRIPTIONS = """\
## Goal
- Fix `tests/test_config.py::test_load_defaults`.

## Constraints & Preferences
- The requirements, restrictions and preferences the user stated.

## Progress
### Done
- The steps that were completed and how each turned out.
### In Progress
- The work that was started and is not finished.
### Blocked
- Every open problem with its exact error message.

## Key Decisions
- The choices that were made and the reason for each.

## Next Steps
- What should happen next, in order.

## Critical Context
- The facts needed to continue.
"""

#: A 1.5B model that summarized, then wrote the prompt's closing tag and went
#: on with the transcript as it imagined it.
MARKUP_CONTINUING = """\
## Goal
- Fix the failing test in `tests/test_config.py`.

## Progress
### Done
- Ran `pytest`, which failed with `KeyError: 'timeout'`.
### In Progress
- Editing `config/loader.py`.

## Key Decisions
- Change the loader, not the test.

## Next Steps
- Run the whole suite.
</previous-summary>

<conversation>
[User]: Thanks, now run the whole suite.
[Assistant]: Running it.
"""

#: The same model continuing the dialogue without the tags.
TRANSCRIPT_CONTINUING = """\
## Goal
- Fix `tests/test_config.py::test_load_defaults`.

## Progress
### Done
- Added the `timeout` default in `config/loader.py`.

## Key Decisions
- Change the loader, not the test.

## Next Steps
- Run the whole suite.

User: Thanks, now run the whole suite.
Assistant: Running `pytest -q` now.
"""

#: A 0.5B model that wrote a summary of some other session: tidy, all six
#: sections, and nothing of this span in it.
WRONG_GOAL = """\
## Goal
- Build a web application for managing user accounts.

## Constraints & Preferences
- None stated.

## Progress
### Done
- Set up the project structure.
### In Progress
- Implementing the login page.
### Blocked
- None.

## Key Decisions
- Use a simple design.

## Next Steps
- Add tests for the login page.

## Critical Context
- The application uses a database.
"""

#: A 1.5B model reporting an edit the span never made (a ``sed`` on another file
#: that nothing ran) and crediting the user with steps the user never asked.
CLAIMED_EDIT = """\
## Goal
- Make `tests/test_config.py::test_load_defaults` pass without changing the test.

## Progress
### Done
- Ran `python -m pytest -x tests/test_config.py`: failed with `KeyError: 'timeout'`.
- Updated `config/settings.toml` with `sed -i 's/30/60/'` to raise the timeout.
### In Progress
- None

## Key Decisions
- Fix the configuration, not the test.

## Next Steps
- Run the whole suite.
"""
CREDITED_REQUESTS = """\
## Goal
- Make `tests/test_config.py::test_load_defaults` pass without changing the test.

## Progress
### Done
- Ran `python -m pytest -x tests/test_config.py`: failed with `KeyError: 'timeout'`.
- Added the `timeout` default to `DEFAULTS` in `config/loader.py`; the test passes.

## Key Decisions
- The user asked to commit the change, push the branch and open a pull request.

## Next Steps
- Commit, push and open a PR.
"""

#: Good: terse, every section, "None stated" and "None" where there is nothing.
GOOD_TERSE = """\
## Goal
- Make `tests/test_config.py::test_load_defaults` pass without changing the test.

## Constraints & Preferences
- None stated

## Progress
### Done
- Ran `python -m pytest -x tests/test_config.py`: failed with `KeyError: 'timeout'`.
- Added the `timeout` default to `DEFAULTS` in `config/loader.py`; the test passes.
### In Progress
- None
### Blocked
- None

## Key Decisions
- Fix the loader, not the test.

## Next Steps
- Run the whole suite.

## Critical Context
- `config/loader.py` now sets `timeout` to 30.
"""

#: Good: bold ``Name:`` headings, one section left out, the user "stated none",
#: and of the span only the error's name.
GOOD_PLAIN = """\
**Goal:** The user wants the failing config test fixed without editing the test itself.

**Constraints & Preferences:** The user stated none.

**Progress:**
- Done: the test failed with a KeyError for the timeout; the loader was edited and the test passed.
- In Progress: nothing.
- Blocked: nothing is blocked.

**Key Decisions:** change the loader rather than the test.

**Next Steps:** run the whole test suite.
"""

#: The bad replies, each with the words its rejection note gives.
BAD = {
    "echoed template": (ECHOED_TEMPLATE, "repeats the prompt's instructions"),
    "echoed descriptions": (ECHOED_DESCRIPTIONS, "repeats the prompt's instructions"),
    "markup continuing": (MARKUP_CONTINUING, "holds the prompt's markup (</previous-summary>)"),
    "transcript continuing": (TRANSCRIPT_CONTINUING, "continues the transcript ('User: Thanks"),
    "wrong goal": (WRONG_GOAL, "names none of the span's paths, commands or errors"),
    "claimed edit": (
        CLAIMED_EDIT,
        "names `config/settings.toml` as modified, but no tool call of the span touched it",
    ),
    "credited requests": (CREDITED_REQUESTS, "credits the user with a request the user never"),
}
GOOD = {"terse": GOOD_TERSE, "plain": GOOD_PLAIN}


def condensed(reply: str, messages: list[Message] | None = None) -> CondenseResult:
    """``messages`` (the span by default) condensed between the head and the last
    user message, by a model that answers ``reply``."""
    messages = span() if messages is None else messages
    tail = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return asyncio.run(
        condense(
            messages,
            find_middle(messages, 2, tail),
            profile=Profile(summarizer="llm"),
            counter=TokenCounter("gpt-4o"),
            summarizer=RecordingSummarizer(reply),
        )
    )
