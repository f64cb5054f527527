"""The folding rules every backend shares (proxy/state/stores/figures.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from proxy.state.stores.figures import (
    SAVINGS_BUCKET_SECONDS,
    RequestRecord,
    SessionSummary,
    bucket_of,
    fold,
    savings_of,
)

STAGES = ("none", "reused", "untouched", "pruned", "condensed", "truncated")

records = st.builds(
    RequestRecord,
    session=st.just("s"),
    model=st.sampled_from(["a", "b"]),
    stage=st.sampled_from(STAGES),
    reason=st.sampled_from(["threshold", "overflow", "manual"]),
    tokens_before=st.integers(0, 10**6),
    tokens_after=st.integers(0, 10**6),
    input_limit=st.integers(1, 10**6),
    trigger=st.integers(1, 10**6),
    status=st.sampled_from([200, 400, 429, 500]),
    ms=st.floats(0, 1e4),
    summarizer_calls=st.integers(0, 5),
    summarizer_tokens=st.integers(0, 10**5),
    upstream_errors=st.integers(0, 2),
    background=st.booleans(),
    created_at=st.floats(1e9, 2e9),
)


@given(st.lists(records, min_size=1, max_size=30), st.data())
def test_folding_in_batches_is_folding_at_once(
    batch: list[RequestRecord], data: st.DataObject
) -> None:
    # A backend folds each write's batch into the stored summary.
    cut = data.draw(st.integers(1, len(batch)))
    assert fold(fold(None, batch[:cut]), batch[cut:]) == fold(None, batch)


@given(st.lists(records, min_size=2, max_size=30), st.data())
def test_folding_leaves_the_summary_it_adds_to_as_it_was(
    batch: list[RequestRecord], data: st.DataObject
) -> None:
    # A memory store keeps the summary it folds onto; a reader may hold it still.
    cut = data.draw(st.integers(1, len(batch) - 1))
    stored = fold(None, batch[:cut])
    stages, reasons = dict(stored.stages), dict(stored.reasons)
    fold(stored, batch[cut:])
    assert (stored.stages, stored.reasons) == (stages, reasons)
    assert stored == fold(None, batch[:cut])


def test_a_batch_is_folded_into_one_new_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    # A batch holds up to a second of a session's requests (hundreds, on a
    # busy one), folded on the store's thread beside the event loop.
    batch = [
        RequestRecord("s", "m", "condensed", "threshold", 900, 300, 800, 600, 200, 1.0, rereads=i)
        for i in range(5)
    ]
    stored = fold(None, batch[:1])
    made: list[SessionSummary] = []
    init = SessionSummary.__init__

    def counted(summary: SessionSummary, *args: Any, **kwargs: Any) -> None:
        made.append(summary)
        init(summary, *args, **kwargs)

    monkeypatch.setattr(SessionSummary, "__init__", counted)
    new = fold(None, batch)
    assert len(made) == 1
    assert fold(stored, batch[1:]) == new
    assert len(made) == 2
    assert (new.requests, new.compactions, new.rereads, new.stages) == (5, 5, 10, {"condensed": 5})


@given(st.lists(records, min_size=1, max_size=30))
def test_a_summary_adds_up_its_requests(batch: list[RequestRecord]) -> None:
    assume(not batch[0].background)  # a session starts with a request
    summary = fold(None, batch)
    # A compaction prepared in the background costs summarizer calls, and is no request.
    assert summary.summarizer_calls == sum(r.summarizer_calls for r in batch)
    assert summary.summarizer_tokens == sum(r.summarizer_tokens for r in batch)
    batch = [r for r in batch if not r.background]
    compacted = [r for r in batch if r.stage not in ("none", "reused", "untouched")]
    assert summary.requests == len(batch)
    assert summary.compactions == len(compacted) == sum(summary.stages.values())
    assert sum(summary.reasons.values()) == len(compacted)
    assert summary.saved == sum(max(0, r.tokens_before - r.tokens_after) for r in batch)
    # An error answer counts once, whether its status or its count says it.
    assert summary.upstream_errors == sum(max(r.upstream_errors, r.status >= 400) for r in batch)
    assert summary.overflow_retries == sum(r.reason == "overflow" for r in batch)
    assert summary.first_at == min(r.created_at for r in batch)
    assert summary.last_at == max(r.created_at for r in batch)
    newest = max(batch, key=lambda r: r.created_at)
    assert summary.tokens_after in {
        r.tokens_after for r in batch if r.created_at == newest.created_at
    }


@given(st.lists(records, max_size=30))
def test_savings_add_up_per_hour(batch: list[RequestRecord]) -> None:
    found = savings_of(batch)
    assert sum(found.values()) == sum(r.saved for r in batch)
    assert all(
        bucket % SAVINGS_BUCKET_SECONDS == 0 and saved > 0 for (_, bucket), saved in found.items()
    )
    assert all(
        bucket_of(r.created_at) <= r.created_at < bucket_of(r.created_at) + 3600 for r in batch
    )


def test_nothing_to_fold_is_an_error() -> None:
    with pytest.raises(ValueError, match="nothing to fold"):
        fold(None, [])
