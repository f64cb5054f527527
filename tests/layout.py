"""The import graph of a package, read from its source, for the layout tests
(``tests/proxy/test_layout.py``, ``tests/compaction/test_layout.py``).

Read with :mod:`ast`, not by importing, so imports under ``TYPE_CHECKING`` and
inside functions count too: a module importing one that imports it back, even
only for a type annotation, hides which of the two comes first.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path) -> dict[str, Path]:
    """Every module under ``package`` by its dotted name."""
    return {module_name(path): path for path in package.rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``known`` modules ``name`` imports, by the most precise name each import gives."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            submodules = {f"{target}.{alias.name}" for alias in node.names} & known
            # ``from pkg import sub`` depends on ``sub``; ``from pkg import name`` on pkg.
            found |= submodules if len(submodules) == len(node.names) else {target, *submodules}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return (found & known) - {name}


def graph(package: Path) -> dict[str, set[str]]:
    """Each module of ``package`` with the modules of ``package`` it imports."""
    found = modules(package)
    known = set(found)
    return {name: imports(name, path, known) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for nxt in targets:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found
