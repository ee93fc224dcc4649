"""The real kubectl 1.32 against the live service's /k8s door: apply (with its default server-side field
validation), get (Table, -o wide, -o yaml), wait, watch, describe, annotate to release, delete, and the fleet's
slices and classes. And the official Python client (ResourceV1Api, ResourceV1beta2Api)."""
from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
import yaml

NS = "kubectl-e2e"


def claim_yaml(name: str, api_version: str = "resource.k8s.io/v1", extra: str = "") -> str:
    if api_version.endswith("v1beta1"):
        request = "    - name: gpu\n      deviceClassName: gpu.nvidia.com\n"
    else:
        request = f"    - name: gpu\n      exactly:\n        deviceClassName: gpu.nvidia.com\n{extra}"
    return (f"apiVersion: {api_version}\nkind: ResourceClaim\nmetadata:\n  name: {name}\n  namespace: {NS}\n"
            f"spec:\n  devices:\n    requests:\n{request}")


def test_discovery_and_the_fleet_listing(kubectl):
    resources = kubectl("api-resources").stdout
    for line in ("resourceclaims", "resourceslices", "deviceclasses", "consumers"):
        assert line in resources
    slices = kubectl("get", "resourceslices").stdout.splitlines()
    assert slices[0].split()[:5] == ["NAME", "NODE", "DRIVER", "POOL", "DEVICES"]
    assert len(slices) > 1 and slices[1].split(".")[0].startswith(("aws-", "gcp-", "azure-", "onprem-", "demo"))
    classes = kubectl("get", "deviceclasses", "-o", "name").stdout.split()
    assert "deviceclass.resource.k8s.io/gpu.nvidia.com" in classes
    both = kubectl("get", "resourceslices,deviceclasses").stdout
    assert "resourceslice.resource.k8s.io/" in both and "deviceclass.resource.k8s.io/gpu.nvidia.com" in both
    one = yaml.safe_load(kubectl("get", "resourceslice", slices[1].split()[0], "-o", "yaml").stdout)
    assert one["metadata"]["labels"]["draservice.io/cluster"] == slices[1].split(".")[0]


