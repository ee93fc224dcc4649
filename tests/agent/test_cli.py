"""`python -m agent` with a configuration it cannot start with: one clean line on stderr (no traceback) and
exit status 2, whether a flag is missing, a file is missing, or there are no Kubernetes credentials."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICE = {"DRASERVICE_URL": "http://127.0.0.1:9", "DRASERVICE_CLUSTER": "c1", "DRASERVICE_TOKEN": "dra_x"}


def run_agent(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    # A clean environment: nothing from the developer's shell (KUBECONFIG, DRASERVICE_*), and a HOME without
    # ~/.kube/config. cwd=ROOT so that `-m agent` is this checkout's agent.
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "agent", *args], cwd=ROOT, env={**base, **env},
                          check=False, capture_output=True, text=True, timeout=60)


def one_clean_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    return lines[0]


def test_no_kubeconfig_anywhere(tmp_path):
    line = one_clean_line(run_agent(tmp_path, SERVICE))
    assert "no usable Kubernetes credentials" in line and "~/.kube/config" in line and "not in a pod" in line


def test_in_a_pod_without_a_service_account(tmp_path):
    line = one_clean_line(run_agent(tmp_path, {**SERVICE, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}))
    assert "the pod's service account" in line


@pytest.mark.parametrize("content", ["garbage: [\n", "just a string\n", ""])
def test_unusable_kubeconfig(tmp_path, content):
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    line = one_clean_line(run_agent(tmp_path, SERVICE, "--kubeconfig", str(path)))
    assert f"no usable Kubernetes credentials from {path}" in line


def test_kubeconfig_that_does_not_exist(tmp_path):
    line = one_clean_line(run_agent(tmp_path, {**SERVICE, "KUBECONFIG": str(tmp_path / "nope")}))
    assert line.endswith(f"kubeconfig {tmp_path / 'nope'}: no such file (--kubeconfig / KUBECONFIG)")


def test_missing_flags(tmp_path):
    line = one_clean_line(run_agent(tmp_path, {}))
    assert line.endswith("missing configuration: --service-url, --cluster, DRASERVICE_TOKEN or --token-file")


def test_missing_token_file(tmp_path):
    env = {k: v for k, v in SERVICE.items() if k != "DRASERVICE_TOKEN"}
    line = one_clean_line(run_agent(tmp_path, env, "--token-file", str(tmp_path / "token")))
    assert line.endswith(f"--token-file {tmp_path / 'token'}: no such file")


def test_bad_number_in_the_environment_is_a_usage_error(tmp_path):
    proc = run_agent(tmp_path, {**SERVICE, "DRASERVICE_RESYNC_PERIOD": "ten minutes"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "draservice-agent: error: argument --resync-period: invalid float value: 'ten minutes'")
