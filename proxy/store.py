"""Where checkpoints live. One small interface; backends implement it.

The in-process :class:`MemoryStore` is the only backend for now; persistent
and shared backends (SQLite, Redis) implement the same three methods.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from compaction.checkpoints import Checkpoint

DEFAULT_MEMORY_CHECKPOINTS = 10_000


class CheckpointStore(Protocol):
    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        """The checkpoints stored under any of ``hashes`` (one round trip)."""
        ...

    async def put(self, checkpoint: Checkpoint) -> None: ...

    async def get(self, checkpoint_id: str) -> Checkpoint | None: ...


class MemoryStore:
    """Checkpoints in this process's memory, the oldest forgotten past ``capacity``."""

    def __init__(self, capacity: int = DEFAULT_MEMORY_CHECKPOINTS) -> None:
        self._by_hash: OrderedDict[str, Checkpoint] = OrderedDict()
        self._by_id: dict[str, Checkpoint] = {}
        self._capacity = capacity

    async def lookup(self, hashes: Sequence[str]) -> dict[str, Checkpoint]:
        found = {}
        for value in hashes:
            checkpoint = self._by_hash.get(value)
            if checkpoint is not None:
                found[value] = checkpoint
        return found

    async def put(self, checkpoint: Checkpoint) -> None:
        self._by_hash[checkpoint.end_hash] = checkpoint
        self._by_hash.move_to_end(checkpoint.end_hash)
        self._by_id[checkpoint.id] = checkpoint
        while len(self._by_hash) > self._capacity:
            _, evicted = self._by_hash.popitem(last=False)
            self._by_id.pop(evicted.id, None)

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        return self._by_id.get(checkpoint_id)

    def __len__(self) -> int:
        return len(self._by_hash)
