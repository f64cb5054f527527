"""The CI slice: eval on a few real conversations must not lose recall or artifacts,
nor any of the facts drawn by the eval's own rules (paths, last errors, typed messages).

The slice is named in evaluation/baseline.json (the conversations stay in
../shared/fixtures and are not copied here), with the scores measured when it
was committed. A change that makes compaction keep less — or breaks the
probes — fails here. After an intended improvement, rewrite the baseline:
``python -m tests.evaluation.test_baseline``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from compaction import Profile
from evaluation import natural_repeats, read_bodies, report_json
from evaluation.run import evaluate

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "evaluation" / "baseline.json"
FIXTURES = ROOT.parent / "shared" / "fixtures"
GUARDED = ("recall", "artifacts")
FACTS = ("path", "error", "typed")


def measure(names: list[str], window: int) -> list[dict[str, Any]]:
    cells = asyncio.run(
        evaluate(
            read_bodies(FIXTURES, set(names)),
            (window,),
            ("summary", "mask", "hybrid"),
            lambda model: Profile(summarizer="extractive"),
        )
    )
    return [
        {
            key: cell[key]
            for key in ("strategy", "compacted", "scores", "probes", "facts", "fact_counts")
        }
        for cell in report_json(cells)["cells"]
    ]


@pytest.mark.corpus
def test_the_slice_keeps_its_recall_and_artifact_scores() -> None:
    if not FIXTURES.is_dir():
        pytest.skip(f"eval slice skipped: no fixtures at {FIXTURES}")
    baseline = orjson.loads(BASELINE.read_bytes())
    measured = {cell["strategy"]: cell for cell in measure(baseline["names"], baseline["window"])}
    assert set(measured) == {cell["strategy"] for cell in baseline["cells"]}
    for expected in baseline["cells"]:
        now = measured[expected["strategy"]]
        assert now["compacted"] == expected["compacted"], "the slice changed"
        for kind in GUARDED:
            assert now["probes"][kind] == expected["probes"][kind], (expected["strategy"], kind)
            assert now["scores"][kind] >= expected["scores"][kind], (expected["strategy"], kind)


@pytest.mark.corpus
def test_the_slice_keeps_as_many_paths_errors_and_typed_messages_as_when_measured() -> None:
    """The eval's own facts: a change that keeps fewer of the touched paths, of
    the last five error lines or of the user's words fails here, whatever the
    probes say."""
    if not FIXTURES.is_dir():
        pytest.skip(f"eval slice skipped: no fixtures at {FIXTURES}")
    baseline = orjson.loads(BASELINE.read_bytes())
    measured = {cell["strategy"]: cell for cell in measure(baseline["names"], baseline["window"])}
    for expected in baseline["cells"]:
        now = measured[expected["strategy"]]
        for kind in FACTS:
            where = (expected["strategy"], kind)
            assert now["fact_counts"][kind] == expected["fact_counts"][kind], where
            assert now["facts"][kind] >= expected["facts"][kind], where


def measure_repeats(names: list[str]) -> dict[str, int]:
    """The slice's tool calls and how many repeat an earlier one, with no compaction."""
    report = natural_repeats(
        read_bodies(FIXTURES, set(names)), lambda model: Profile(summarizer="extractive")
    )
    return {"calls": report.total.calls, "repeats": report.total.repeats}


@pytest.mark.corpus
def test_the_slice_repeats_as_many_tool_calls_as_when_measured() -> None:
    """The baseline of the re-read counter: a change in the matching rule (or in
    how files are read from calls) shows here, on the same conversations."""
    if not FIXTURES.is_dir():
        pytest.skip(f"eval slice skipped: no fixtures at {FIXTURES}")
    baseline = orjson.loads(BASELINE.read_bytes())
    assert measure_repeats(baseline["names"]) == baseline["repeats"]


if __name__ == "__main__":  # pragma: no cover - rewrites the baseline
    current = orjson.loads(BASELINE.read_bytes())
    current["cells"] = measure(current["names"], current["window"])
    current["repeats"] = measure_repeats(current["names"])
    BASELINE.write_bytes(orjson.dumps(current, option=orjson.OPT_INDENT_2) + b"\n")
