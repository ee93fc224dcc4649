"""Services refuse in domain terms (``draservice.errors``) and the doors choose the HTTP answer: no app's services
import DRF or raise an HTTP exception (``FieldError``, ``rest_framework.exceptions.*``), and none names a status
code. Checked on the source of every app's ``services`` package, so a new one is held to it too."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = sorted(p for p in ROOT.glob("*/services") if (p.parent / "apps.py").exists())
HTTP_EXCEPTIONS = {"FieldError", "APIException", "ValidationError", "PermissionDenied", "NotAuthenticated",
                   "Throttled", "ParseError", "MethodNotAllowed"}


def http_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [f"{path.name}:{node.lineno}: imports {m}" for m in modules if m.startswith("rest_framework")]
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in HTTP_EXCEPTIONS and not (isinstance(func, ast.Name) and _domain(tree, name)):
                found.append(f"{path.name}:{node.lineno}: raises {name}")
            if any(k.arg == "status_code" for k in node.exc.keywords):
                found.append(f"{path.name}:{node.lineno}: names a status code")
    return found


def _domain(tree: ast.Module, name: str) -> bool:
    """``name`` is imported from draservice.errors (its Throttled is the domain's, not DRF's)."""
    return any(isinstance(n, ast.ImportFrom) and n.module == "draservice.errors" and
               any(a.name == name for a in n.names) for n in ast.walk(tree))


def test_every_app_with_services_is_checked():
    assert {p.parent.name for p in SERVICES} >= {"claims", "gangs", "inventory", "queues", "scheduler", "usage",
                                                 "workloads"}


@pytest.mark.parametrize("services", SERVICES, ids=lambda p: p.parent.name)
def test_services_raise_domain_exceptions_only(services):
    offenders = [f for path in sorted(services.rglob("*.py")) for f in http_in(path)]
    assert not offenders, "HTTP in services (raise a draservice.errors exception instead):\n" + "\n".join(offenders)


def test_the_check_sees_http(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from rest_framework import exceptions\nfrom draservice.problems import FieldError\n"
                     "from draservice.errors import Throttled\n"
                     "def f():\n    raise FieldError([('x', 'bad')], status_code=409)\n"
                     "def g():\n    raise exceptions.Throttled(wait=1)\n"
                     "def h():\n    raise Throttled('slow down', wait=1)\n")
    assert http_in(probe) == ["probe.py:1: imports rest_framework", "probe.py:5: raises FieldError",
                              "probe.py:5: names a status code", "probe.py:7: raises Throttled"]
