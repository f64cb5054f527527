"""Helpers for the session tests run in-process: the per-request figures
written as soon as they are queued, so a test that needs a session recorded
(steering it is a 404 until then) waits for the write, not for a second."""

from __future__ import annotations

import functools

import pytest

import proxy.app
from proxy.session.service import Conversations
from proxy.state.recorder import Recorder
from tests.proxy.inprocess import InProcessProxy, services_of_app


@pytest.fixture(autouse=True)
def _figures_written_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder gathers figures for a second before each write, to write
    once a second on a busy proxy; here every figure is written on its own."""
    monkeypatch.setattr(proxy.app, "Recorder", functools.partial(Recorder, gather=0.0))


def proxy_state(running: InProcessProxy) -> Conversations:
    """The conversations service the running app holds."""
    return services_of_app(running.app).conversations


def figures_written(running: InProcessProxy) -> None:
    """Until every figure the app has queued so far is in its store."""
    recorder = services_of_app(running.app).observed.recorder
    assert recorder is not None, "the app's lifespan runs"
    running.http.portal.call(recorder.flush)
