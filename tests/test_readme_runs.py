"""The README's walk-through (its first claim over REST and over kubectl, then the queues) runs in order, as
written, against a fresh `make run` (scripts/run_readme.py): no step fails, none hangs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.live, pytest.mark.slow]  # a `make run` of its own (SQLite, its own ports), ~30 s
ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_runs_in_order_on_a_fresh_make_run():
    done = subprocess.run([sys.executable, "scripts/run_readme.py", "--timeout", "120"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    out = done.stdout
    assert "resourceclaim.resource.k8s.io/ci-job-2 created" in out
    assert "resourceclaim.resource.k8s.io/ci-job-2 condition met" in out
    assert "resourceclaim.resource.k8s.io/ci-job-2 annotated" in out
    assert "onprem-fra1.00-gpu.nvidia.com-onprem-h100-00000" in out  # the cluster's slices, by label
    assert '"name":"team-b"' in out
    assert "skipped: a block of 'Running for real" in out
