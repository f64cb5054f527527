"""The library's public surface and its purity (a pinned, sorted __all__; no server imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import compaction

PACKAGE = Path(compaction.__file__).parent
FORBIDDEN = {"fastapi", "starlette", "httpx", "uvicorn", "proxy", "config", "pydantic_settings"}


def test_public_surface_is_pinned_and_sorted() -> None:
    assert compaction.__all__ == sorted(compaction.__all__, key=lambda n: (not n.isupper(), n))
    assert set(compaction.__all__) == {
        "DEFAULT_READING_CACHE_BYTES",
        "NO_REREADS",
        "OPAQUE_KEY",
        "ORIGIN_KEY",
        "PRICING_PRESETS",
        "REF_PATTERN",
        "SUMMARY_MARKER",
        "RECALL_TOOL_DESCRIPTION",
        "RECALL_TOOL_NAME",
        "RECALL_TOOL_PARAMETERS",
        "WINDOW_BOUNDS",
        "Bounds",
        "Budget",
        "Calibration",
        "CannotFitError",
        "Checkpoint",
        "CompactionError",
        "CompactionResult",
        "Conversation",
        "Decision",
        "Depth",
        "EmptyStream",
        "EmptyStreamLesson",
        "InvalidMessagesError",
        "Ledger",
        "Message",
        "OverflowReport",
        "Pace",
        "Prices",
        "PairingProblem",
        "Profile",
        "ReadingCache",
        "Reason",
        "RecallRequest",
        "Rereads",
        "RetryBudget",
        "Span",
        "Stage",
        "Steering",
        "Strategy",
        "SummarizationError",
        "Summarizer",
        "SummarizerMode",
        "SummaryParts",
        "TokenCounter",
        "WindowLesson",
        "agreed_ratio",
        "agreed_window",
        "ahead",
        "calibrate",
        "calibrated_budget",
        "call_name_and_arguments",
        "check_messages",
        "compact",
        "compute_budget",
        "count_rereads",
        "credible_report",
        "decide",
        "empty_stream_lesson",
        "encoding_for_model",
        "execute",
        "find_original",
        "forwarded",
        "group_messages",
        "head_end",
        "is_summary",
        "key_argument",
        "ledger_of",
        "load_encoding",
        "made_progress",
        "mark",
        "message_text",
        "new_checkpoint",
        "parse_ledger",
        "parse_request",
        "parse_summary",
        "proven_floor",
        "ratio_sample",
        "read_conversation",
        "read_conversation_async",
        "recalled_text",
        "ref_of",
        "render_ledger",
        "repair_tool_pairing",
        "requested_output_tokens",
        "restored_calibration",
        "retry_budget",
        "session_key",
        "splits_digits",
        "steering_can_matter",
        "stream_answered",
        "system_texts",
        "tail_start",
        "text_size",
        "tool_calls",
        "typed_text",
        "first_typed",
        "validate_tool_pairing",
        "window_to_learn",
        "with_body",
        "working_limit_after_answer",
    }
    for name in compaction.__all__:
        assert hasattr(compaction, name), name


def _imported_roots(source: Path) -> set[str]:
    """The top-level packages ``source`` imports (absolute imports only)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_compaction_imports_no_server_side_module() -> None:
    for source in PACKAGE.glob("*.py"):
        roots = _imported_roots(source)
        assert not roots & FORBIDDEN, f"{source.name} imports {roots & FORBIDDEN}"


ROOT = PACKAGE.parent


def test_the_proxy_and_config_use_only_the_public_surface() -> None:
    """``proxy/`` and ``config/`` import from ``compaction`` itself, and only names
    in ``__all__``: the library's modules stay free to change shape."""
    public = set(compaction.__all__)
    for source in [*ROOT.glob("proxy/**/*.py"), *ROOT.glob("config/*.py")]:
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] != "compaction":
                    continue
                where = f"{source.relative_to(ROOT)} line {node.lineno}"
                assert node.module == "compaction", f"{where}: from {node.module}"
                names = {alias.name for alias in node.names}
                assert names <= public, f"{where}: {names - public} not public"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("compaction."), source


def test_the_library_draws_no_ids_reads_no_clock_and_touches_no_environment() -> None:
    for source in PACKAGE.glob("*.py"):
        assert not _imported_roots(source) & {"uuid", "time", "datetime", "random"}, source.name
        text = source.read_text()
        assert "os.environ" not in text and "tempfile" not in text, source.name
