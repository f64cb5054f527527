from __future__ import annotations

import dataclasses

from compaction.budget.profile import Profile
from config import SettingDoc, settings_reference
from config.settings import PROFILE_FIELDS


def test_reference_lists_every_setting_with_default_and_env() -> None:
    rows = {row.key: row for row in settings_reference()}
    assert rows["server.port"] == SettingDoc(
        "server.port", "8808", "TCP port to listen on.", "COMPACTION_PROXY_SERVER__PORT"
    )
    assert rows["upstream.base_url"].default == '"https://api.openai.com/v1"'
    assert rows["compaction.threshold"].default == ""
    assert rows["compaction.read_tools"].default.startswith('["read", ')
    for field in (*PROFILE_FIELDS, "summary_model"):
        assert f"compaction.{field}" in rows
    assert 'models."<name>".upstream' in rows
    assert rows['models."<name>".*'].env.startswith("COMPACTION_PROXY_MODELS")
    assert all(row.description for row in rows.values())


def test_reference_lists_the_admin_key() -> None:
    rows = {row.key: row for row in settings_reference()}
    row = rows["server.admin_key"]
    assert (row.default, row.env) == ("", "COMPACTION_PROXY_SERVER__ADMIN_KEY")
    assert "x-compaction-proxy-admin-key" in row.description


def test_reference_rows_unpack_as_key_default_description() -> None:
    key, default, description, _env = settings_reference()[0]
    assert (key, default) == ("server.host", '"127.0.0.1"')
    assert description


def test_reference_lists_the_store_section() -> None:
    rows = {row.key: row for row in settings_reference()}
    assert rows["store.url"].default == '""'
    assert rows["store.url"].env == "COMPACTION_PROXY_STORE__URL"
    assert "COMPACTION_PROXY_STORE " in rows["store.url"].description
    assert rows["store.retention_days"].default == "30.0"
    assert rows["store.progress_min_ratio"].default == "0.1"


def test_reference_compaction_rows_are_the_profile_declarations() -> None:
    rows = {row.key: row for row in settings_reference()}
    compaction = {key.removeprefix("compaction.") for key in rows if key.startswith("compaction.")}
    assert compaction == {field.name for field in dataclasses.fields(Profile)} | {"summary_model"}
    for field in dataclasses.fields(Profile):
        row = rows[f"compaction.{field.name}"]
        assert row.description == field.metadata["description"]
        assert row.env == f"COMPACTION_PROXY_COMPACTION__{field.name.upper()}"
    assert rows["compaction.safety_margin"].default == "0.02"
    # The override keys listed one by one are only those that are not Profile fields.
    models = {key for key in rows if key.startswith('models."<name>".')}
    assert models == {
        'models."<name>".*',
        'models."<name>".upstream',
        'models."<name>".anthropic_upstream',
        'models."<name>".api_key_env',
    }
