"""Where the proxy's blocks sit in a summary's text: which lines are the
ledger's (:mod:`compaction.summary.ledger`) and the file lists'
(:mod:`compaction.summary.files`), and which are prose.

Both modules read and strip their blocks through :func:`block_lines`, so a
text quoted inside an entry (a user message holding ``<modified-files>``)
is never taken for a block of the ledger by either of them, and a line that
opens a ledger block inside a file list opens nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeAlias

#: The ledger's own blocks after the file lists, in the order they are rendered.
LEDGER_BLOCKS = ("errors", "commands", "identifiers", "user-messages")
#: The file lists' blocks, rendered first.
FILE_BLOCKS = frozenset(("read-files", "modified-files"))
ALL_BLOCKS = frozenset((*FILE_BLOCKS, *LEDGER_BLOCKS))
#: A user message in ``<user-messages>`` is an entry between these lines, whole.
ENTRY_OPEN = "<user-message>"
ENTRY_CLOSE = "</user-message>"


#: A line of a summary's text: the ledger block it belongs to (``None``:
#: outside), the line as written, and whether it is a frame — a block's opener
#: or closer, or a ``<user-message>`` entry's — rather than an entry's content.
BlockLine: TypeAlias = tuple[str | None, str, bool]


def split_blocks(text: str) -> tuple[list[str], list[str]]:
    """The lines of ``text`` outside its ledger blocks, and those of the blocks."""
    kept: list[str] = []
    blocks: list[str] = []
    for block, raw, _ in block_lines(text):
        (kept if block is None else blocks).append(raw)
    return kept, blocks


def block_lines(text: str) -> Iterator[BlockLine]:
    """Each line of ``text`` with the ledger block it belongs to (``None``: outside)
    and whether it frames the block or an entry (:data:`BlockLine`).

    Blocks are read line by line, opener and closer each a line of their
    own, so the scan is linear; an unclosed block runs to the end. Inside a
    ``<user-message>`` entry no line opens or closes anything but the entry.
    """
    current: str | None = None
    entry = False
    for raw in text.splitlines():
        line = raw.strip()
        if current is None:
            if line.startswith("<") and line.endswith(">") and line[1:-1] in ALL_BLOCKS:
                current = line[1:-1]
                yield current, raw, True
            else:
                yield None, raw, False
        elif current == "user-messages" and line == ENTRY_OPEN and not entry:
            entry = True
            yield current, raw, True
        elif entry and raw == ENTRY_CLOSE:
            entry = False
            yield current, raw, True
        elif not entry and line == f"</{current}>":
            yield current, raw, True
            current = None
        else:
            yield current, raw, False
