"""The README documents what the code does: every setting and every CLI flag."""

from __future__ import annotations

from pathlib import Path

from config import settings_reference
from proxy.cli.commands import build_parser

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_setting_is_in_the_readme_with_its_default() -> None:
    for doc in settings_reference():
        assert f"| `{doc.key}` |" in README, doc.key
        if doc.default:
            assert f"| `{doc.key}` | `{doc.default}` |" in README, doc.key


def test_the_settings_table_is_the_generated_one() -> None:
    from config.reference import markdown_table

    assert markdown_table() in README, "regenerate it: python -m config.reference"


def test_every_cli_flag_is_in_the_readme() -> None:
    parser = build_parser()
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for name, sub in action.choices.items():
            assert f"compaction-proxy {name}" in README
            for option in sub._actions:
                for flag in option.option_strings:
                    if flag.startswith("--") and flag != "--help":
                        assert flag in README, f"{name} {flag}"
