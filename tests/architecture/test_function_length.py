"""No product function over 80 lines: a longer one gets split along its own steps."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Every package setuptools ships: a new app is checked without anyone remembering to add it here.
PRODUCT = sorted(p.removesuffix("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"]["find"]["include"])
MAX_LINES = 80


def long_functions(package: str, limit: int = MAX_LINES) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return found


@pytest.mark.parametrize("package", PRODUCT)
def test_no_function_is_over_80_lines(package):
    assert not long_functions(package), "\n".join(long_functions(package))


def test_the_check_sees_a_long_function():
    assert long_functions("dra", limit=5)


def test_every_app_is_checked():
    apps = {p.name for p in ROOT.iterdir() if (p / "apps.py").exists() or (p / "__main__.py").exists()}
    assert apps <= set(PRODUCT), f"not checked: {sorted(apps - set(PRODUCT))}"
    assert "queues" in PRODUCT
