"""The layout of ``compaction/``: sub-packages by concern, in one order, with no
import cycle and no import hidden inside a function to dodge one.

The order (:data:`PACKAGE_ORDER`, drawn in docs/architecture.md) runs from
plain numbers to the stages that use everything: a module imports from its
own sub-package, from sub-packages before it and from the base modules
(``types``, ``errors``), never from one after it. The package's
``__init__.py`` is the public surface and may import from any of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.layout import ROOT, cycles, graph

PACKAGE = ROOT / "compaction"

#: Modules every sub-package may import: the shared aliases and the error tree.
BASE_MODULES = {"types", "errors"}
#: The sub-packages from the bottom (what everything builds on) to the top.
PACKAGE_ORDER = ("budget", "text", "chat", "tokens", "summary", "conversation", "stages")
#: Beyond this, a folder no longer reads at a glance.
MAX_MODULES = 12
#: What an import inside a function must say to be allowed: that it puts off
#: loading something heavy, not that it dodges a cycle.
LAZY_LOAD = "# lazy load:"


def _place(module: str) -> str:
    """``module``'s sub-package, or its own name for a base module and the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _misplaced(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The imports that point up :data:`PACKAGE_ORDER`, or from a base module into a
    sub-package."""
    found = set()
    for module, targets in edges.items():
        here = _place(module)
        if here == "__init__":
            continue
        for target in targets:
            there = _place(target)
            if there == here or there in BASE_MODULES:
                continue
            below = there in PACKAGE_ORDER and here in PACKAGE_ORDER
            if not below or PACKAGE_ORDER.index(there) > PACKAGE_ORDER.index(here):
                found.add((module, target))
    return found


def _function_imports(path: Path) -> list[int]:
    """Lines of the imports inside a function body that do not say they are a lazy load."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            if not isinstance(inner, ast.Import | ast.ImportFrom):
                continue
            if LAZY_LOAD not in lines[inner.lineno - 1]:
                found.append(inner.lineno)
    return sorted(set(found))


def test_the_order_check_finds_an_import_that_points_up() -> None:
    edges = {
        "compaction.chat.typed": {"compaction.summary.format", "compaction.types"},
        "compaction.summary.format": {"compaction.chat.own", "compaction.summary.files"},
        "compaction.types": {"compaction.chat.messages"},
    }
    assert _misplaced(edges) == {
        ("compaction.chat.typed", "compaction.summary.format"),
        ("compaction.types", "compaction.chat.messages"),
    }


def test_the_function_import_check_finds_one_and_passes_a_lazy_load(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import json\n\n"
        "def f():\n    from compaction.chat.own import is_summary\n\n"
        "async def g():\n    import tiktoken  # lazy load: heavy\n"
    )
    assert _function_imports(module) == [4]


def test_no_import_cycle_exists_among_compaction_modules_type_only_imports_included() -> None:
    assert cycles(graph(PACKAGE)) == []


def test_sub_packages_import_only_from_themselves_those_before_them_and_the_base() -> None:
    assert _misplaced(graph(PACKAGE)) == set()


def test_no_import_sits_inside_a_function_unless_it_is_a_lazy_load() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := _function_imports(path))
    }
    assert found == {}


def test_the_top_level_holds_the_surface_the_base_and_the_ordered_sub_packages() -> None:
    files = {p.stem for p in PACKAGE.glob("*.py")}
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert files == {"__init__", *BASE_MODULES}
    assert folders == set(PACKAGE_ORDER)


@pytest.mark.parametrize("package", PACKAGE_ORDER)
def test_every_sub_package_says_what_it_is_for_and_stays_small(package: str) -> None:
    folder = PACKAGE / package
    docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    assert docstring, f"compaction/{package}/__init__.py has no docstring"
    assert len([p for p in folder.glob("*.py") if p.name != "__init__.py"]) <= MAX_MODULES
    assert not [p for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__"]


#: A function longer than this no longer reads in one screen; it is split into
#: named steps, the way ``decide`` and ``execute`` are.
MAX_FUNCTION_LINES = 80


def test_no_function_in_the_engine_runs_over_80_lines() -> None:
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert long == {}
