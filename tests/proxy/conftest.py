"""Fixtures for the server tests: a fake upstream and the proxy, both real servers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from config import Settings, load_settings
from proxy.app import create_app
from tests.proxy.servers import FakeUpstream, serve_in_thread


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No developer environment or ./compaction-proxy.toml leaks into a test."""
    import os

    for name in list(os.environ):
        if name.startswith("COMPACTION_PROXY_") or name == "OPENAI_API_KEY":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture
def fake() -> Iterator[tuple[FakeUpstream, str]]:
    upstream = FakeUpstream()
    with serve_in_thread(upstream.app()) as url:
        yield upstream, url + "/v1"


ProxyFactory = Callable[..., str]


@pytest.fixture
def start_proxy(fake: tuple[FakeUpstream, str]) -> Iterator[ProxyFactory]:
    """Start a proxy in front of the fake upstream; returns its /v1 base URL."""
    stack = ExitStack()

    def start(**sections: Any) -> str:
        sections.setdefault("store", {"url": "memory://"})
        sections.setdefault("upstream", {})
        sections["upstream"] = {"base_url": fake[1], **sections["upstream"]}
        settings: Settings = load_settings(None, **sections)
        url = stack.enter_context(serve_in_thread(create_app(settings)))
        return url + "/v1"

    with stack:
        yield start
