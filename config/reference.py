"""The settings as a table, generated from the models' own fields and descriptions.

The settings table in docs/configuration.md is built from :func:`settings_reference`, so it
cannot drift from the code.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from pydantic import BaseModel

from config.settings import (
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    PROFILE_FIELDS,
    ModelOverride,
    Settings,
)


class SettingDoc(NamedTuple):
    """One row of the settings table."""

    key: str  #: TOML key path, e.g. ``compaction.reserve_tokens``
    default: str  #: as it would be written in TOML; "" when unset
    description: str
    env: str  #: the environment variable that sets it


def settings_reference() -> list[SettingDoc]:
    """Every setting in file order: [server], [upstream], [compaction], then [models."…"]."""
    rows: list[SettingDoc] = []
    for section, field in Settings.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            rows.extend(_section_rows(section, model))
    rows.append(
        SettingDoc(
            key='models."<name>".*',
            default="",
            description=(
                "Any [compaction] key, for the models matching <name> (exact name or glob); "
                "keys not given inherit from [compaction]."
            ),
            env=f"{ENV_PREFIX}MODELS (JSON object)",
        )
    )
    for name, info in ModelOverride.model_fields.items():
        if name not in PROFILE_FIELDS and name != "summary_model":
            rows.append(SettingDoc(f'models."<name>".{name}', "", info.description or "", ""))
    return rows


def _section_rows(section: str, model: type[BaseModel]) -> list[SettingDoc]:
    rows = []
    for name, info in model.model_fields.items():
        env = ENV_PREFIX + ENV_NESTED_DELIMITER.join((section, name)).upper()
        default = info.get_default(call_default_factory=True)
        rows.append(SettingDoc(f"{section}.{name}", _toml(default), info.description or "", env))
    return rows


def _toml(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return json.dumps(list(value))
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def markdown_table() -> str:
    """The settings table of docs/configuration.md, generated so that it cannot drift."""
    rows = ["| key | default | environment variable | meaning |", "|---|---|---|---|"]
    for doc in settings_reference():
        default = f"`{doc.default}`" if doc.default else "—"
        env = f"`{doc.env}`" if doc.env else "—"
        rows.append(f"| `{doc.key}` | {default} | {env} | {doc.description} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m config.reference > table.md
    print(markdown_table())
