"""Where the code asks which database runs (``connection.vendor``, ``is_postgres()``): only in an app's SQL
module (``*_sql.py``, or the dialect helpers' ``sql.py``), behind one function per statement, so the
PostgreSQL/SQLite difference is not spread over every hot path.

``REMAINING`` lists the modules that still fork, with their count: the list may only shrink. A module that
starts forking, or forks more, fails; a module that forks less must lower its count here (so the next change
cannot quietly spend what was paid back)."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = sorted(p.removesuffix("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"]["find"]["include"])

REMAINING = {
    "claims/services/bulk.py": 3, "claims/services/claims.py": 5, "claims/services/commit.py": 2,
    "claims/services/device_removed.py": 1, "claims/services/figures/accelerators.py": 1,
    "claims/services/figures/fleet_tally.py": 4, "claims/services/figures/units.py": 1,
    "claims/services/locking.py": 2, "claims/services/taking.py": 5, "claims/services/wake.py": 2,
    "draservice/bulk.py": 1, "draservice/changes.py": 8, "draservice/pagination.py": 1,
    "frontend/queries/claims.py": 2, "frontend/queries/fragmentation.py": 1, "frontend/queries/search.py": 1,
    "inventory/filtersets.py": 1, "inventory/services/doctor.py": 1, "inventory/services/selectors.py": 2,
    "inventory/services/sync.py": 3, "inventory/snapshot.py": 1, "queues/services/admission.py": 1,
    "queues/services/position.py": 2, "scheduler/services/plan.py": 1, "scheduler/services/preemption.py": 1,
    "scheduler/services/reclaim.py": 1, "scheduler/services/turns.py": 1,
}


def forks(path: Path) -> int:
    """``<anything>.vendor`` read, or ``is_postgres()`` called."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sum(1 for n in ast.walk(tree)
               if (isinstance(n, ast.Attribute) and n.attr == "vendor")
               or (isinstance(n, ast.Call) and isinstance(n.func, ast.Name | ast.Attribute)
                   and (n.func.id if isinstance(n.func, ast.Name) else n.func.attr) == "is_postgres"))


def is_sql_module(path: Path) -> bool:
    return path.name == "sql.py" or path.name.endswith("_sql.py")


def vendor_forks() -> dict[str, int]:
    found = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or is_sql_module(path):
                continue
            n = forks(path)
            if n:
                found[str(path.relative_to(ROOT))] = n
    return found


def test_vendor_forks_only_shrink():
    found = vendor_forks()
    grown = {p: n for p, n in found.items() if n > REMAINING.get(p, 0)}
    assert not grown, f"new database forks outside an app's *_sql.py (put the statement there): {grown}"
    assert found == REMAINING, ("fewer forks than REMAINING says: lower the counts in "
                                f"tests/architecture/test_vendor_sql.py to {found}")


def test_the_check_sees_a_fork(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from django.db import connection\nfrom inventory.sql import is_postgres\n"
                     "def f():\n    if connection.vendor == 'postgresql' and is_postgres():\n        pass\n")
    assert forks(probe) == 2
    assert is_sql_module(Path("queues/queues_sql.py")) and not is_sql_module(Path("queues/services/position.py"))
