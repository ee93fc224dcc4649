"""The layers as import-linter contracts (``[tool.importlinter]`` in pyproject.toml, run by ``make test``): they
hold for the product, and they break when a forbidden import appears -- proved on a copy of the packages with
one module added, so the real tree is never touched."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _copy(tmp: Path) -> Path:
    """The root packages' Python files and the configuration, under ``tmp``."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for package in config["root_packages"]:
        shutil.copytree(ROOT / package, tmp / package,
                        ignore=lambda d, names: [n for n in names if not (n.endswith(".py") or (Path(d) / n).is_dir())
                                                 or n == "__pycache__"])
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    if not LINT.exists():
        pytest.fail(f"{LINT} is missing: `pip install -e '.[test]'` installs import-linter")
    return _copy(tmp_path_factory.mktemp("layers"))


def test_the_product_keeps_its_layers(tree):
    out = _lint(tree)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Contracts: {len(_contracts(tree))} kept, 0 broken." in out.stdout


def _contracts(tree: Path) -> dict[str, str]:
    """Contract name -> its id, from the configuration."""
    import tomllib

    config = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["name"]: c["id"] for c in config["contracts"]}


# A probe module, what it imports, and the contracts that then break (an import of the scheduler from below it
# also reaches, through the scheduler, what the scheduler may import and the importer may not).
PROBES = [
    ("claims/services/_probe.py", "from scheduler.services import allocation\n",
     {"scheduler-on-top", "claims-below-queues-and-gangs", "app-core-below-doors"}),
    ("queues/_probe.py", "def late():\n    from scheduler import tasks  # inside a function: still an import\n",
     {"scheduler-on-top", "queues-beside-gangs"}),
    ("dra/_probe.py", "import claims.models\n", {"dra-is-pure"}),
    ("claims/_probe.py", "from queues.services import order\n", {"claims-below-queues-and-gangs"}),
    ("gangs/services/_probe.py", "from queues.models import Queue\n", {"queues-beside-gangs"}),
    # The platform below the apps (issue 36): directly, and from inside a function.
    ("draservice/_probe.py", "from claims.models import ResourceClaim\n", {"platform-below-apps"}),
    ("draservice/_probe.py", "def late():\n    from inventory.services import clusters\n", {"platform-below-apps"}),
    # An app's models, services and tasks below every door: a REST view, an app's pages, /k8s.
    ("inventory/services/_probe.py", "from inventory.api import serializers\n", {"app-core-below-doors"}),
    ("usage/dashboard_probe.py", "from usage.api import views\n", set()),  # a door may import a door (control)
    ("workloads/services/_probe.py", "import kube.models\n", {"app-core-below-doors"}),
    ("queues/tasks.py", None, {"app-core-below-doors"}),  # None: APPENDED to the real module, in a function
    # The dashboard on top: an app's own page importing it breaks the contract.
    ("usage/_probe.py", "from frontend.views import claims\n", {"dashboard-on-top"}),
    # The three arrows issue 36 turned round: the platform's tokens, the caps' count, the REST door's figures.
    ("draservice/_probe.py", "from inventory.models import Cluster\n", {"platform-below-apps"}),
    ("claims/services/_probe.py", "from kube.models import ResourcePoolStatusRequest\n", {"app-core-below-doors"}),
    ("inventory/api/_probe.py", "from frontend.queries import fragmentation\n", {"dashboard-on-top"}),
]


APPENDED = "\n\ndef _probe():\n    from usage.views_ui import usage_page  # noqa: F401\n"


@pytest.mark.parametrize(("module", "line", "broken"), PROBES, ids=[f"{p[0]}-{i}" for i, p in enumerate(PROBES)])
def test_a_forbidden_import_breaks_its_contract(tree, module, line, broken):
    probe = tree / module
    original = probe.read_text() if probe.exists() else None
    probe.write_text(original + APPENDED if line is None else line)
    try:
        out = _lint(tree)
    finally:
        probe.write_text(original) if original is not None else probe.unlink()
    total = len(_contracts(tree))
    text = " ".join(out.stdout.split())  # the report wraps long contract names
    found = {cid for name, cid in _contracts(tree).items() if f"{name} BROKEN" in text}
    assert found == broken, out.stdout
    assert f"Contracts: {total - len(broken)} kept, {len(broken)} broken." in text
    assert out.returncode == (1 if broken else 0), out.stdout + out.stderr
    if broken:
        assert f"{module.removesuffix('.py').replace('/', '.')} -> " in out.stdout  # the chain names the probe
