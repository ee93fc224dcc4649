"""The real kubectl 1.32 against the live /k8s door, on what it must not get wrong: server-side dry runs (``diff``,
``apply --dry-run=server``, ``create --dry-run=server``, ``delete --dry-run=server``) keep nothing, every
table's row count and the change log's highest seq unchanged; label selectors on the fleet's objects; the
manifest doctor's rewrite printed as a warning; a create of what exists is refused."""
from __future__ import annotations

import psycopg
import pytest
import yaml

NS = "truth"


def claim_yaml(name: str, count: int = 1, labels: str = "") -> str:
    return (f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {name}\n  namespace: {NS}\n"
            f"{labels}spec:\n  devices:\n    requests:\n    - name: gpu\n      exactly:\n"
            f"        deviceClassName: gpu.nvidia.com\n        count: {count}\n")


def snapshot(kube_service) -> dict:
    """Row count of every table of the service's database, and the change log's highest seq."""
    with psycopg.connect(kube_service.env["DATABASE_URL"], autocommit=True) as conn:
        tables = [t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        counts = {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        counts["change log max seq"] = conn.execute("SELECT max(seq) FROM draservice_change").fetchone()[0]
    return counts


QUIET = ("claims_utilisationsnapshot", "claims_allocationround")  # written by the beat, whatever else happens


def kept(before: dict, after: dict) -> dict:
    """The differences, leaving out the tables the service's own background work writes (snapshots, logs)."""
    return {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
            if before.get(k) != after.get(k) and not k.startswith(QUIET)}


def test_server_side_dry_runs_keep_nothing(kubectl, kube_service):
    kubectl("apply", "-f", "-", stdin=claim_yaml("existing"))
    kubectl("wait", "--for=jsonpath={.status.allocation}", "resourceclaim/existing", "-n", NS, "--timeout=60s")
    before = snapshot(kube_service)
    created = kubectl("create", "--dry-run=server", "-o", "yaml", "-f", "-", stdin=claim_yaml("new-one"))
    obj = yaml.safe_load(created.stdout)
    assert obj["metadata"]["uid"] and obj["metadata"]["creationTimestamp"]
    assert obj["metadata"].get("resourceVersion", "") == "" and obj["status"]["queue"] == "default"
    assert "fits the quota of default" in created.stderr and "(dry run: nothing was stored)" in created.stderr
    applied = kubectl("apply", "--dry-run=server", "-f", "-", stdin=claim_yaml("new-two", 2))
    assert applied.stdout.strip() == "resourceclaim.resource.k8s.io/new-two created (server dry run)"
    changed = kubectl("apply", "--dry-run=server", "-f", "-", stdin=claim_yaml("existing", labels="  labels: "
                                                                                                   "{a: b}\n"))
    assert "configured (server dry run)" in changed.stdout
    diff = kubectl("diff", "-f", "-", stdin=claim_yaml("existing", labels="  labels: {a: b}\n") + "---\n"
                   + claim_yaml("new-three"), check=False)
    assert diff.returncode == 1, diff.stderr  # 1: differences found
    assert "+    a: b" in diff.stdout and "+  name: new-three" in diff.stdout
    deleted = kubectl("delete", "--dry-run=server", "resourceclaim", "existing", "-n", NS)
    assert deleted.stdout.strip() == 'resourceclaim.resource.k8s.io "existing" deleted (server dry run)'
    assert kept(before, snapshot(kube_service)) == {}
    names = kubectl("get", "resourceclaims", "-n", NS, "-o", "name").stdout.split()
    assert names == ["resourceclaim.resource.k8s.io/existing"]
    labels = kubectl("get", "resourceclaim", "existing", "-n", NS, "-o", "jsonpath={.metadata.labels}").stdout
    assert labels == ""


def test_label_selectors_on_slices_and_classes(kubectl):
    cluster = kubectl("get", "resourceslices", "-o", "name").stdout.split()[0].split("/")[1].split(".")[0]
    listed = kubectl("get", "resourceslices", "-l", f"draservice.io/cluster={cluster}", "-o", "name").stdout.split()
    assert listed and all(n.startswith(f"resourceslice.resource.k8s.io/{cluster}.") for n in listed)
    none = kubectl("get", "deviceclasses", "-l", "foo=bar")
    assert none.stdout == "" and "No resources found" in none.stderr
    fleet_wide = kubectl("get", "deviceclasses", "-l", "!draservice.io/cluster", "-o", "name").stdout.split()
    assert "deviceclass.resource.k8s.io/gpu.nvidia.com" in fleet_wide


@pytest.mark.parametrize("value", ["Some", "true"])
def test_another_dry_run_value_is_a_400(kube_service, value):
    import json
    import ssl
    import urllib.error
    import urllib.request

    config = yaml.safe_load(kube_service.kubeconfig.read_text())
    token = config["users"][0]["user"]["token"]
    request = urllib.request.Request(f"{kube_service.base}/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
                                     f"?dryRun={value}", data=json.dumps(yaml.safe_load(claim_yaml("x"))).encode(),
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=ssl._create_unverified_context(), timeout=30)
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["message"] == f'dryRun: Invalid value: "{value}": supported values: "All"'


def test_wait_on_a_condition_already_met_returns_at_once(kubectl):
    import time

    kubectl("apply", "-f", "-", stdin=claim_yaml("waited"))
    kubectl("wait", "--for=jsonpath={.status.allocation}", "resourceclaim/waited", "-n", NS, "--timeout=60s")
    started = time.monotonic()
    kubectl("wait", "--for=jsonpath={.status.phase}=Allocated", "resourceclaim/waited", "-n", NS, "--timeout=60s")
    assert time.monotonic() - started < 1.0  # the watch's headers come at once (they took 10 s)


def test_kubectl_prints_the_doctors_fix_for_an_old_shape_manifest(kubectl):
    old = ("apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: old-shape\n  namespace: truth\n"
           "spec:\n  devices:\n    requests:\n    - name: gpu\n      deviceClassName: gpu.nvidia.com\n      count: 2\n")
    refused = kubectl("apply", "-f", "-", stdin=old, check=False)
    assert refused.returncode == 1
    assert ("Warning: the manifest doctor would change spec.devices.requests[0]: deviceClassName, count sat "
            "directly on the request in v1beta1") in refused.stderr
    assert ("* spec.devices.requests[0]: the manifest doctor: rewritten for resource.k8s.io/v1 (1 change): "
            "spec.devices.requests[0]: deviceClassName, count sat directly on the request") in refused.stderr
    assert "(the v1 object is in details.rewrite; POST /api/v1/convert answers it too)" in refused.stderr


def test_applying_the_doctors_skeleton_over_a_fleet_class_is_said_out_loud(kubectl):
    classic = ("apiVersion: resource.k8s.io/v1alpha2\nkind: ResourceClass\nmetadata:\n  name: gpu.nvidia.com\n"
               "driverName: gpu.nvidia.com\n")
    refused = kubectl("create", "-f", "-", stdin=classic, check=False)
    assert refused.returncode == 1
    assert 'a DeviceClass "gpu.nvidia.com" already exists in the fleet: claims can name it as it is' in refused.stderr
    skeleton = ("apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: gpu.nvidia.com\nspec:\n"
                "  selectors:\n  - cel:\n      expression: device.driver == \"gpu.nvidia.com\"\n")
    before = kubectl("get", "deviceclass", "gpu.nvidia.com", "-o", "jsonpath={.spec.selectors}").stdout
    applied = kubectl("apply", "--dry-run=server", "-f", "-", stdin=skeleton)
    assert "configured (server dry run)" in applied.stdout
    assert 'Warning: deviceclass "gpu.nvidia.com": spec.selectors replaced (were [' in applied.stderr
    assert kubectl("get", "deviceclass", "gpu.nvidia.com", "-o", "jsonpath={.spec.selectors}").stdout == before
    exists = kubectl("create", "-f", "-", stdin=skeleton, check=False)
    assert exists.returncode == 1 and "AlreadyExists" in exists.stderr
