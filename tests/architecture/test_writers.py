"""One writer per piece of state: only the claims app writes claim and allocation rows.

Gangs (and, next, queues and preemption) decide placements; the claims app's commit service
(``claims.services.commit``) and its other services write them. Checked on the source, so that a new write
path cannot slip in unnoticed.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Every package setuptools ships but the claims app itself: a new app is checked without anyone remembering to.
PRODUCT = sorted(p.removesuffix("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"]["find"]["include"])
OTHERS = [p for p in PRODUCT if p != "claims"]
CLAIM_MODELS = {"ResourceClaim", "DeviceAllocation", "ClaimEvent"}
WRITES = {"create", "bulk_create", "update", "bulk_update", "delete", "get_or_create", "update_or_create", "save"}
WRITE_HELPERS = {"insert_rows", "update_rows", "bulk_insert"}  # claims.services.bulk


def _writes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "claims.services.bulk":
            found.append(f"{path.name}:{node.lineno}: imports claims.services.bulk")
        if isinstance(node, ast.ImportFrom) and node.module == "claims.services" and \
                any(a.name == "bulk" for a in node.names):
            found.append(f"{path.name}:{node.lineno}: imports claims.services.bulk")
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr in WRITE_HELPERS:
            found.append(f"{path.name}:{node.lineno}: {node.func.attr}()")
        if node.func.attr not in WRITES:
            continue
        # Model.objects....<write>(): walk down the chain to its root name.
        chain = node.func.value
        while isinstance(chain, (ast.Attribute, ast.Call)):
            chain = chain.value if isinstance(chain, ast.Attribute) else chain.func
        if isinstance(chain, ast.Name) and chain.id in CLAIM_MODELS:
            found.append(f"{path.name}:{node.lineno}: {chain.id}...{node.func.attr}()")
    return found


@pytest.mark.parametrize("app", OTHERS)
def test_only_the_claims_app_writes_claim_rows(app):
    offenders = [w for path in sorted((ROOT / app).rglob("*.py")) if "migrations" not in path.parts
                 for w in _writes(path)]
    assert not offenders, "claim rows written outside the claims app:\n" + "\n".join(offenders)


def test_every_app_is_checked():
    apps = {p.name for p in ROOT.iterdir() if (p / "apps.py").exists() or (p / "__main__.py").exists()}
    assert apps - {"claims"} <= set(OTHERS), f"not checked: {sorted(apps - {'claims'} - set(OTHERS))}"
    assert {"queues", "inventory", "frontend", "draservice", "agent"} <= set(OTHERS)


def test_the_check_sees_a_write():
    probe = ROOT / "tests" / "architecture" / "_probe.py"
    probe.write_text("from claims.models import ResourceClaim\n"
                     "ResourceClaim.objects.filter(pk=1).update(phase='Allocated')\n")
    try:
        assert _writes(probe) == ["_probe.py:2: ResourceClaim...update()"]
    finally:
        probe.unlink()
