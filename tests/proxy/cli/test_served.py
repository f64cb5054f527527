"""``sessions`` and ``show`` read the store ``serve`` writes without being given
its ``--config`` (:mod:`proxy.cli.served`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from config import load_settings
from proxy.cli.commands import EXIT_OK, main
from proxy.cli.served import dashboard_settings, remember, served_file
from tests.proxy.servers import FakeUpstream, first_health, serve_in_thread

SCRIPT = Path(sys.executable).with_name("compaction-proxy")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_sessions_without_a_config_list_what_serve_with_one_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """serve started in one folder with a configuration whose store path is
    relative to it; sessions run in another folder with no --config."""
    project = tmp_path / "project"
    project.mkdir()
    config = project / "proxy.toml"
    config.write_text('[store]\nurl = "sqlite:///./proxy-state.db"\n')
    port = _free_port()
    with serve_in_thread(FakeUpstream().app()) as upstream:
        argv = [str(SCRIPT), "serve", "--config", str(config), "--port", str(port)]
        process = subprocess.Popen(
            [*argv, "--upstream", upstream + "/v1"],
            cwd=project,
            env=dict(os.environ),  # the test's own XDG_STATE_HOME
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            first_health(port, process)
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Where is it?"}]}
            sent = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
            assert sent.status_code == 200, sent.text
        finally:
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=30)
    assert process.returncode in (0, -signal.SIGTERM), err
    assert (project / "proxy-state.db").exists()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)  # the conftest's chdir is undone after the test
    assert main(["sessions"]) == EXIT_OK
    said = capsys.readouterr()
    assert "Where is it?" in said.out  # the session's label
    assert "1 sessions, 1 requests" in said.out
    assert f"reading the store serve last used (the configuration {config})" in said.err


def test_a_configuration_of_their_own_wins_over_the_last_serves(tmp_path: Path) -> None:
    remember(None, load_settings(None, store={"url": f"sqlite:///{tmp_path / 'serve.db'}"}))
    own = tmp_path / "own.toml"
    own.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "own.db"}"\n')
    assert dashboard_settings(str(own)).settings.store.url.endswith("own.db")
    assert dashboard_settings(str(own)).note is None
    assert dashboard_settings(None).settings.store.url.endswith("serve.db")


def test_a_store_url_with_a_password_is_not_written_down(tmp_path: Path) -> None:
    settings = load_settings(None, store={"url": "redis://:hunter2@127.0.0.1:6379/0"})
    remember(None, settings)
    written = served_file().read_bytes()
    assert b"hunter2" not in written
    assert orjson.loads(written) == {"config": None, "store": None}
    assert (served_file().stat().st_mode & 0o777) == 0o600
