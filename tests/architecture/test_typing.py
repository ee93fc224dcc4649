"""mypy (``make test``: ``$(VENV)/bin/mypy``) checks every product package: the packages setuptools ships are
the packages ``[tool.mypy] files`` names, and none of them is let off with ``follow_imports = "silent"``."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_mypy_checks_every_product_package():
    config = _config()
    shipped = {p.removesuffix("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]}
    checked = set(config["tool"]["mypy"]["files"])
    assert shipped == checked, f"not checked: {sorted(shipped - checked)}; not shipped: {sorted(checked - shipped)}"
    assert config["tool"]["mypy"].get("check_untyped_defs") is True


def test_no_product_package_is_silenced():
    config = _config()
    shipped = {p.removesuffix("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]}
    silenced = [m for o in config["tool"]["mypy"].get("overrides", [])
                if o.get("follow_imports") == "silent" or o.get("ignore_errors")
                for m in ([o["module"]] if isinstance(o["module"], str) else o["module"])
                if m.split(".")[0] in shipped]
    assert not silenced, f"product modules let off mypy: {silenced}"
