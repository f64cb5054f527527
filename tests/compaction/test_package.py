"""The library's public surface and its purity (CONVENTIONS.md habits 1 and 6)."""

from __future__ import annotations

import ast
from pathlib import Path

import compaction

PACKAGE = Path(compaction.__file__).parent
FORBIDDEN = {"fastapi", "starlette", "httpx", "uvicorn", "proxy", "config", "pydantic_settings"}


def test_public_surface_is_pinned_and_sorted() -> None:
    assert compaction.__all__ == sorted(compaction.__all__, key=lambda n: (not n.isupper(), n))
    assert set(compaction.__all__) == {
        "SUMMARY_MARKER",
        "Budget",
        "CannotFitError",
        "CompactionError",
        "CompactionResult",
        "InvalidMessagesError",
        "Message",
        "PairingProblem",
        "Profile",
        "Reason",
        "Stage",
        "SummarizationError",
        "Summarizer",
        "SummarizerMode",
        "TokenCounter",
        "compact",
        "compute_budget",
        "encoding_for_model",
        "repair_tool_pairing",
        "requested_output_tokens",
        "validate_tool_pairing",
    }
    for name in compaction.__all__:
        assert hasattr(compaction, name), name


def test_compaction_imports_no_server_side_module() -> None:
    for source in PACKAGE.glob("*.py"):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert not roots & FORBIDDEN, f"{source.name} imports {roots & FORBIDDEN}"
