"""What docker/ tells the proxy is a configuration the proxy accepts.

The image itself is built and run by ``make docker-check`` (docker/check.sh),
which needs an engine; these tests need none: the variables the Dockerfile,
the compose files and the example env file set must load as settings, and
every stop timeout must outlast the proxy's drain.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from config import Settings, load_settings
from proxy.app import BACKGROUND_GRACE_SECONDS
from proxy.cli.server import GRACEFUL_SHUTDOWN_SECONDS

#: The requests drain, then compactions still being prepared get their grace.
SHUTDOWN = GRACEFUL_SHUTDOWN_SECONDS + BACKGROUND_GRACE_SECONDS

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE_FILES = ("compose.yaml", "compose.replicas.yaml")


def _dockerfile_env() -> dict[str, str]:
    """The ``COMPACTION_PROXY_*`` values of the Dockerfile's ENV lines."""
    text = (DOCKER / "Dockerfile").read_text()
    return dict(re.findall(r"^\s*(?:ENV\s+)?(COMPACTION_PROXY_\w+)=(\S+?)\s*\\?$", text, re.M))


@pytest.fixture(autouse=True)
def _no_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no ./compaction-proxy.toml of a developer's


def _load(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings(None)


def test_the_image_listens_on_all_interfaces_with_the_host_check_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = _dockerfile_env()
    settings = _load(monkeypatch, env)
    assert settings.server.host == "0.0.0.0"
    assert settings.server.check_host is True
    # The HEALTHCHECK probes the port the proxy reads.
    assert "COMPACTION_PROXY_SERVER__PORT" in env
    dockerfile = (DOCKER / "Dockerfile").read_text()
    healthcheck = re.search(r"^HEALTHCHECK .*(?:\n\s+.*)*", dockerfile, re.M)
    assert healthcheck is not None
    assert "os.environ.get('COMPACTION_PROXY_SERVER__PORT'" in healthcheck.group()


def test_the_image_keeps_its_state_where_the_documented_volume_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _load(monkeypatch, _dockerfile_env())
    assert settings.store.url == "sqlite:////var/lib/compaction-proxy/state.db"
    assert "state:/var/lib/compaction-proxy" in (DOCKER / "compose.yaml").read_text()
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert "-v compaction-proxy-state:/var/lib/compaction-proxy" in operations


def test_a_store_url_given_at_run_time_beats_the_images(monkeypatch: pytest.MonkeyPatch) -> None:
    # The replicas set the long form; a user may set either.
    for name in ("COMPACTION_PROXY_STORE__URL", "COMPACTION_PROXY_STORE"):
        with monkeypatch.context() as patch:
            settings = _load(patch, {**_dockerfile_env(), name: "redis://redis:6379/0"})
            assert settings.store.url == "redis://redis:6379/0"


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_waits_longer_than_the_drain(name: str) -> None:
    grace = re.findall(r"stop_grace_period:\s*(\d+)s", (DOCKER / name).read_text())
    assert grace, f"{name} sets no stop_grace_period"
    assert all(int(seconds) > SHUTDOWN for seconds in grace)


def test_the_documented_stop_timeout_is_longer_than_the_drain() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    timeouts = re.findall(r"--stop-timeout (\d+)", operations)
    assert timeouts
    assert all(int(seconds) > SHUTDOWN for seconds in timeouts)


def test_the_example_settings_load(monkeypatch: pytest.MonkeyPatch) -> None:
    examples = re.findall(
        r"^# (COMPACTION_PROXY_\w+)=(.+)$", (DOCKER / "settings.env").read_text(), re.M
    )
    assert len(examples) >= 3
    settings = _load(monkeypatch, {**_dockerfile_env(), **dict(examples)})
    assert settings.server.allowed_hosts == ["proxy.internal"]
