"""No module writes another module's state: ``engines.poisoned = True`` from the gang worker (or any
``other_module.name = ...``, or an attribute of an object another module owns, such as its cache) couples two
modules through a global no import shows. State changes go through the owner's functions (for the engine
cache: ``claims.services.engines.session``)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dra", "draservice", "inventory", "claims", "gangs", "queues", "scheduler", "usage", "frontend", "agent",
            "workloads", "kube")


def foreign_writes(path: Path) -> list[str]:
    """Assignments to an attribute of an imported product module or of an object imported from one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    imported[(a.asname or a.name).split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                node.module.split(".")[0] in PACKAGES:
            for a in node.names:
                imported[a.asname or a.name] = f"{node.module}.{a.name}"
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in imported:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {t.value.id}.{t.attr} "
                             f"({imported[t.value.id]})")
    return found


def test_no_module_writes_another_modules_state():
    offenders = [w for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
                 if "migrations" not in path.parts for w in foreign_writes(path)]
    assert not offenders, "module state written from outside its module:\n" + "\n".join(offenders)


def test_the_check_sees_a_foreign_write():
    probe = ROOT / "tests" / "architecture" / "_state_probe.py"
    probe.write_text("from claims.services.engines import engines\nfrom claims.services import fleet\n"
                     "def fail():\n    engines.poisoned = True\n    fleet.CACHE_SECONDS += 1\n")
    try:
        found = foreign_writes(probe)
    finally:
        probe.unlink()
    assert found == ["tests/architecture/_state_probe.py:4: engines.poisoned (claims.services.engines.engines)",
                     "tests/architecture/_state_probe.py:5: fleet.CACHE_SECONDS (claims.services.fleet)"]
