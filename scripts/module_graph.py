"""The product's module graph in figures: modules, import edges, and edges that run against the layers.

Layers, lowest first: ``dra`` (pure library) < ``inventory`` < ``claims`` < ``queues`` | ``gangs`` (side by
side: neither imports the other) < ``scheduler`` < the doors (REST views, dashboards, URL confs, ``apps``
wiring). An edge runs against the layers when a module imports one of a higher layer, or one beside it. Imports
inside functions count. Other packages (draservice, usage, frontend, kube, workloads, agent) are counted as
modules and edges but not ranked. Hooks registered into a lower app at run time (``claims.services.queueing``)
are calls no import shows: they are counted apart, as the methods of that registry.

    python scripts/module_graph.py [--edges]
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dra", "draservice", "inventory", "claims", "gangs", "queues", "scheduler", "usage", "frontend",
            "agent", "workloads", "kube")
RANK = {"dra": 0, "inventory": 1, "claims": 2, "queues": 3, "gangs": 3, "scheduler": 4}
DOOR = re.compile(r"\.(api|urls|views\w*|dashboard|admin|apps)(\.|$)")
DOOR_RANK = 5


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        if not (ROOT / package).is_dir():
            continue
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def rank(module: str) -> int | None:
    app = module.split(".")[0]
    if app not in RANK:
        return None
    return DOOR_RANK if DOOR.search(module) else RANK[app]


def against(a: str, b: str) -> bool:
    ra, rb = rank(a), rank(b)
    if ra is None or rb is None or a.split(".")[0] == b.split(".")[0]:
        return False
    return rb > ra or (rb == ra and ra != DOOR_RANK)


def registry_hooks() -> int:
    path = ROOT / "claims" / "services" / "queueing.py"
    if not path.exists():
        return 0
    tree = ast.parse(path.read_text())
    return sum(len([f for f in node.body if isinstance(f, ast.FunctionDef)]) for node in tree.body
               if isinstance(node, ast.ClassDef) and node.name == "Provider")


def registry_calls(known: dict[str, Path]) -> int:
    """Call sites of the registry's hooks (``queueing.<hook>(``) in the product: each is a claims -> queues
    bounce that no import shows."""
    path = ROOT / "claims" / "services" / "queueing.py"
    if not path.exists():
        return 0
    hooks = {f.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)
             and node.name == "Provider" for f in node.body if isinstance(f, ast.FunctionDef)}
    return sum(1 for p in known.values() for node in ast.walk(ast.parse(p.read_text()))
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in hooks
               and isinstance(node.func.value, ast.Name) and node.func.value.id == "queueing")


def main() -> None:
    known = modules()
    graph = {name: imports(path, name, known) for name, path in known.items()}
    edges = [(a, b) for a, deps in graph.items() for b in sorted(deps)]
    bad = sorted((a, b) for a, b in edges if against(a, b))
    print(f"modules {len(known)}  edges {len(edges)}  against the layers {len(bad)}  "
          f"registry hooks {registry_hooks()} (called at {registry_calls(known)} sites)")
    for a, b in bad:
        print(f"  against: {a} -> {b}")
    if "--edges" in sys.argv:
        for a, b in sorted(edges):
            print(f"{a} -> {b}")


if __name__ == "__main__":
    main()
