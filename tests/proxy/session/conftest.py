"""Helpers for the session tests run in-process: the per-request figures
written as soon as they are queued, so a test that needs a session recorded
(steering it is a 404 until then) waits for the write, not for a second."""

from __future__ import annotations

import functools

import pytest
from fastapi import FastAPI

import proxy.app
from proxy.state.recorder import Recorder
from proxy.state.runtime import ProxyState
from tests.proxy.inprocess import InProcessProxy


@pytest.fixture(autouse=True)
def _figures_written_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder gathers figures for a second before each write, to write
    once a second on a busy proxy; here every figure is written on its own."""
    monkeypatch.setattr(proxy.app, "Recorder", functools.partial(Recorder, gather=0.0))


def proxy_state(running: InProcessProxy) -> ProxyState:
    """The state the FastAPI app inside the middleware holds."""
    app = running.app
    while not isinstance(app, FastAPI):
        app = app.app
    state: ProxyState = app.state.proxy
    return state


def figures_written(running: InProcessProxy) -> None:
    """Until every figure the app has queued so far is in its store."""
    recorder = proxy_state(running).recorder
    assert recorder is not None, "the app's lifespan runs"
    running.http.portal.call(recorder.flush)