def test_apply_get_wait_describe_release_delete(kubectl):
    out = kubectl("apply", "-f", "-", stdin=claim_yaml("one")).stdout
    assert out.strip() == "resourceclaim.resource.k8s.io/one created"
    kubectl("wait", "--for=jsonpath={.status.allocation}", "resourceclaim/one", "-n", NS, "--timeout=60s")
    again = kubectl("apply", "-f", "-", stdin=claim_yaml("one")).stdout
    assert again.strip() in ("resourceclaim.resource.k8s.io/one unchanged",
                             "resourceclaim.resource.k8s.io/one configured")
    wide = kubectl("get", "resourceclaims", "-n", NS, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[:6] == ["NAME", "STATE", "CLUSTER", "NODE", "DEVICES", "AGE"]
    row = wide[1].split()
    assert row[0] == "one" and row[1] == "Allocated" and row[2] != "<none>" and row[4] != "<none>"
    obj = yaml.safe_load(kubectl("get", "resourceclaim", "one", "-n", NS, "-o", "yaml").stdout)
    assert obj["apiVersion"] == "resource.k8s.io/v1" and obj["status"]["allocation"]["devices"]["results"]
    described = kubectl("describe", "resourceclaim", "one", "-n", NS).stdout
    assert "Allocated" in described and "Events:" in described and "allocated on" in described
    kubectl("annotate", "resourceclaim", "one", "-n", NS, "draservice.io/release=true")
    phase = kubectl("get", "resourceclaim", "one", "-n", NS, "-o", "jsonpath={.status.phase}").stdout
    assert phase == "Released"
    assert kubectl("delete", "resourceclaim", "one", "-n", NS).stdout.strip() == 'resourceclaim.resource.k8s.io ' \
                                                                                 '"one" deleted'
    gone = kubectl("get", "resourceclaim", "one", "-n", NS, check=False)
    assert gone.returncode != 0 and 'resourceclaims.resource.k8s.io "one" not found' in gone.stderr


def _watch_events(proc, sink: list) -> None:
    decoder, buffer = json.JSONDecoder(), ""
    for line in proc.stdout:
        buffer += line
        try:
            event, end = decoder.raw_decode(buffer.strip())
        except ValueError:
            continue
        sink.append(event)
        buffer = buffer.strip()[end:]


def _wait_for_event(events: list, name: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(e["object"]["metadata"]["name"] == name for e in events):
            return
        time.sleep(0.2)
    raise AssertionError(f"the watch never showed {name}: {events}")


def test_watch_sees_added_then_modified(kubectl, kube_service):
    kubectl("apply", "-f", "-", stdin=claim_yaml("sentinel"))
    watcher = subprocess.Popen(["kubectl", "--kubeconfig", str(kube_service.kubeconfig), "get", "resourceclaims",
                                "-n", NS, "-w", "--output-watch-events", "-o", "json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events: list = []
    reader = threading.Thread(target=_watch_events, args=(watcher, events), daemon=True)
    reader.start()
    try:
        _wait_for_event(events, "sentinel")  # listed: the watch from the list's resourceVersion is next
        time.sleep(1)
        kubectl("apply", "-f", "-", stdin=claim_yaml("watched"))
        kubectl("wait", "--for=jsonpath={.status.allocation}", "resourceclaim/watched", "-n", NS, "--timeout=60s")
        # Changes of one object that the watch reads in one poll of the change log arrive as one event with
        # the object as it is then (level-based, as an informer needs): the label comes after the ADDED was
        # delivered, so it must come as a MODIFIED of its own.
        _wait_for_event(events, "watched")
        kubectl("label", "resourceclaim", "watched", "-n", NS, "stage=seen")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                e["object"]["metadata"].get("labels", {}).get("stage") == "seen" for e in events):
            time.sleep(0.2)
    finally:
        watcher.terminate()
        watcher.wait(10)
    mine = [(e["type"], e["object"].get("status", {}).get("phase"), e["object"]["metadata"].get("labels"))
            for e in events if e["object"]["metadata"]["name"] == "watched"]
    assert mine[0][0] == "ADDED"
    assert ("MODIFIED", "Allocated", {"stage": "seen"}) in mine
    kubectl("delete", "resourceclaim", "watched", "sentinel", "-n", NS)


def test_strict_field_validation_and_older_versions(kubectl):
    typo = claim_yaml("typo", extra="        deviceClasName: oops\n")
    refused = kubectl("apply", "-f", "-", stdin=typo, check=False)
    assert refused.returncode != 0
    assert 'unknown field "spec.devices.requests[0].exactly.deviceClasName"' in refused.stderr
    kubectl("apply", "-f", "-", stdin=claim_yaml("old", "resource.k8s.io/v1beta1"))
    old = yaml.safe_load(kubectl("get", "resourceclaims.v1beta1.resource.k8s.io", "old", "-n", NS, "-o",
                                 "yaml").stdout)
    assert old["apiVersion"] == "resource.k8s.io/v1beta1"
    assert old["spec"]["devices"]["requests"][0]["deviceClassName"] == "gpu.nvidia.com"
    new = yaml.safe_load(kubectl("get", "resourceclaims.v1.resource.k8s.io", "old", "-n", NS, "-o", "yaml").stdout)
    assert new["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    kubectl("delete", "resourceclaim", "old", "-n", NS)


def test_a_namespace_token_sees_only_its_namespace(kubectl):
    kubectl("apply", "-f", "-", stdin=claim_yaml("theirs"))
    denied = kubectl("get", "resourceclaims", "-n", NS, as_team=True, check=False)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr
    assert "theirs" not in kubectl("get", "resourceclaims", "-A", as_team=True).stdout
    kubectl("delete", "resourceclaim", "theirs", "-n", NS)


def test_the_python_client_reads_writes_and_answers_in_the_version_asked(kube_service):
    kubernetes = pytest.importorskip("kubernetes")
    config = kubernetes.config.new_client_from_config(config_file=str(kube_service.kubeconfig))
    v1 = kubernetes.client.ResourceV1Api(config)
    body = yaml.safe_load(claim_yaml("from-python"))
    created = v1.create_namespaced_resource_claim(NS, body)
    assert created.metadata.name == "from-python" and created.spec.devices.requests[0].exactly.device_class_name
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        claim = v1.read_namespaced_resource_claim("from-python", NS)
        if claim.status and claim.status.allocation:
            break
        time.sleep(0.5)
    assert claim.status.allocation.devices.results[0].driver == "gpu.nvidia.com"
    listed = v1.list_namespaced_resource_claim(NS, label_selector="!nope")
    assert "from-python" in [c.metadata.name for c in listed.items] and listed.metadata.resource_version
    beta2 = kubernetes.client.ResourceV1beta2Api(config).read_namespaced_resource_claim("from-python", NS)
    assert beta2.api_version == "resource.k8s.io/v1beta2"
    patched = v1.patch_namespaced_resource_claim("from-python", NS, {"metadata": {"labels": {"team": "ml"}}})
    assert patched.metadata.labels == {"team": "ml"}
    with pytest.raises(kubernetes.client.ApiException) as missing:
        v1.read_namespaced_resource_claim("nope", NS)
    assert missing.value.status == 404 and json.loads(missing.value.body)["reason"] == "NotFound"
    v1.delete_namespaced_resource_claim("from-python", NS)


TEMPLATE = """apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: gpu-template
  namespace: kubectl-e2e
  labels: {tier: "%s"}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com}
"""


def test_apply_a_template_then_change_its_labels(kubectl):
    assert kubectl("apply", "-f", "-", stdin=TEMPLATE % "1").stdout.strip().endswith("created")
    assert kubectl("apply", "-f", "-", stdin=TEMPLATE % "2").stdout.strip().endswith("configured")
    labels = kubectl("get", "resourceclaimtemplate", "gpu-template", "-n", NS, "-o", "jsonpath={.metadata.labels}")
    assert json.loads(labels.stdout) == {"tier": "2"}
    kubectl("delete", "resourceclaimtemplate", "gpu-template", "-n", NS)
