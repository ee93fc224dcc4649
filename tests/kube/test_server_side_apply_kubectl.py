"""The real kubectl 1.32's server-side apply against the live /k8s door: ``apply --server-side -f dir/`` twice
(claims, a template, a Deployment, a PodGroup, a Queue, a DeviceClass) keeps every resourceVersion and
managedFields, ``kubectl diff`` then finds nothing; a second manager's conflicting apply is refused with the
API server's words, ``--force-conflicts`` wins and moves the field; a claim's spec stays immutable.
Runs on the live-service harness of tests/kube/conftest.py (the ``kubectl`` fixture)."""
from __future__ import annotations

import json

import pytest

NS = "ssa"
CLAIM = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}
  namespace: ssa
  labels: {{team: ml}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        count: {count}
"""
MANIFESTS = {
    "claim-a.yaml": CLAIM.format(name="a", count=1),
    "claim-b.yaml": CLAIM.format(name="b", count=2),
    "template.yaml": """apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: ssa}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com}
""",
    "deployment.yaml": """apiVersion: apps/v1
kind: Deployment
metadata: {name: serve, namespace: ssa, labels: {app: serve}}
spec:
  replicas: 1
  selector: {matchLabels: {app: serve}}
  template:
    metadata: {labels: {app: serve}}
    spec:
      containers:
      - name: main
        image: server:1
        resources:
          limits: {nvidia.com/gpu: 1}
""",
    "podgroup.yaml": """apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {name: gang, namespace: ssa}
spec: {minMember: 2, scheduleTimeoutSeconds: 600}
""",
    "queue.yaml": """apiVersion: draservice.io/v1alpha1
kind: Queue
metadata: {name: ssa-queue, labels: {tier: gold}}
spec:
  namespaces: [ssa-elsewhere]
  weight: 2
""",
    "deviceclass.yaml": """apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: ssa.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.nvidia.com"'}
""",
}
OBJECTS = ["resourceclaim/a", "resourceclaim/b", "resourceclaimtemplate/one-gpu", "deployment/serve",
           "podgroup/gang", "queue/ssa-queue", "deviceclass/ssa.example.com"]


def state(kubectl) -> dict:
    """Every object's resourceVersion and managedFields."""
    out = {}
    for ref in OBJECTS:
        got = json.loads(kubectl("get", ref, "-n", NS, "-o", "json", "--show-managed-fields").stdout)
        out[ref] = (got["metadata"]["resourceVersion"], got["metadata"].get("managedFields"))
    return out


@pytest.fixture
def manifests(tmp_path):
    for name, text in MANIFESTS.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_apply_twice_changes_nothing_and_diff_finds_nothing(kubectl, manifests):
    first = kubectl("apply", "--server-side", "-f", str(manifests)).stdout.splitlines()
    assert sorted(first) == sorted(f"{line} serverside-applied" for line in (
        "resourceclaim.resource.k8s.io/a", "resourceclaim.resource.k8s.io/b",
        "resourceclaimtemplate.resource.k8s.io/one-gpu", "deployment.apps/serve",
        "podgroup.scheduling.x-k8s.io/gang", "queue.draservice.io/ssa-queue",
        "deviceclass.resource.k8s.io/ssa.example.com"))
    before = state(kubectl)
    for ref, (_, fields) in before.items():
        assert [(f["manager"], f["operation"]) for f in fields] == [("kubectl", "Apply")], ref
    claim_fields = before["resourceclaim/a"][1][0]
    assert claim_fields["apiVersion"] == "resource.k8s.io/v1" and claim_fields["fieldsType"] == "FieldsV1"
    assert claim_fields["fieldsV1"] == {"f:metadata": {"f:labels": {"f:team": {}}},
                                        "f:spec": {"f:devices": {"f:requests": {}}}}
    kubectl("apply", "--server-side", "-f", str(manifests))
    assert state(kubectl) == before
    diff = kubectl("diff", "-f", str(manifests), check=False)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert state(kubectl) == before


def test_a_second_managers_conflict_and_force(kubectl, manifests):
    queue = manifests / "queue.yaml"
    kubectl("apply", "--server-side", "-f", str(queue))
    other = MANIFESTS["queue.yaml"].replace("weight: 2", "weight: 3").replace("  namespaces: [ssa-elsewhere]\n", "")
    refused = kubectl("apply", "--server-side", "--field-manager=other", "-f", "-", stdin=other, check=False)
    assert refused.returncode == 1
    assert 'Apply failed with 1 conflict: conflict with "kubectl": .spec.weight' in refused.stderr
    assert kubectl("get", "queue", "ssa-queue", "-o", "jsonpath={.spec.weight}").stdout == "2"
    forced = kubectl("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", "-", stdin=other)
    assert forced.stdout.strip() == "queue.draservice.io/ssa-queue serverside-applied"
    got = json.loads(kubectl("get", "queue", "ssa-queue", "-o", "json", "--show-managed-fields").stdout)
    assert got["spec"]["weight"] == 3 and got["spec"]["namespaces"] == ["ssa-elsewhere"]
    owners = {f["manager"]: f["fieldsV1"] for f in got["metadata"]["managedFields"]}
    assert owners["other"]["f:spec"] == {"f:weight": {}}
    assert owners["kubectl"]["f:spec"] == {"f:namespaces": {'v:"ssa-elsewhere"': {}}}


def test_an_updaters_field_conflicts_by_its_version(kubectl, manifests):
    kubectl("apply", "--server-side", "-f", str(manifests / "claim-a.yaml"))
    kubectl("label", "--overwrite", "resourceclaim", "a", "-n", NS, "team=infra")
    refused = kubectl("apply", "--server-side", "-f", str(manifests / "claim-a.yaml"), check=False)
    assert refused.returncode == 1
    assert ('Apply failed with 1 conflict: conflict with "kubectl-label" using resource.k8s.io/v1: '
            ".metadata.labels.team") in refused.stderr


def test_an_applied_change_of_a_claims_spec_is_invalid(kubectl, manifests):
    kubectl("apply", "--server-side", "-f", str(manifests / "claim-b.yaml"))
    changed = CLAIM.format(name="b", count=3)
    refused = kubectl("apply", "--server-side", "-f", "-", stdin=changed, check=False)
    assert refused.returncode == 1 and "is invalid" in refused.stderr and "spec: field is immutable" in \
        refused.stderr, refused.stderr
    assert kubectl("get", "resourceclaim", "b", "-n", NS, "-o",
                   "jsonpath={.spec.devices.requests[0].exactly.count}").stdout == "2"
