"""The real kubectl against the live service: a Deployment applied from YAML gets one allocated claim per
replica (``kubectl wait`` and ``rollout status`` watch it happen), ``kubectl scale`` (the /scale subresource)
releases claims, ``kubectl delete`` releases the rest.
Runs on the live-service harness of tests/kube/conftest.py (the ``kubectl`` fixture)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

if not (Path(__file__).parent / "conftest.py").exists():  # the harness lives on the main line
    pytest.skip("needs the live-service kubectl harness (tests/kube/conftest.py)", allow_module_level=True)

NS = "workloads-e2e"
MANIFEST = f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: train, namespace: {NS}}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: train}}}}
  template:
    metadata: {{labels: {{app: train}}}}
    spec:
      containers:
      - name: main
        image: trainer:1
        resources:
          limits: {{nvidia.com/gpu: 1}}
"""


def wait_ready(kubectl, want: str, seconds: float = 60) -> list[str]:
    deadline = time.monotonic() + seconds
    while True:
        rows = kubectl("get", "deployment", "train", "-n", NS, "--no-headers").stdout.split()
        if rows[1] == want or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def claims(kubectl) -> list[str]:
    return kubectl("get", "resourceclaims", "-n", NS, "-o", "name").stdout.split()


def test_kubectl_apply_scale_and_delete_a_deployment(kubectl):
    assert kubectl("apply", "-f", "-", stdin=MANIFEST).stdout.strip() == "deployment.apps/train created"
    kubectl("wait", "--for=condition=DevicesAllocated", "pod", "-l", "app=train", "-n", NS, "--timeout=60s")
    kubectl("rollout", "status", "deployment/train", "-n", NS, "--timeout=60s")
    assert wait_ready(kubectl, "3/3")[:2] == ["train", "3/3"]
    pods = kubectl("get", "pods", "-n", NS, "--no-headers").stdout.splitlines()
    assert len(pods) == 3 and all(p.split()[2] == "Allocated" for p in pods)
    assert len(claims(kubectl)) == 3 and all("-extended-resources-" in c for c in claims(kubectl))
    again = kubectl("apply", "-f", "-", stdin=MANIFEST.replace("replicas: 3", "replicas: 2")).stdout.strip()
    assert again == "deployment.apps/train configured" and len(claims(kubectl)) == 2
    assert kubectl("scale", "deployment/train", "-n", NS, "--replicas=1").stdout.strip() == \
        "deployment.apps/train scaled"
    assert len(claims(kubectl)) == 1 and wait_ready(kubectl, "1/1")[1] == "1/1"
    kubectl("delete", "deployment", "train", "-n", NS)
    assert claims(kubectl) == [] and kubectl("get", "pods", "-n", NS, "-o", "name").stdout.split() == []
