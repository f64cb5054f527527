"""evaluation.replay.serve: the proxy a replay measures is the checkout's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import evaluation
from evaluation.replay.serve import ProxyConfig, proxy_env


def test_the_proxy_runs_the_code_beside_the_replay_not_the_installed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", ".")  # relative: would resolve in the proxy's own folder
    env = proxy_env(ProxyConfig(8_192, "anthropic", "extractive"), tmp_path)
    checkout = str(Path(evaluation.__file__).resolve().parents[1])
    assert env["PYTHONPATH"].split(os.pathsep) == [checkout, "."]
    assert env["COMPACTION_PROXY_COMPACTION__SUMMARIZER"] == "extractive"
