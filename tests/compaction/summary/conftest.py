"""Fixtures of the summary's tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import compaction.summary.blocks as blocks_module
import compaction.summary.files as files_module
import compaction.summary.rendering as rendering_module


@pytest.fixture
def count_block_readings(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    """Starts recording each text whose lines the summary's modules read into
    blocks (:func:`compaction.summary.blocks.block_lines`, wherever it is called
    from); returns the record, in order."""

    def start() -> list[str]:
        readings: list[str] = []
        block_lines = blocks_module.block_lines

        def counted(text: str) -> Iterator[blocks_module.BlockLine]:
            readings.append(text)
            return block_lines(text)

        for module in (blocks_module, files_module, rendering_module):
            monkeypatch.setattr(module, "block_lines", counted)
        return readings

    return start
