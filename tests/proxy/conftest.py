"""Fixtures for the server tests: a fake upstream and the proxy.

``fake`` and ``start_proxy`` run both as real servers on loopback (for the
tests about the network); ``fake_upstream`` and ``start_app`` run them
in-process (see :mod:`tests.proxy.inprocess`): the same fake upstream, asked
through a recording transport, and the app driven through ASGI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from config import Settings, load_settings
from proxy.app import create_app
from tests.proxy.inprocess import (
    InProcessProxy,
    RecordingTransport,
    asking_the_model,
    running,
    settings_for,
)
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
    # Asking the upstream for its window is a request of the proxy's own, at a
    # moment of its choosing: the tests of other things must not meet it among
    # the requests they count. The tests of it ask for it by name.
    monkeypatch.setenv("COMPACTION_PROXY_UPSTREAM__DISCOVER_WINDOWS", "never")


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
        sections = asking_the_model(sections)
        sections.setdefault("store", {"url": "memory://"})
        sections.setdefault("upstream", {})
        sections["upstream"] = {"base_url": fake[1], **sections["upstream"]}
        settings: Settings = load_settings(None, **sections)
        url = stack.enter_context(serve_in_thread(create_app(settings)))
        return url + "/v1"

    with stack:
        yield start


@pytest.fixture
def fake_upstream() -> FakeUpstream:
    """The fake upstream without a server: ``start_app``'s transport asks it."""
    return FakeUpstream()


AppFactory = Callable[..., InProcessProxy]


@pytest.fixture
def start_app(fake_upstream: FakeUpstream) -> Iterator[AppFactory]:
    """Start the proxy in-process in front of ``fake_upstream`` (or of the
    ``transport`` given); the settings sections as for ``start_proxy``."""
    stack = ExitStack()

    def start(
        *, transport: RecordingTransport | None = None, store: Any = None, **sections: Any
    ) -> InProcessProxy:
        transport = transport or RecordingTransport(app=fake_upstream.app())
        return stack.enter_context(running(settings_for(**sections), transport, store=store))

    with stack:
        yield start
