"""The pure library's suites (tests/cel, tests/engine) need no service: they pass with no database and no broker.

Run in a subprocess pointed at a PostgreSQL and a Redis that do not exist (port 1), so that a test, fixture or
conftest that reaches for either fails here rather than on a developer's laptop without them.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOWHERE = {"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", "CELERY_BROKER_URL": "redis://127.0.0.1:1/0"}


@pytest.mark.slow
def test_cel_and_engine_suites_pass_without_postgresql_or_redis():
    env = {k: v for k, v in os.environ.items() if k not in ("TEST_BROKER_URL", "PYTEST_ADDOPTS")}
    env.update(NOWHERE)
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/cel", "tests/engine", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, f"{summary}\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    assert " passed" in summary and "error" not in summary, summary
