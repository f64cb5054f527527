"""The layout of ``proxy/``: stage folders, and imports that only point down.

The folder listing is meant to read as the request path (``edge`` → ``flow`` →
``session`` → ``dialects`` / ``upstream`` → ``state``), so a module importing
one that imports it back — even only for a type annotation — would hide which
of the two comes first. The graph is read from the source with :mod:`ast`, so
imports under ``TYPE_CHECKING`` and inside functions count too.

Beyond no cycles, the folders have one order (:data:`IMPORT_ORDER`, drawn in
docs/architecture.md): a module imports from its own folder and from folders
after its own, never before — ``edge`` (the errors, limits and header names
every layer raises or reads) last.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.layout import ROOT, cycles, graph

PROXY = ROOT / "proxy"

#: What the top level of proxy/ may hold besides the stage folders.
TOP_LEVEL_MODULES = {"__init__.py", "app.py"}
STAGES = {
    "edge",
    "flow",
    "session",
    "recall",
    "dialects",
    "upstream",
    "state",
    "api",
    "ui",
    "cli",
}
#: The folders of proxy/ from the top (what starts the process) to the bottom
#: (what every layer builds on); folders in one tier never import each other.
IMPORT_ORDER: tuple[frozenset[str], ...] = (
    frozenset({"cli"}),
    frozenset({"app"}),
    # The JSON routes show what the dashboard's views read.
    frozenset({"api"}),
    frozenset({"ui"}),
    frozenset({"flow"}),
    frozenset({"session"}),
    # Recall's memory is the Conversations service's; its rounds ask the
    # upstream, report through state and answer in each dialect's shape.
    frozenset({"recall"}),
    frozenset({"state"}),
    frozenset({"upstream"}),
    frozenset({"dialects"}),
    frozenset({"edge"}),
)
#: What proxy/dialects/ holds beside one folder per API: the contracts they share.
DIALECT_CONTRACTS = {"__init__.py", "base.py", "recall.py", "shapes.py", "sse.py"}


def test_the_cycle_finder_finds_a_cycle_through_three_modules() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_exists_among_proxy_modules_type_only_imports_included() -> None:
    edges = graph(PROXY)
    assert cycles(edges) == []


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "app"


def _tier(folder: str) -> int:
    return next(i for i, tier in enumerate(IMPORT_ORDER) if folder in tier)


def _upward(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The imports from a folder to one before it in :data:`IMPORT_ORDER` (or
    beside it, in its tier)."""
    found = set()
    for module, targets in edges.items():
        here = _folder(module)
        for target in targets:
            there = _folder(target)
            if there != here and _tier(there) <= _tier(here):
                found.add((module, target))
    return found


def test_the_direction_check_finds_an_import_that_points_up() -> None:
    edges = {"proxy.edge.access": {"proxy.flow.send"}, "proxy.flow.send": {"proxy.edge.errors"}}
    assert _upward(edges) == {("proxy.edge.access", "proxy.flow.send")}
    upward = {("proxy.ui.pages", "proxy.api.state")}
    assert _upward({"proxy.ui.pages": {"proxy.api.state"}}) == upward
    assert _upward({"proxy.flow.send": {"proxy.edge.errors"}}) == set()


def test_every_folder_of_proxy_has_a_place_in_the_import_order() -> None:
    placed = set().union(*IMPORT_ORDER)
    assert placed == STAGES | {"app"}


def test_imports_point_down_the_folder_order() -> None:
    edges = graph(PROXY)
    assert _upward(edges) == set()


def test_the_top_level_of_proxy_holds_only_the_app_and_the_stage_folders() -> None:
    files = {p.name for p in PROXY.iterdir() if p.is_file() and p.suffix == ".py"}
    folders = {p.name for p in PROXY.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert files == TOP_LEVEL_MODULES
    assert folders == STAGES


def test_dialects_hold_the_shared_contracts_and_one_folder_per_api() -> None:
    dialects = PROXY / "dialects"
    files = {p.name for p in dialects.iterdir() if p.is_file() and p.suffix == ".py"}
    apis = sorted(p for p in dialects.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert files == DIALECT_CONTRACTS
    assert apis, "no API folder in proxy/dialects/"
    for api in apis:
        assert {"dialect.py", "recall.py"} <= {p.name for p in api.glob("*.py")}, api.name
        docstring = ast.get_docstring(ast.parse((api / "__init__.py").read_text()))
        assert docstring, f"proxy/dialects/{api.name}/__init__.py has no docstring"


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_stage_folder_says_what_it_is_for(stage: str) -> None:
    docstring = ast.get_docstring(ast.parse((PROXY / stage / "__init__.py").read_text()))
    assert docstring, f"proxy/{stage}/__init__.py has no docstring"


#: The longest a function in proxy/ may be, in lines, and the most modules a
#: folder may hold (``__init__.py`` not counted): past these a reader loses
#: the thread, and the piece wants splitting by the step it serves.
MAX_FUNCTION_LINES = 80
MAX_FOLDER_MODULES = 12


def _long_functions(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(root)}:{node.name} ({lines} lines)")
    return found


def _crowded_folders(root: Path) -> list[str]:
    folders = {path.parent for path in root.rglob("*.py")}
    counts = {
        folder: sum(1 for p in folder.glob("*.py") if p.name != "__init__.py") for folder in folders
    }
    return sorted(
        f"{folder.relative_to(root)} ({n})"
        for folder, n in counts.items()
        if n > MAX_FOLDER_MODULES
    )


def test_the_size_checks_find_a_long_function_and_a_crowded_folder(tmp_path: Path) -> None:
    body = "\n".join(f"    x{n} = {n}" for n in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n")
    (tmp_path / "short.py").write_text("def short():\n    return 1\n")
    assert _long_functions(tmp_path) == [f"long.py:long ({MAX_FUNCTION_LINES + 1} lines)"]
    for n in range(MAX_FOLDER_MODULES - 1):
        (tmp_path / f"m{n}.py").write_text("")
    assert _crowded_folders(tmp_path) == [f". ({MAX_FOLDER_MODULES + 1})"]


def test_no_function_in_proxy_is_over_the_line_limit() -> None:
    assert _long_functions(PROXY) == []


def test_no_folder_of_proxy_holds_more_than_the_module_limit() -> None:
    assert _crowded_folders(PROXY) == []
