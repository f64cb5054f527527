"""The documentation says what the code does: every setting and every CLI flag."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from config import settings_reference
from config.reference import markdown_table
from proxy.cli.commands import build_parser

ROOT = Path(__file__).resolve().parents[1]
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
README = (ROOT / "README.md").read_text()
#: The README and every page under docs/, as one text: a flag may be
#: documented on whichever page describes its command.
DOCUMENTATION = "\n".join(
    path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
)


def test_every_setting_is_in_the_configuration_page_with_its_default() -> None:
    for doc in settings_reference():
        assert f"| `{doc.key}` |" in CONFIGURATION, doc.key
        if doc.default:
            assert f"| `{doc.key}` | `{doc.default}` |" in CONFIGURATION, doc.key


def test_the_settings_table_is_the_generated_one() -> None:
    assert markdown_table() in CONFIGURATION, (
        "regenerate it: python -m config.reference, and paste it into docs/configuration.md"
    )


def test_every_cli_command_and_flag_is_documented() -> None:
    parser = build_parser()
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        assert isinstance(action.choices, dict)
        for name, sub in action.choices.items():
            assert f"compaction-proxy {name}" in DOCUMENTATION
            for option in sub._actions:
                for flag in option.option_strings:
                    if flag.startswith("--") and flag != "--help":
                        assert flag in DOCUMENTATION, f"{name} {flag}"


def test_the_readme_installs_the_agent_clis_ci_installs() -> None:
    """The real-client tests skip without the agent CLIs: the README says how
    to install the very versions CI runs them with."""
    ci = (ROOT / ".ci" / "run").read_text()
    command = ci.replace("\\\n", " ")  # the install's continued lines as one
    found = re.search(r"npm install --prefix \.ci/clients .*?((?:@[\w./-]+@[\w.]+\s+)+)", command)
    assert found, "no agent CLI install in .ci/run"
    packages = found.group(1).split()
    line = "npm install --prefix .ci/clients " + " ".join(packages)
    assert line in README
    # make test-clients runs the same tests against the same versions.
    pinned = re.search(r"^PINNED_CLIENTS := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pinned and pinned.group(1).split() == packages


def test_make_eval_leaves_the_committed_results_alone_by_default() -> None:
    """A user's make eval writes where git does not look; the committed
    evaluation/RESULTS.md changes only when asked to."""
    makefile = (ROOT / "Makefile").read_text()
    found = re.search(r"^EVAL_OUTPUT \?= (\S+)$", makefile, re.MULTILINE)
    assert found, "make eval names no default output"
    output = found.group(1)
    assert "--output $(EVAL_OUTPUT)" in makefile
    assert output != "evaluation/RESULTS.md"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", output], cwd=ROOT, check=False
    ).returncode
    assert ignored == 0, f"{output} is not ignored by git"
