"""The import graph of the product packages: no cycles (imports inside functions count), and ``dra/`` is pure.

A cycle hidden in a function-level import still couples the modules both ways: whichever loads first decides
what the other sees, and nothing can be understood (or tested) alone.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

from scripts import module_graph

ROOT = Path(__file__).resolve().parents[2]
DRA_ALLOWED = {"celpy", "lark", "re2"}


def _graph() -> dict[str, set[str]]:
    known = module_graph.modules()
    return {name: module_graph.imports(path, name, known) for name, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _is_package_init_edge(a: str, b: str) -> bool:
    # A package's __init__ re-exporting its submodules, and those submodules importing siblings through the
    # package, is how a package is built, not a cycle between modules.
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_no_import_cycles():
    graph = {m: {d for d in deps if not _is_package_init_edge(m, d)} for m, deps in _graph().items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_dra_imports_only_the_standard_library_and_its_cel_runtime():
    stdlib = set(sys.stdlib_module_names)
    bad = []
    for path in (ROOT / "dra").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else []
            for n in names:
                top = n.split(".")[0]
                if top not in stdlib and top not in DRA_ALLOWED and top != "dra":
                    bad.append(f"{path.relative_to(ROOT)}: {n}")
    assert not bad, "dra/ must stay pure:\n" + "\n".join(bad)
