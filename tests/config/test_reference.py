from __future__ import annotations

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
