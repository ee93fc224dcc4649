"""DeviceTaintRule at the door (resource.k8s.io/v1alpha3, the one version Kubernetes 1.35 serves): kubectl
applies one, a second apply changes nothing, the device it names is tainted for the allocator at once, and
deleting it lifts the taint."""
from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
import urllib.request

import yaml

RULE = """apiVersion: resource.k8s.io/v1alpha3
kind: DeviceTaintRule
metadata:
  name: drain-one
spec:
  deviceSelector: {{driver: {driver}, pool: {pool}, device: {device}}}
  taint: {{key: example.com/maintenance, value: drain, effect: NoSchedule}}
"""


def _tainted(kube_service) -> list[tuple[str, str, list]]:
    token = yaml.safe_load(kube_service.kubeconfig.read_text())["users"][0]["user"]["token"]
    root = kube_service.base.removesuffix("/k8s")
    request = urllib.request.Request(f"{root}/api/v1/devices?tainted=true&limit=500",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, context=ssl._create_unverified_context(), timeout=30) as answer:
        body = json.loads(answer.read())
    rows = body.get("results", body.get("items", []))
    return [(d["pool"], d["name"], [t for t in d["taints"] if t.get("source", {}).get("name") == "drain-one"])
            for d in rows]


def _watch(kube_service, sink: list) -> subprocess.Popen:
    proc = subprocess.Popen(["kubectl", "--kubeconfig", str(kube_service.kubeconfig), "get", "devicetaintrules",
                             "-w", "--output-watch-events", "-o", "jsonpath={.type} {.object.metadata.name}{\"\\n\"}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def read():
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.append(line.strip())
    threading.Thread(target=read, daemon=True).start()
    return proc


def _wait_for(events: list, wanted: str, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while wanted not in events and time.monotonic() < deadline:
        time.sleep(0.2)
    assert wanted in events, events


def test_a_device_taint_rule_applies_and_taints_the_device_it_names(kubectl, kube_service):
    first = json.loads(kubectl("get", "resourceslices", "-o", "json").stdout)["items"][0]["spec"]
    driver, pool, device = first["driver"], first["pool"]["name"], first["devices"][0]["name"]
    rule = RULE.format(driver=driver, pool=pool, device=device)
    assert kubectl("apply", "-f", "-", stdin=rule).stdout.strip() == \
        "devicetaintrule.resource.k8s.io/drain-one created"
    events: list[str] = []
    watcher = _watch(kube_service, events)
    stored = json.loads(kubectl("get", "devicetaintrule", "drain-one", "-o", "json").stdout)
    assert stored["apiVersion"] == "resource.k8s.io/v1alpha3" and stored["spec"]["taint"]["timeAdded"]
    assert kubectl("apply", "-f", "-", stdin=rule).stdout.strip() == \
        "devicetaintrule.resource.k8s.io/drain-one unchanged"
    again = json.loads(kubectl("get", "devicetaintrule", "drain-one", "-o", "json").stdout)
    assert again["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert again["spec"]["taint"]["timeAdded"] == stored["spec"]["taint"]["timeAdded"]
    kubectl("label", "devicetaintrule", "drain-one", "why=maintenance")
    labeled = json.loads(kubectl("get", "devicetaintrule", "drain-one", "-o", "json").stdout)
    assert labeled["spec"]["taint"]["timeAdded"] == stored["spec"]["taint"]["timeAdded"]
    by_rule = [(p, d, taints) for p, d, taints in _tainted(kube_service) if taints]
    source = {"kind": "DeviceTaintRule", "name": "drain-one", "scope": "fleet"}
    assert by_rule == [(pool, device, [{"key": "example.com/maintenance", "value": "drain", "effect": "NoSchedule",
                                        "timeAdded": stored["spec"]["taint"]["timeAdded"], "source": source}])]
    other = kubectl("apply", "-f", "-", stdin=rule.replace("v1alpha3", "v1"), check=False)
    assert other.returncode == 1 and 'no matches for kind "DeviceTaintRule" in version "resource.k8s.io/v1"' \
        in other.stderr
    team = kubectl("apply", "-f", "-", stdin=rule.replace("drain-one", "team-rule"), as_team=True, check=False)
    assert team.returncode == 1 and "Forbidden" in team.stderr
    try:
        _wait_for(events, "ADDED drain-one", 30)  # the watch is established (its first answer is the list)
        kubectl("delete", "devicetaintrule", "drain-one")
        assert not any(taints for _, _, taints in _tainted(kube_service))
        _wait_for(events, "DELETED drain-one")
    finally:
        watcher.terminate()
        _, errors = watcher.communicate(timeout=10)
    assert events[0] == "ADDED drain-one", errors
    assert events[-1] == "DELETED drain-one"


def test_a_removed_selector_field_is_refused_not_dropped(kubectl):
    rule = RULE.format(driver="gpu.nvidia.com", pool="p", device="d").replace(
        "{driver: gpu.nvidia.com", "{deviceClassName: gpu.nvidia.com, driver: gpu.nvidia.com")
    refused = kubectl("apply", "-f", "-", stdin=rule.replace("drain-one", "by-class"), check=False)
    assert refused.returncode == 1
    assert "spec.deviceSelector.deviceClassName: Forbidden: removed after v1alpha3" in refused.stderr
    assert kubectl("get", "devicetaintrule", "by-class", check=False).returncode == 1
